package doctest_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/doctest"
)

func TestParse(t *testing.T) {
	src := strings.Join([]string{
		"# Title",
		"",
		"```go",
		"x := 1",
		"```",
		"",
		"<!-- doctest: skip docker -->",
		"```sh",
		"docker compose up -d",
		"```",
		"",
		"<!-- doctest: expect-exit 75; env A=1 B=2; files deploy ./docs/x.md -->",
		"<!-- doctest: timeout 90s; setup echo a; echo b -->",
		"```bash",
		"# a comment before any command",
		"jetlock acquire x",
		"# out 1",
		"#",
		"jetlock release x \\",
		"  --flag",
		"echo   # a trailing comment",
		"# out 2",
		"```",
		"",
		"1. In a list:",
		"",
		"   ```console",
		"   $ echo a \\",
		"     b",
		"   a b",
		"   $ true",
		"",
		"   ```",
		"",
		"```",
		"plain",
		"```",
	}, "\n")
	got, err := doctest.Parse("x.md", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []doctest.Block{
		{File: "x.md", Line: 8, Lang: "sh", Skip: "docker",
			Steps: []doctest.Step{{Line: 9, Code: "docker compose up -d\n"}}},
		{File: "x.md", Line: 14, Lang: "bash", ExpectExit: 75, Env: []string{"A=1", "B=2"},
			Setup: []string{"echo a; echo b"}, Files: []string{"deploy", "docs/x.md"}, Timeout: 90 * time.Second,
			Steps: []doctest.Step{
				{Line: 15, Code: "# a comment before any command\njetlock acquire x\n", Expect: []string{"out 1", ""}},
				{Line: 19, Code: "jetlock release x \\\n  --flag\necho   # a trailing comment\n", Expect: []string{"out 2"}},
			}},
		{File: "x.md", Line: 27, Lang: "console", Steps: []doctest.Step{
			{Line: 28, Code: "echo a \\\n  b\n", Expect: []string{"a b"}},
			{Line: 31, Code: "true\n"},
		}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", got, want)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"unknown directive", "<!-- doctest: skipp x -->\n```sh\nls\n```\n", `x.md:1: doctest: unknown directive "skipp"`},
		{"skip without reason", "<!-- doctest: skip -->\n```sh\nls\n```\n", "skip needs a reason"},
		{"bad exit", "<!-- doctest: expect-exit x -->\n```sh\nls\n```\n", "want a status"},
		{"bad env", "<!-- doctest: env A -->\n```sh\nls\n```\n", "want NAME=VALUE"},
		{"bad timeout", "<!-- doctest: timeout -1s -->\n```sh\nls\n```\n", "positive duration"},
		{"empty setup", "<!-- doctest: setup -->\n```sh\nls\n```\n", "setup needs a command"},
		{"files outside the repository", "<!-- doctest: files ../x -->\n```sh\nls\n```\n", "want a path inside the repository"},
		{"files without a path", "<!-- doctest: files -->\n```sh\nls\n```\n", "files needs a path"},
		{"detached", "<!-- doctest: skip x -->\n\ntext\n```sh\nls\n```\n", "x.md:1: doctest directive not directly above"},
		{"at the end", "```sh\nls\n```\n<!-- doctest: skip x -->\n", "not directly above"},
		{"above go", "<!-- doctest: skip x -->\n```go\nx\n```\n", `above a "go" block`},
		{"unclosed", "text\n```sh\nls\n", "x.md:2: code block not closed"},
		{"console output first", "```console\nout\n$ ls\n```\n", "console output before the first $ command"},
		{"indented code", "Text:\n\n    kubectl apply -f x.yaml\n", "x.md:3: indented code block"},
		{"indented code after a list", "1. item\n   more\n\nText.\n\n    ls\n", "x.md:6: indented code block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := doctest.Parse("x.md", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Parse: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestParseListContinuation(t *testing.T) {
	src := "1. **Step.** Do this\n   and that:\n\n     more of step 1, indented\n\n2. Next.\n\n```sh\nls\n```\n"
	got, err := doctest.Parse("x.md", []byte(src))
	if err != nil || len(got) != 1 {
		t.Fatalf("Parse: %v, %d blocks; want the list's lines taken as text and one block", err, len(got))
	}
}

func TestCheck(t *testing.T) {
	out := strings.Join([]string{
		`08:20:46 Sending request on "jetlock.v1.acquire"`,
		`{"resource":"orders/1","lease_id":"d0c67a6e","token":1,"ttl_ms":30000,"expires_at":"2026-12-03T08:21:16.877Z"}`,
		`08:20:46 Nats-Service-Error-Code: 409`,
		`{"lease_id":"d0c67a6e","token":12}`,
	}, "\n")
	for _, tc := range []struct {
		name   string
		expect []string
		vars   doctest.Vars
		ok     bool
		want   doctest.Vars
	}{
		{"literal and ellipsis", []string{`{"resource":"orders/1",…,"token":1,…}`}, nil, true, doctest.Vars{}},
		{"capture", []string{`"lease_id":"<lease_id>","token":1,`}, nil, true, doctest.Vars{"lease_id": "d0c67a6e"}},
		{"bound", []string{`"lease_id":"<lease_id>"`}, doctest.Vars{"lease_id": "other"}, false, nil},
		{"same value twice", []string{`"lease_id":"<id>"`, `{"lease_id":"<id>","token":12}`}, nil, true, doctest.Vars{"id": "d0c67a6e"}},
		{"any time", []string{`"expires_at":"2026-11-29T21:20:32.846Z"`}, nil, true, doctest.Vars{}},
		{"in order", []string{`Nats-Service-Error-Code: 409`, `"token":12`}, nil, true, doctest.Vars{}},
		{"out of order", []string{`"token":12`, `Nats-Service-Error-Code: 409`}, nil, false, nil},
		{"one line each", []string{`Nats-Service-Error-Code: 409`, `Nats-Service-Error-Code: 409`}, nil, false, nil},
		{"changed", []string{`"token":2,`}, nil, false, nil},
		{"metacharacters are literal", []string{`{"lease_id":".*"}`}, nil, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars := doctest.Vars{}
			for k, v := range tc.vars {
				vars[k] = v
			}
			err := doctest.Check(out, tc.expect, vars)
			if (err == nil) != tc.ok {
				t.Fatalf("Check: %v, want ok=%v", err, tc.ok)
			}
			if tc.ok && !reflect.DeepEqual(vars, tc.want) {
				t.Errorf("vars %v, want %v", vars, tc.want)
			}
		})
	}
}

func TestSubstitute(t *testing.T) {
	got := doctest.Substitute(`nats req x '{"lease_id":"<lease_id>","o":"<other>"}' # …`, doctest.Vars{"lease_id": "abc"})
	if want := `nats req x '{"lease_id":"abc","o":"<other>"}' # …`; got != want {
		t.Errorf("Substitute: %s, want %s", got, want)
	}
}
