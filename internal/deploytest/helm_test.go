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
// chart write parses with nats-server's parser and says what
// deploy/README.md requires ("Durability"). There is no helm here, so the test composes the file the way
// the chart's templates do (files/config/*.yaml of nats-io/k8s at tag
// nats-<chartVersion>: each section's generated keys, then its merge;
// "<< x >>" unquoted; "…$include" keys as include directives), with the
// chart's paths under a temporary root, and runs the zone init container's
// script with a curl that answers the API server's node object (jq is the
// image's own).
func TestHelmValuesMakeAValidServerConfig(t *testing.T) {
	for _, cmd := range []string{"sh", "jq"} {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Skipf("no %s", cmd)
		}
	}
	setIdentities(t)
	var v map[string]any
	if err := yaml.Unmarshal([]byte(readDeploy(t, "k8s/nats-values.yaml")), &v); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	at := func(p string) string { return filepath.Join(root, p) }
	for _, d := range []string{"/etc/nats-config/jetlock", "/etc/nats-zone", "/etc/nats-certs/nats", "/etc/nats-certs/cluster", "/etc/nats-ca-cert", "/data", "/bin", serviceAccountDir} {
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

	// The zone init container, with curl answering node-1's object (zone
	// eu-1a) as the API server does, after checking the request.
	script := zoneScript(t, v)
	for f, text := range map[string]string{"token": "sa-token", "ca.crt": "sa-ca"} {
		if err := os.WriteFile(at(serviceAccountDir+"/"+f), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	curl := `#!/bin/sh
case "$*" in
*"--cacert ` + at(serviceAccountDir) + `/ca.crt"*"Authorization: Bearer sa-token"*"https://kubernetes.default.svc/api/v1/nodes/node-1"*) ;;
*) echo "curl: unexpected request: $*" >&2; exit 22 ;;
esac
echo '{"kind":"Node","metadata":{"name":"node-1","labels":{"kubernetes.io/hostname":"node-1","topology.kubernetes.io/zone":"eu-1a"}}}'
`
	if err := os.WriteFile(at("/bin/curl"), []byte(curl), 0o755); err != nil {
		t.Fatal(err)
	}
	runZone := func(nodeEnv string) ([]byte, error) {
		s := strings.ReplaceAll(script, "/etc/nats-zone", at("/etc/nats-zone"))
		s = strings.ReplaceAll(s, serviceAccountDir, at(serviceAccountDir))
		cmd := exec.Command("sh", "-ec", s)
		cmd.Env = append(os.Environ(), "PATH="+at("/bin")+":"+os.Getenv("PATH"), nodeEnv)
		return cmd.CombinedOutput()
	}
	if out, err := runZone("NODE_NAME=node-1"); err != nil {
		t.Fatalf("zone init container: %v\n%s", err, out)
	}
	// A request the API server refuses stops the pod, without a tag.
	if out, err := runZone("NODE_NAME=node-2"); err == nil {
		t.Fatalf("zone init container succeeded on a refused request: %s", out)
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

// chartVersion is the NATS chart nats-values.yaml is written for, and the
// version deploy/README.md installs: the composition above follows its
// templates (nats-io/k8s, tag nats-2.14.2: no_advertise from
// config.cluster.noAdvertise, default true; the config in
// /etc/nats-config/nats.conf; certificates in /etc/nats-certs/<section>;
// the headless service nats-headless).
const chartVersion = "2.14.2"

// natsBoxImage is the zone init container's image: the nats-box of
// chartVersion (its natsBox.container.image default), which has sh, curl
// and jq.
const natsBoxImage = "natsio/nats-box:0.19.7"

// serviceAccountDir is where Kubernetes mounts a pod's service account
// token and CA.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// zoneScript returns the zone init container's script, and checks its
// image: the chart's own nats-box, at a pinned tag.
func zoneScript(t *testing.T, v map[string]any) string {
	t.Helper()
	for _, p := range dig(v, "podTemplate", "patch").([]any) {
		if dig(p, "path") != "/spec/initContainers" {
			continue
		}
		if img := dig(p, "value", 0, "image"); img != natsBoxImage {
			t.Errorf("zone init container image %v, want %s (pinned: the chart's nats-box, with sh, curl and jq)", img, natsBoxImage)
		}
		if s, _ := dig(p, "value", 0, "command", 2).(string); s != "" {
			return s
		}
	}
	t.Fatal("no zone init container")
	return ""
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
