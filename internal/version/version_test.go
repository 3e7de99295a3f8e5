package version_test

import (
	"runtime/debug"
	"testing"

	"github.com/jetlock/jetlock/internal/version"
)

func TestFromBuildInfo(t *testing.T) {
	stamped := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/jetlock/jetlock", Version: "v0.0.0-20261204100000-0123456789ab+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "arm64"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-12-04T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	for _, tc := range []struct {
		name    string
		bi      *debug.BuildInfo
		release string
		want    string
	}{
		{"checkout build", stamped, "",
			"v0.0.0-20261204100000-0123456789ab+dirty (commit 0123456789ab, 2026-12-04T10:00:00Z, modified) go1.26.8 linux/arm64"},
		{"release build (-ldflags -X)", stamped, "v0.1.0",
			"v0.1.0 (commit 0123456789ab, 2026-12-04T10:00:00Z, modified) go1.26.8 linux/arm64"},
		{"go install module@version", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"},
			Settings: []debug.BuildSetting{{Key: "GOOS", Value: "darwin"}, {Key: "GOARCH", Value: "amd64"}}}, "",
			"v0.1.0 go1.26.8 darwin/amd64"},
		{"go run", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"}}}, "",
			"(devel) go1.26.8 linux/amd64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := version.FromBuildInfo(tc.bi, tc.release).String(); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// A binary without build information still names a version and the
// toolchain it runs on.
func TestWithoutBuildInfo(t *testing.T) {
	in := version.FromBuildInfo(nil, "")
	if in.Version != version.Devel || in.GoVersion == "" || in.Platform == "" || in.Revision != "" {
		t.Errorf("FromBuildInfo(nil) = %+v", in)
	}
}

func TestSemVer(t *testing.T) {
	for in, want := range map[string]string{
		"v0.1.0": "0.1.0",
		"v0.0.0-20261204100000-0123456789ab+dirty": "0.0.0-20261204100000-0123456789ab+dirty",
		version.Devel: "",
		"v1.2":        "",
	} {
		if got := (version.Info{Version: in}).SemVer(); got != want {
			t.Errorf("SemVer of %q = %q, want %q", in, got, want)
		}
	}
}
