package main

import (
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
)

// A store user without the store's rights is a misconfiguration no retry
// mends: lockd exits 2 at once, naming the right the server refused and
// the rights the store user needs, instead of retrying "lock bucket not
// ready" forever. The request user has no right on $JS at all; the
// inspector may read the bucket but not update it.
func TestStoreUserWithoutRightsExitsWithTheFix(t *testing.T) {
	env := testenv.Start(t)
	su, sp := env.Cluster.User(devcluster.Service)
	iu, ip := env.Cluster.User(devcluster.Inspector)
	for _, tc := range []struct {
		name   string
		store  []string
		denied string
	}{
		{"no JetStream rights", []string{"--store-user", su, "--store-password", sp}, "the store user may not"},
		{"read-only", []string{"--store-user", iu, "--store-password", ip, "--store-inbox-prefix", "_INBOX"}, "the store user may not publish to $JS.API.STREAM."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--server", env.Cluster.URLs(), "--user", su, "--password", sp}, tc.store...)
			code, exited, stderr := runFor(t, 60*time.Second, args...)
			if !exited || code != exitUsage {
				t.Fatalf("exit %d (exited by itself: %v), want %d; stderr:\n%s", code, exited, exitUsage, stderr)
			}
			for _, want := range []string{tc.denied, "needs publish on $JS.API.>, $KV.jetlock.>", "STORE_PERMISSIONS"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr does not say %q:\n%s", want, stderr)
				}
			}
			if strings.Contains(stderr, "lock bucket not ready") {
				t.Errorf("lockd retried the bucket before giving up:\n%s", stderr)
			}
		})
	}
}

// Credentials the server refuses stop lockd at once (exit 2) with the
// flags and variables to check, for either connection.
func TestRefusedCredentialsNameTheFlags(t *testing.T) {
	env := testenv.Start(t)
	su, sp := env.Cluster.User(devcluster.Service)
	tu, _ := env.Cluster.User(devcluster.Store)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"request", []string{"--user", su, "--password", "wrong", "--store-user", tu, "--store-password", "wrong"}, "--creds, --nkey or --user/--password (JETLOCK_CREDS"},
		{"store", []string{"--user", su, "--password", sp, "--store-user", tu, "--store-password", "wrong"}, "--store-creds, --store-nkey or --store-user/--store-password (JETLOCK_STORE_CREDS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, exited, stderr := runFor(t, 60*time.Second, append([]string{"--server", env.Cluster.URLs()}, tc.args...)...)
			if !exited || code != exitUsage {
				t.Fatalf("exit %d (exited by itself: %v), want %d; stderr:\n%s", code, exited, exitUsage, stderr)
			}
			for _, want := range []string{"(" + tc.name + " connection)", "the server refused the credentials", tc.want} {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr does not say %q:\n%s", want, stderr)
				}
			}
		})
	}
}

// A second lockd --dev on the ports of a running one says that the port is
// in use and exits 2 at once (it reported "node n1 not ready" after 30 s
// before).
func TestDevPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().(*net.TCPAddr).Port
	free := freePorts(t, 2)
	ports := strconv.Itoa(busy) + "," + strconv.Itoa(free[0]) + "," + strconv.Itoa(free[1])
	code, exited, stderr := runFor(t, 60*time.Second, "--dev", "--dev-dir", t.TempDir(), "--dev-ports", ports)
	if !exited || code != exitUsage {
		t.Fatalf("lockd --dev on a port in use: exit %d (exited by itself: %v), want %d; stderr:\n%s", code, exited, exitUsage, stderr)
	}
	for _, want := range []string{"port in use: 127.0.0.1:" + strconv.Itoa(busy), "another lockd --dev", "--dev-ports"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
}

// lockdVersionRE is the line lockd version prints.
var lockdVersionRE = regexp.MustCompile(`^lockd (v\d+\.\d+\.\d+\S*|\(devel\))( \(commit [0-9a-f]{12}[^)]*\))? go\S+ \w+/\w+\n$`)

// lockd version and --version print the build (module version or
// "(devel)", commit when stamped, Go version), and a release build's
// -ldflags -X sets the version.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, stdout, stderr := runBin(t, args...)
		if code != 0 || stderr != "" || !lockdVersionRE.MatchString(stdout) || !strings.Contains(stdout, " "+runtime.Version()+" ") {
			t.Errorf("lockd %v: exit %d, stdout %q, stderr %q; want one line like \"lockd v0.1.0 (commit 0123456789ab, …) %s linux/amd64\"", args, code, stdout, stderr, runtime.Version())
		}
	}
	bin := filepath.Join(t.TempDir(), "lockd")
	build := exec.Command("go", "build", "-o", bin, "-ldflags", "-X github.com/jetlock/jetlock/internal/version.version=v9.8.7", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags -X: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "lockd v9.8.7 ") {
		t.Errorf("lockd built with -X …version=v9.8.7: %q, %v; want \"lockd v9.8.7 …\"", out, err)
	}
}
