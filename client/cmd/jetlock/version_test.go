package main_test

import (
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// versionRE is the line jetlock version prints: the program, a version
// (a release, a pseudo-version or "(devel)"), maybe the commit, the Go
// toolchain and the platform.
var versionRE = regexp.MustCompile(`^jetlock (v\d+\.\d+\.\d+\S*|\(devel\))( \(commit [0-9a-f]{12}[^)]*\))? go\S+ \w+/\w+\n$`)

// jetlock version and --version print the build, need no connection and
// exit 0 (lockd's tests check that -ldflags sets a release version).
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		r := jl(t, args...)
		wantCode(t, r, 0)
		if !versionRE.MatchString(r.stdout) || r.stderr != "" {
			t.Errorf("jetlock %v printed stdout %q stderr %q; want one line like \"jetlock v0.1.0 (commit 0123456789ab, …) go1.26 linux/amd64\"", args, r.stdout, r.stderr)
		}
		if !strings.Contains(r.stdout, " "+runtime.Version()+" ") {
			t.Errorf("jetlock %v does not name the Go version %s: %q", args, runtime.Version(), r.stdout)
		}
	}
}
