// Package version reports which build of jetlock is running: the version
// of the module, the commit it was built from and the Go toolchain, read
// from the build information the Go linker embeds (runtime/debug). lockd
// and jetlock print it with their version command.
//
// A release build names its version explicitly, so that a binary built
// from a source archive (no module version, no VCS stamp) still says what
// it is:
//
//	go build -ldflags "-X github.com/jetlock/jetlock/internal/version.version=v0.1.0" ./service/cmd/lockd
//
// Without it, `go install github.com/jetlock/jetlock/service/cmd/lockd@v0.1.0`
// reports v0.1.0 (the module version), `go build` in a git checkout a
// pseudo-version with the commit (and "+dirty" for uncommitted changes),
// and `go run` "(devel)".
package version

import (
	"cmp"
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is the release version, set by the linker (-ldflags -X, see the
// package comment). Empty: the module version of the build information
// is used.
var version = ""

// Devel is the version of a build that has none: go run, or a build
// without module or VCS information.
const Devel = "(devel)"

// Info describes one build.
type Info struct {
	Version   string // v0.1.0, a pseudo-version, or Devel
	Revision  string // the VCS commit, empty when the build was not stamped
	Time      string // the commit's time (RFC 3339), empty when not stamped
	Modified  bool   // the working tree had uncommitted changes
	GoVersion string // the toolchain, e.g. go1.26.8
	Platform  string // GOOS/GOARCH
}

// Get returns the running binary's build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return FromBuildInfo(bi, version)
}

// FromBuildInfo returns the Info of bi (nil when the binary carries none),
// with release as its version when release is not empty.
func FromBuildInfo(bi *debug.BuildInfo, release string) Info {
	in := Info{Version: release, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi == nil {
		in.Version = cmp.Or(in.Version, Devel)
		return in
	}
	if bi.GoVersion != "" {
		in.GoVersion = bi.GoVersion
	}
	if in.Version == "" && bi.Main.Version != "" {
		in.Version = bi.Main.Version
	}
	in.Version = cmp.Or(in.Version, Devel)
	goos, goarch := runtime.GOOS, runtime.GOARCH
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.time":
			in.Time = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
	}
	in.Platform = goos + "/" + goarch
	return in
}

// String is the one line a version command prints after the program's
// name: "v0.1.0 (commit 0123456789ab, 2026-12-04T10:00:00Z, modified)
// go1.26.8 linux/amd64"; the parenthesis is left out when the build has
// no VCS stamp.
func (in Info) String() string {
	var sb strings.Builder
	sb.WriteString(in.Version)
	if in.Revision != "" {
		rev := in.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		fmt.Fprintf(&sb, " (commit %s", rev)
		if in.Time != "" {
			fmt.Fprintf(&sb, ", %s", in.Time)
		}
		if in.Modified {
			sb.WriteString(", modified")
		}
		sb.WriteString(")")
	}
	fmt.Fprintf(&sb, " %s %s", in.GoVersion, in.Platform)
	return sb.String()
}

// semVerRE is semantic versioning 2.0.0 without the leading "v", as the
// NATS micro framework requires of a service's version.
var semVerRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// SemVer returns the version without its leading "v" when it is a
// semantic version (v0.1.0 gives 0.1.0, a pseudo-version its own form),
// and "" otherwise (Devel): what lockd reports in `nats micro info`.
func (in Info) SemVer() string {
	if v := strings.TrimPrefix(in.Version, "v"); semVerRE.MatchString(v) {
		return v
	}
	return ""
}
