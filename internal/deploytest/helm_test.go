package deploytest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/jetlock/jetlock/internal/testca"
)

// The NATS configuration that deploy/k8s/nats-values.yaml makes the Helm
// chart write parses with nats-server's parser and says what DESIGN.md
// requires. There is no helm here, so the test composes the file the way
// the chart's templates do (files/config/*.yaml of nats-io/k8s: each
// section's generated keys, then its merge; "<< x >>" unquoted;
// "…$include" keys as include directives), with the chart's paths under a
// temporary root, and runs the zone init container's script with a
// kubectl that answers a zone.
func TestHelmValuesMakeAValidServerConfig(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	setIdentities(t)
	var v map[string]any
	if err := yaml.Unmarshal([]byte(readDeploy(t, "k8s/nats-values.yaml")), &v); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	at := func(p string) string { return filepath.Join(root, p) }
	for _, d := range []string{"/etc/nats-config/jetlock", "/etc/nats-zone", "/etc/nats-certs/nats", "/etc/nats-certs/cluster", "/etc/nats-ca-cert", "/data", "/bin"} {
		if err := os.MkdirAll(at(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The secrets and the ConfigMap, where the chart mounts them.
	ca, err := testca.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Server("nats", "*.nats-headless")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"/etc/nats-certs/nats", "/etc/nats-certs/cluster"} {
		copyFile(t, srv.CertFile, at(dir+"/tls.crt"))
		copyFile(t, srv.KeyFile, at(dir+"/tls.key"))
	}
	copyFile(t, ca.CertFile, at("/etc/nats-ca-cert/"+dig(v, "tlsCA", "key").(string)))
	copyFile(t, filepath.Join(deployDir(t), "nats", "accounts.conf"), at("/etc/nats-config/jetlock/accounts.conf"))

	// The zone init container, with kubectl answering zone eu-1a.
	var script string
	for _, p := range dig(v, "podTemplate", "patch").([]any) {
		if dig(p, "path") == "/spec/initContainers" {
			script = dig(p, "value", 0, "command", 2).(string)
		}
	}
	if script == "" {
		t.Fatal("no zone init container")
	}
	kubectl := "#!/bin/sh\necho eu-1a\n"
	if err := os.WriteFile(at("/bin/kubectl"), []byte(kubectl), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-ec", strings.ReplaceAll(script, "/etc/nats-zone", at("/etc/nats-zone")))
	cmd.Env = append(os.Environ(), "PATH="+at("/bin")+":"+os.Getenv("PATH"), "NODE_NAME=node-1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("zone init container: %v\n%s", err, out)
	}

	cfg := dig(v, "config").(map[string]any)
	tlsBlock := func(section string) map[string]any {
		dir := "/etc/nats-certs/" + section
		m := map[string]any{"cert_file": at(dir + "/tls.crt"), "key_file": at(dir + "/tls.key"),
			"ca_file": at("/etc/nats-ca-cert/" + dig(v, "tlsCA", "key").(string))}
		for k, x := range dig(cfg, section, "tls", "merge").(map[string]any) {
			m[k] = x
		}
		return m
	}
	var routes []any
	for i := range dig(cfg, "cluster", "replicas").(int) {
		routes = append(routes, fmt.Sprintf("tls://nats-%d.nats-headless:%d", i, dig(cfg, "cluster", "port")))
	}
	js := map[string]any{
		"store_dir":        at(dig(cfg, "jetstream", "fileStore", "dir").(string)),
		"max_file_store":   raw(dig(cfg, "jetstream", "fileStore", "maxSize")),
		"max_memory_store": raw(dig(cfg, "jetstream", "memoryStore", "maxSize")),
	}
	for k, x := range dig(cfg, "jetstream", "merge").(map[string]any) {
		js[k] = x
	}
	conf := map[string]any{
		"server_name": "nats-0",
		"port":        dig(cfg, "nats", "port"),
		"http_port":   dig(cfg, "monitor", "port"),
		"tls":         tlsBlock("nats"),
		"cluster": map[string]any{"name": "nats", "port": dig(cfg, "cluster", "port"), "no_advertise": true,
			"routes": routes, "tls": tlsBlock("cluster")},
		"jetstream": js,
	}
	var includes []string
	merge := dig(cfg, "merge").(map[string]any)
	keys := make([]string, 0, len(merge))
	for k := range merge {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if strings.HasSuffix(k, "$include") {
			includes = append(includes, "include "+merge[k].(string)+";")
		} else {
			conf[k] = merge[k]
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(conf); err != nil {
		t.Fatal(err)
	}
	text := strings.TrimSuffix(strings.TrimSpace(buf.String()), "}") + strings.Join(includes, "\n") + "\n}\n"
	text = unraw(text)
	file := at("/etc/nats-config/nats.conf")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	o := parse(t, file)
	if !slices.Equal([]string(o.Tags), []string{"az:eu-1a"}) || o.JetStreamUniqueTag != "az:" || !o.SyncAlways {
		t.Errorf("tags %v unique tag %q sync always %v", o.Tags, o.JetStreamUniqueTag, o.SyncAlways)
	}
	if o.JetStreamMaxMemory != 256<<20 || o.JetStreamMaxStore != 32<<30 {
		t.Errorf("JetStream limits %d %d", o.JetStreamMaxMemory, o.JetStreamMaxStore)
	}
	if !o.Cluster.TLSCheckKnownURLs || o.TLSConfig == nil || len(o.Routes) != 3 {
		t.Errorf("route host check %v, client TLS %v, routes %v", o.Cluster.TLSCheckKnownURLs, o.TLSConfig != nil, o.Routes)
	}
	if o.SystemAccount != "SYS" || len(o.Nkeys) != len(identities) {
		t.Errorf("system account %q, %d nkey users: accounts.conf not included?", o.SystemAccount, len(o.Nkeys))
	}
}

// raw marks a value the chart writes unquoted ("<< x >>").
func raw(x any) string { return fmt.Sprintf("<<%v>>", x) }

func unraw(text string) string {
	for {
		i := strings.Index(text, `"<<`)
		if i < 0 {
			return text
		}
		j := strings.Index(text[i:], `>>"`)
		text = text[:i] + text[i+3:i+j] + text[i+j+3:]
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
