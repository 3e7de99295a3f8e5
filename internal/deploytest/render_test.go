package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// The servers of deploy/nats, one per zone.
var servers = []struct{ name, zone string }{{"nats-a", "az:a"}, {"nats-b", "az:b"}, {"nats-c", "az:c"}}

// Identities are the environment variables accounts.conf takes its users'
// nkey public keys from (README.md, "Identities"), by role: named
// JETLOCK_<ROLE>_NKEY_PUBLIC, so that they do not clash with lockd's
// JETLOCK_NKEY and JETLOCK_STORE_NKEY (the paths of its seed files) in
// one environment file.
var identities = map[string]string{
	"JETLOCK_SERVICE_NKEY_PUBLIC":        "service",
	"JETLOCK_STORE_NKEY_PUBLIC":          "store",
	"JETLOCK_OPERATOR_NKEY_PUBLIC":       "operator",
	"JETLOCK_INSPECTOR_NKEY_PUBLIC":      "inspector",
	"JETLOCK_CALLER_ORDERS_NKEY_PUBLIC":  "orders",
	"JETLOCK_CALLER_BILLING_NKEY_PUBLIC": "billing",
	"JETLOCK_SYS_NKEY_PUBLIC":            "sys",
}

// Ports of deploy/: clients, routes, monitoring, lockd's metrics.
const (
	clientPort  = 4222
	routePort   = 6222
	monitorPort = 8222
	metricsPort = 9090
)

// Installed paths the configurations name (README.md, "Install").
const (
	tlsDir   = "/etc/nats/tls/"
	storeDir = "/var/lib/nats/jetstream"
)

// deployDir returns the repository's deploy directory.
func deployDir(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy")
}

// readDeploy returns a file of deploy/.
func readDeploy(t testing.TB, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// keys holds a generated nkey per role.
type keys map[string]nkeys.KeyPair

// setIdentities generates an nkey per identity and puts its public key in
// the environment, as README.md's jetlock.env does.
func setIdentities(t *testing.T) keys {
	t.Helper()
	ks := keys{}
	for env, role := range identities {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv(env, pub)
		ks[role] = kp
	}
	return ks
}

func (ks keys) public(t testing.TB, role string) string {
	t.Helper()
	pub, err := ks[role].PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// render copies deploy/nats into dir with each of subst's replacements made
// in every file (each must match at least once somewhere: a configuration
// changed so that the tests' rewriting no longer applies fails here). This
// is the only change the tests make to deploy/'s files: the installed
// paths, and for the live cluster the listen addresses and route hosts.
func render(t testing.TB, dir string, subst [][2]string) {
	t.Helper()
	src := filepath.Join(deployDir(t), "nats")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	used := make([]bool, len(subst))
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".conf") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		for i, r := range subst {
			if strings.Contains(s, r[0]) {
				used[i] = true
				s = strings.ReplaceAll(s, r[0], r[1])
			}
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, ok := range used {
		if !ok {
			t.Fatalf("render: %q appears in no file of deploy/nats", subst[i][0])
		}
	}
}

// confFiles lists the configuration files of deploy/nats.
func confFiles(t testing.TB) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(deployDir(t), "nats", "*.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range m {
		out = append(out, filepath.Base(f))
	}
	slices.Sort(out)
	return out
}

// envRefs returns the environment variables a configuration file refers
// to: the $NAME references that no key of the file defines.
func envRefs(text string) []string {
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*([A-Z][A-Z0-9_]*)\s*[:=]`).FindAllStringSubmatch(text, -1) {
		defined[m[1]] = true
	}
	var out []string
	for _, m := range regexp.MustCompile(`\$([A-Z][A-Z0-9_]*)`).FindAllStringSubmatch(stripComments(text), -1) {
		if !defined[m[1]] && !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	slices.Sort(out)
	return out
}

var quoted = regexp.MustCompile(`"[^"]*"`)

// stripComments drops comments and quoted strings (in which $ is no
// variable).
func stripComments(text string) string {
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		line = quoted.ReplaceAllString(line, `""`)
		b.WriteString(line + "\n")
	}
	return b.String()
}

// parse parses a rendered server configuration with nats-server's own
// parser, includes and environment variables resolved.
func parse(t testing.TB, file string) *server.Options {
	t.Helper()
	o, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return o
}
