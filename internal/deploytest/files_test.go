package deploytest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// flagArgs splits "--name=value" arguments into a map (a flag given
// without a value maps to "").
func flagArgs(t testing.TB, args []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			t.Fatalf("argument %q is not --flag=value", a)
		}
		name, value, _ := strings.Cut(a[2:], "=")
		out[name] = value
	}
	return out
}

// checkLockdArgs checks a lockd command line of deploy/: every flag is
// lockd's, both users are given, the servers are deploy/'s on the client
// port with TLS, and the metrics port is deploy/'s. It returns the flags.
func checkLockdArgs(t *testing.T, where string, args []string, hosts []string) map[string]string {
	t.Helper()
	known := lockdFlags(t)[""]
	flags := flagArgs(t, args)
	for f := range flags {
		if !known[f] {
			t.Errorf("%s: lockd has no flag --%s", where, f)
		}
	}
	for _, f := range []string{"server", "nkey", "store-nkey", "tlsca", "tlscert", "tlskey", "metrics"} {
		if flags[f] == "" {
			t.Errorf("%s: no --%s", where, f)
		}
	}
	if flags["nkey"] == flags["store-nkey"] {
		t.Errorf("%s: the request and store connections use the same nkey %q", where, flags["nkey"])
	}
	var got []string
	for _, u := range strings.Split(flags["server"], ",") {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatalf("%s: --server %q: %v", where, u, err)
		}
		if pu.Scheme != "tls" || pu.Port() != strconv.Itoa(clientPort) {
			t.Errorf("%s: server %q, want tls:// on port %d", where, u, clientPort)
		}
		got = append(got, pu.Hostname())
	}
	if !slices.Equal(got, hosts) {
		t.Errorf("%s: servers %v, want %v", where, got, hosts)
	}
	if !strings.HasSuffix(flags["metrics"], ":"+strconv.Itoa(metricsPort)) {
		t.Errorf("%s: --metrics %q, want port %d", where, flags["metrics"], metricsPort)
	}
	return flags
}

func serverNames() []string {
	var out []string
	for _, s := range servers {
		out = append(out, s.name)
	}
	return out
}

func TestComposeFile(t *testing.T) {
	var compose struct {
		Services map[string]struct {
			Command     []string `yaml:"command"`
			Volumes     []string `yaml:"volumes"`
			Ports       []string `yaml:"ports"`
			EnvFile     []string `yaml:"env_file"`
			Hostname    string   `yaml:"hostname"`
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal([]byte(readDeploy(t, "docker-compose.yml")), &compose); err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		svc, ok := compose.Services[s.name]
		if !ok {
			t.Fatalf("compose has no service %s", s.name)
		}
		if svc.Hostname != s.name {
			t.Errorf("%s: hostname %q (the routes and certificates name %s)", s.name, svc.Hostname, s.name)
		}
		if len(svc.Command) != 2 || svc.Command[0] != "-c" {
			t.Fatalf("%s: command %v", s.name, svc.Command)
		}
		mounts := map[string]string{}
		for _, v := range svc.Volumes {
			parts := strings.Split(v, ":")
			mounts[parts[1]] = parts[0]
		}
		confDir := filepath.Dir(svc.Command[1])
		if src := mounts[confDir]; filepath.Clean(src) != "nats" || filepath.Base(svc.Command[1]) != s.name+".conf" {
			t.Errorf("%s: runs %s from %q, want deploy/nats/%s.conf", s.name, svc.Command[1], src, s.name)
		}
		if src := mounts[strings.TrimSuffix(tlsDir, "/")]; src != "./tls/out/"+s.name {
			t.Errorf("%s: %s from %q, want make-ca.sh's ./tls/out/%s", s.name, tlsDir, src, s.name)
		}
		if !strings.HasPrefix(storeDir, "/var/lib/nats") || mounts["/var/lib/nats"] == "" {
			t.Errorf("%s: no volume for the store dir %s", s.name, storeDir)
		}
		if !slices.ContainsFunc(svc.Ports, func(p string) bool { return strings.HasSuffix(p, ":"+strconv.Itoa(clientPort)) }) {
			t.Errorf("%s: ports %v publish no client port %d", s.name, svc.Ports, clientPort)
		}
		if !slices.Equal(svc.EnvFile, []string{"jetlock.env"}) {
			t.Errorf("%s: env_file %v, want jetlock.env (the identities)", s.name, svc.EnvFile)
		}
		if !slices.ContainsFunc(svc.Healthcheck.Test, func(a string) bool { return strings.Contains(a, ":"+strconv.Itoa(monitorPort)+"/healthz") }) {
			t.Errorf("%s: health check %v not on the monitoring port", s.name, svc.Healthcheck.Test)
		}
	}
	lockd, ok := compose.Services["lockd"]
	if !ok {
		t.Fatal("compose has no service lockd")
	}
	flags := checkLockdArgs(t, "compose lockd", lockd.Command, serverNames())
	mounted := func(path string) bool {
		for _, v := range lockd.Volumes {
			parts := strings.Split(v, ":")
			if strings.HasPrefix(path, parts[1]+"/") {
				return true
			}
		}
		return false
	}
	for _, f := range []string{"tlsca", "tlscert", "tlskey", "nkey", "store-nkey"} {
		if !mounted(flags[f]) {
			t.Errorf("compose lockd: --%s=%s is in no volume", f, flags[f])
		}
	}
	if !slices.ContainsFunc(lockd.Healthcheck.Test, func(a string) bool { return strings.Contains(a, ":"+strconv.Itoa(metricsPort)+"/readyz") }) {
		t.Errorf("compose lockd: health check %v, want /readyz on the metrics port", lockd.Healthcheck.Test)
	}
}

// yamlDocs decodes every document of a multi-document YAML file.
func yamlDocs(t *testing.T, text string) []map[string]any {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(text))
	var out []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, doc)
	}
}

// dig follows keys (strings for maps, ints for lists) into v.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func TestKubernetesFiles(t *testing.T) {
	var values map[string]any
	if err := yaml.Unmarshal([]byte(readDeploy(t, "k8s/nats-values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		path []any
		val  any
	}{
		{[]any{"config", "cluster", "enabled"}, true},
		{[]any{"config", "cluster", "replicas"}, len(servers)},
		{[]any{"config", "cluster", "port"}, routePort},
		{[]any{"config", "cluster", "tls", "enabled"}, true},
		{[]any{"config", "cluster", "tls", "merge", "verify_cert_and_check_known_urls"}, true},
		{[]any{"config", "nats", "port"}, clientPort},
		{[]any{"config", "nats", "tls", "enabled"}, true},
		{[]any{"config", "nats", "tls", "merge", "verify"}, true},
		{[]any{"config", "monitor", "port"}, monitorPort},
		{[]any{"config", "jetstream", "enabled"}, true},
		{[]any{"config", "jetstream", "merge", "sync_interval"}, "always"},
		{[]any{"config", "jetstream", "merge", "unique_tag"}, "az:"},
		{[]any{"tlsCA", "enabled"}, true},
		{[]any{"podDisruptionBudget", "enabled"}, true},
	}
	for _, w := range want {
		if got := dig(values, w.path...); got != w.val {
			t.Errorf("nats-values.yaml %v = %v, want %v", w.path, got, w.val)
		}
	}
	if dig(values, "podTemplate", "topologySpreadConstraints", "topology.kubernetes.io/zone", "maxSkew") != 1 {
		t.Error("nats-values.yaml does not spread the servers over zones")
	}
	// The identities of accounts.conf, every one and nothing else.
	env, _ := dig(values, "container", "env").(map[string]any)
	var names []string
	for k := range env {
		names = append(names, k)
	}
	slices.Sort(names)
	if want := sortedIdentities(); !slices.Equal(names, want) {
		t.Errorf("nats-values.yaml container.env %v, want the identities %v", names, want)
	}
	// accounts.conf is included from the mount of ConfigMap jetlock-accounts.
	inc, _ := dig(values, "config", "merge", "accounts$include").(string)
	mountedAt := ""
	for _, p := range dig(values, "container", "patch").([]any) {
		if dig(p, "value", "name") == "jetlock-accounts" {
			mountedAt, _ = dig(p, "value", "mountPath").(string)
		}
	}
	if filepath.Join("/etc/nats-config", inc) != filepath.Join(mountedAt, "accounts.conf") {
		t.Errorf("accounts.conf included as %q but mounted at %q", inc, mountedAt)
	}

	docs := yamlDocs(t, readDeploy(t, "k8s/lockd.yaml"))
	kinds := map[string]map[string]any{}
	for _, d := range docs {
		kinds[d["kind"].(string)] = d
	}
	dep, pdb := kinds["Deployment"], kinds["PodDisruptionBudget"]
	if dep == nil || pdb == nil || kinds["Service"] == nil {
		t.Fatalf("lockd.yaml kinds %v, want Deployment, PodDisruptionBudget, Service", kinds)
	}
	c := dig(dep, "spec", "template", "spec", "containers", 0)
	var args []string
	for _, a := range dig(c, "args").([]any) {
		args = append(args, a.(string))
	}
	var hosts []string
	for i := range servers {
		hosts = append(hosts, "nats-"+strconv.Itoa(i)+".nats-headless")
	}
	checkLockdArgs(t, "lockd.yaml", args, hosts)
	if dig(c, "ports", 0, "containerPort") != metricsPort || dig(c, "ports", 0, "name") != "metrics" {
		t.Errorf("lockd.yaml container port %v, want metrics %d", dig(c, "ports"), metricsPort)
	}
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if dig(c, probe, "httpGet", "path") != path || dig(c, probe, "httpGet", "port") != "metrics" {
			t.Errorf("lockd.yaml %s %v, want %s on the metrics port", probe, dig(c, probe), path)
		}
	}
	labels := dig(dep, "spec", "template", "metadata", "labels")
	if !reflectEqual(dig(pdb, "spec", "selector", "matchLabels"), labels) || !reflectEqual(dig(dep, "spec", "selector", "matchLabels"), labels) {
		t.Errorf("the PodDisruptionBudget or Deployment selector does not match the pods' labels %v", labels)
	}
	if n, _ := dig(dep, "spec", "replicas").(int); n < 2 || dig(pdb, "spec", "minAvailable") != 1 {
		t.Errorf("lockd.yaml replicas %v, PDB minAvailable %v: want >= 2 and 1", dig(dep, "spec", "replicas"), dig(pdb, "spec", "minAvailable"))
	}
}

func reflectEqual(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return a != nil && bytes.Equal(ja, jb)
}

func sortedIdentities() []string {
	var out []string
	for k := range identities {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// systemdUnit returns the settings of deploy/systemd/name, by key.
func systemdUnit(t testing.TB, name string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	text := strings.ReplaceAll(readDeploy(t, "systemd/"+name), "\\\n", " ")
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q", name, line)
		}
		out[k] = append(out[k], v)
	}
	return out
}

func TestSystemdUnits(t *testing.T) {
	unit := func(name string) map[string][]string { return systemdUnit(t, name) }
	nats := unit("nats-server.service")
	if !slices.Equal(nats["EnvironmentFile"], []string{"/etc/nats/jetlock.env"}) {
		t.Errorf("nats-server.service EnvironmentFile %v", nats["EnvironmentFile"])
	}
	if !slices.Contains(nats["ReadWritePaths"], "/var/lib/nats") || !strings.HasPrefix(storeDir, "/var/lib/nats/") {
		t.Errorf("nats-server.service may not write the store dir %s", storeDir)
	}
	// lockd.service takes its connection from the same environment file
	// as the servers: its command line is what it names plus the flags.
	lockd := unit("lockd.service")
	if !slices.Equal(lockd["EnvironmentFile"], []string{"/etc/lockd/jetlock.env"}) {
		t.Errorf("lockd.service EnvironmentFile %v", lockd["EnvironmentFile"])
	}
	example := envFile(t, readDeploy(t, "systemd/jetlock.env.example"))
	toFlag := lockdEnv(t)
	var args []string
	for k, v := range example {
		if f, ok := toFlag[k]; ok {
			args = append(args, "--"+f+"="+v)
		}
	}
	slices.Sort(args)
	args = append(args, strings.Fields(lockd["ExecStart"][0])[1:]...)
	checkLockdArgs(t, "lockd.service with jetlock.env.example", args, serverNames())

	// The example environment file names every identity and lockd's
	// connection, nothing else, and no name serves both.
	for k := range example {
		if _, ok := identities[k]; !ok && toFlag[k] == "" {
			t.Errorf("jetlock.env.example names %s, which neither accounts.conf nor lockd reads", k)
		}
	}
	for k := range identities {
		if _, ok := example[k]; !ok {
			t.Errorf("jetlock.env.example does not name the identity %s", k)
		}
		if toFlag[k] != "" {
			t.Errorf("%s is both a public key of accounts.conf and lockd's --%s", k, toFlag[k])
		}
	}
}

// envFile parses an environment file of KEY=VALUE lines (# comments).
func envFile(t testing.TB, text string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("environment file line %q", line)
		}
		out[k] = v
	}
	return out
}

// README.md names lockd's commands and flags as lockd has them, and every
// identity of accounts.conf.
func TestReadme(t *testing.T) {
	all := lockdFlags(t)
	text := readDeploy(t, "README.md")
	for _, m := range regexp.MustCompile("`lockd ([a-z]+)?[^`]*`").FindAllStringSubmatch(text, -1) {
		cmd := m[1]
		if cmd != "" && all[cmd] == nil {
			if cmd == "check" {
				t.Logf("lockd has no check command yet: %q not checked", m[0])
				continue
			}
			t.Errorf("README.md: %q: lockd has no command %s", m[0], cmd)
		}
	}
	for env := range identities {
		if !strings.Contains(text, env) && !strings.Contains(text, strings.TrimSuffix(env, "_NKEY_PUBLIC")) {
			t.Errorf("README.md does not name the identity %s", env)
		}
	}
	for _, m := range regexp.MustCompile("`--([a-z-]+)`").FindAllStringSubmatch(text, -1) {
		found := false
		for _, flags := range all {
			found = found || flags[m[1]] || strings.HasSuffix(m[1], "-") // --tls-* style
		}
		if !found && m[1] != "json" {
			t.Errorf("README.md names --%s, which lockd does not have", m[1])
		}
	}
}

// make-ca.sh (with openssl) makes what the configurations expect: each
// server's directory parses with its nats-X.conf, its certificate names
// the server for clients and routes, and client certificates are for
// clients only.
func TestMakeCA(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl")
	}
	out := t.TempDir()
	cmd := exec.Command("sh", filepath.Join(deployDir(t), "tls", "make-ca.sh"), out)
	cmd.Env = append(os.Environ(), "CLIENTS=lockd orders", "DAYS=2")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make-ca.sh: %v\n%s", err, b)
	}
	// Every key is the runner's alone (0600); lockd's image reads its own
	// through compose's lockd-secrets (TestComposeSecretsOwnership).
	keys, err := filepath.Glob(filepath.Join(out, "*", "*-key.pem"))
	if err != nil || len(keys) != len(servers)+2 {
		t.Fatalf("keys %v %v, want one per server and client", keys, err)
	}
	for _, k := range append(keys, filepath.Join(out, "ca-key.pem")) {
		checkOwner(t, k, 0o600)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(mustRead(t, filepath.Join(out, "ca.pem")))
	verify := func(path string, usage x509.ExtKeyUsage, host string) *x509.Certificate {
		t.Helper()
		blk, _ := pem.Decode(mustRead(t, path))
		if blk == nil {
			t.Fatalf("%s: no PEM", path)
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("%s for %s (%v): %v", path, host, usage, err)
		}
		return cert
	}
	setIdentities(t)
	for _, s := range servers {
		d := filepath.Join(out, s.name)
		verify(filepath.Join(d, "server.pem"), x509.ExtKeyUsageServerAuth, s.name)
		verify(filepath.Join(d, "server.pem"), x509.ExtKeyUsageClientAuth, s.name) // routes
		if _, err := tls.LoadX509KeyPair(filepath.Join(d, "server.pem"), filepath.Join(d, "server-key.pem")); err != nil {
			t.Error(err)
		}
		r := filepath.Join(out, "render-"+s.name)
		render(t, r, [][2]string{{tlsDir, d + "/"}, {storeDir, filepath.Join(r, "data")}})
		parse(t, filepath.Join(r, s.name+".conf"))
	}
	for _, c := range []string{"lockd", "orders"} {
		cert := verify(filepath.Join(out, "clients", c+".pem"), x509.ExtKeyUsageClientAuth, "")
		if len(cert.DNSNames) != 0 || len(cert.IPAddresses) != 0 {
			t.Errorf("client certificate %s names hosts %v %v: it could pass the route host check", c, cert.DNSNames, cert.IPAddresses)
		}
		if slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth) {
			t.Errorf("client certificate %s is also a server certificate", c)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
