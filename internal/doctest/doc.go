// Package doctest reads the shell examples of jetlock's documentation, so
// that a test can run them against a real lockd --dev and check what they
// print (docs_test.go; docs/testing.md describes it for writers).
//
// Every fenced code block of language sh, bash, shell or console is an
// example. The markdown marks what the test needs to know with an HTML
// comment on the lines just above the block, invisible when rendered:
//
//	<!-- doctest: skip docker -->          not run (the reason is required)
//	<!-- doctest: expect-exit 75 -->       the block ends with status 75
//	<!-- doctest: env NATS_USER=operator -->
//	<!-- doctest: setup printf 'echo ok\n' > backup.sh -->
//	<!-- doctest: files deploy -->          copied from the repository first
//	<!-- doctest: timeout 90s -->          longer than the default 30 s
//
// Several directives may share one comment, separated by ";". An unknown
// directive is an error, so that a typo does not silently change a test;
// so is an indented code block, which names no language.
//
// In an sh, bash or shell block, whole-line comments that start in the
// first column and follow a command are that command's expected output,
// one output line each:
//
//	nats req jetlock.v1.acquire '{"resource":"orders/1","request_id":"r1"}'
//	# {"resource":"orders/1","lease_id":"<lease_id>","token":1,…}
//	nats req jetlock.v1.release '{"resource":"orders/1","lease_id":"<lease_id>"}'
//
// In a console block, lines starting with "$ " are commands and the other
// lines their expected output. Comments before the first command are plain
// comments. See Pattern for how an expected line matches.
package doctest
