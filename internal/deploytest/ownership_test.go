package deploytest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/nats-io/nkeys"
	"gopkg.in/yaml.v3"
)

// checkOwner fails unless path has mode perm and belongs to the user
// running the test.
func checkOwner(t *testing.T, path string, perm os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != perm {
		t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), perm)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		t.Errorf("%s: owner %d, want the runner %d", path, sys.Uid, os.Getuid())
	}
}

// buildNK builds nk, which make-nkeys.sh runs, from the module's nkeys.
func buildNK(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nk")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nkeys/nk")
	cmd.Dir = filepath.Join(deployDir(t), "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build nk: %v\n%s", err, out)
	}
	return bin
}

// makeNkeys runs deploy/make-nkeys.sh OUT with nk and returns the keys it
// made, by role.
func makeNkeys(t *testing.T, nk, out string) keys {
	t.Helper()
	cmd := exec.Command("sh", filepath.Join(deployDir(t), "make-nkeys.sh"), out)
	cmd.Env = append(os.Environ(), "NK="+nk)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make-nkeys.sh: %v\n%s", err, b)
	}
	ks := keys{}
	for _, role := range identities {
		kp, err := nkeys.FromSeed(mustRead(t, filepath.Join(out, "secrets", role+".nk")))
		if err != nil {
			t.Fatalf("%s.nk: %v", role, err)
		}
		ks[role] = kp
	}
	return ks
}

// make-nkeys.sh writes one seed per role, the runner's alone, and
// jetlock.env with exactly accounts.conf's public keys, each the seed's;
// run again, it keeps the seeds.
func TestMakeNkeys(t *testing.T) {
	nk := buildNK(t)
	out := t.TempDir()
	ks := makeNkeys(t, nk, out)
	env := envFile(t, string(mustRead(t, filepath.Join(out, "jetlock.env"))))
	var names []string
	for k, v := range env {
		names = append(names, k)
		if role, ok := identities[k]; ok && v != ks.public(t, role) {
			t.Errorf("%s=%s is not the public key of secrets/%s.nk", k, v, role)
		}
	}
	slices.Sort(names)
	if want := sortedIdentities(); !slices.Equal(names, want) {
		t.Errorf("jetlock.env names %v, want %v", names, want)
	}
	for _, role := range identities {
		checkOwner(t, filepath.Join(out, "secrets", role+".nk"), 0o600)
	}
	again := makeNkeys(t, nk, out)
	for role := range ks {
		if again.public(t, role) != ks.public(t, role) {
			t.Errorf("make-nkeys.sh run again replaced %s's seed", role)
		}
	}
}

// compose is the part of docker-compose.yml these tests read.
type compose struct {
	Services map[string]struct {
		Image     string         `yaml:"image"`
		User      string         `yaml:"user"`
		Command   []string       `yaml:"command"`
		Volumes   []string       `yaml:"volumes"`
		DependsOn map[string]any `yaml:"depends_on"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

// dockerfile returns the runtime stage's base image and user of lockd's
// image.
func dockerfile(t *testing.T) (base string, uid int, copies [][]string) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(readDeploy(t, "docker/lockd.Dockerfile")))
	uid = -1
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch f[0] {
		case "FROM":
			base = f[1]
		case "USER":
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("lockd.Dockerfile: USER %s, want a numeric uid", f[1])
			}
			uid = n
		case "COPY":
			copies = append(copies, f[1:])
		}
	}
	if uid < 0 || base == "" {
		t.Fatal("lockd.Dockerfile: no runtime FROM or USER")
	}
	return base, uid, copies
}

// Compose's lockd-secrets step gives lockd's image user its files: run on
// what make-ca.sh and make-nkeys.sh write (0600, the runner's, unreadable
// by the image's uid), its script leaves every file lockd's flags name in
// the volume lockd mounts, owned by the image's uid, mode 0400, readable
// by that uid. The ownership part needs root (as the step does).
func TestComposeSecretsOwnership(t *testing.T) {
	var c compose
	if err := yaml.Unmarshal([]byte(readDeploy(t, "docker-compose.yml")), &c); err != nil {
		t.Fatal(err)
	}
	base, uid, _ := dockerfile(t)
	init, lockd := c.Services["lockd-secrets"], c.Services["lockd"]
	if init.Image != base {
		t.Errorf("lockd-secrets image %q, want lockd's base %q (nothing more to pull)", init.Image, base)
	}
	if init.User != "0:0" {
		t.Errorf("lockd-secrets user %q, want 0:0 (it reads the runner's 0600 files and chowns)", init.User)
	}
	if _, ok := c.Volumes["lockd-secrets"]; !ok {
		t.Error("no volume lockd-secrets")
	}
	if dep, _ := lockd.DependsOn["lockd-secrets"].(map[string]any); dep["condition"] != "service_completed_successfully" {
		t.Errorf("lockd depends on lockd-secrets %v, want service_completed_successfully", lockd.DependsOn["lockd-secrets"])
	}
	mounts := func(vols []string) map[string][2]string { // container path -> host source, options
		out := map[string][2]string{}
		for _, v := range vols {
			p := strings.Split(v, ":")
			opt := ""
			if len(p) > 2 {
				opt = p[2]
			}
			out[p[1]] = [2]string{p[0], opt}
		}
		return out
	}
	im, lm := mounts(init.Volumes), mounts(lockd.Volumes)
	if lm["/etc/lockd"] != [2]string{"lockd-secrets", "ro"} || len(lm) != 1 {
		t.Errorf("lockd mounts %v, want only the volume lockd-secrets at /etc/lockd, read-only", lm)
	}
	if im["/out"][0] != "lockd-secrets" || im["/in/tls"] != [2]string{"./tls/out/clients", "ro"} || im["/in/nkeys"] != [2]string{"./secrets", "ro"} {
		t.Errorf("lockd-secrets mounts %v", im)
	}
	if len(init.Command) != 3 || init.Command[0] != "sh" {
		t.Fatalf("lockd-secrets command %v, want sh -ec SCRIPT", init.Command)
	}
	script := init.Command[2]
	if !strings.Contains(script, "-o "+strconv.Itoa(uid)+" -g "+strconv.Itoa(uid)) {
		t.Errorf("lockd-secrets does not give the files to the image's uid %d:\n%s", uid, script)
	}

	if os.Getuid() != 0 {
		t.Skip("the copy chowns to the image's uid: run as root to check it")
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl for make-ca.sh")
	}
	root := t.TempDir()
	// The image's uid must reach root/out, as it reaches /etc/lockd.
	for _, d := range []string{root, filepath.Dir(root)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	host := filepath.Join(root, "deploy")
	ca := exec.Command("sh", filepath.Join(deployDir(t), "tls", "make-ca.sh"), filepath.Join(host, "tls", "out"))
	ca.Env = append(os.Environ(), "CLIENTS=lockd", "DAYS=2")
	if b, err := ca.CombinedOutput(); err != nil {
		t.Fatalf("make-ca.sh: %v\n%s", err, b)
	}
	makeNkeys(t, buildNK(t), host)
	out := filepath.Join(root, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	// The bind mounts, as paths on this machine.
	s := strings.NewReplacer("/in/tls", filepath.Join(host, im["/in/tls"][0]), "/in/nkeys", filepath.Join(host, im["/in/nkeys"][0]), "/out", out).Replace(script)
	cat := func(path string) error {
		cmd := exec.Command("cat", path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		return cmd.Run()
	}
	if err := cat(filepath.Join(host, "secrets", "store.nk")); err == nil {
		t.Fatal("uid", uid, "reads make-nkeys.sh's seed as it is: the test shows nothing")
	}
	for range 2 { // at every start of the stack
		if b, err := exec.Command("sh", "-ec", s).CombinedOutput(); err != nil {
			t.Fatalf("lockd-secrets: %v\n%s", err, b)
		}
	}
	flags := flagArgs(t, lockd.Command)
	for _, f := range []string{"tlsca", "tlscert", "tlskey", "nkey", "store-nkey"} {
		rel, ok := strings.CutPrefix(flags[f], "/etc/lockd/")
		if !ok {
			t.Errorf("--%s=%s is not in /etc/lockd", f, flags[f])
			continue
		}
		p := filepath.Join(out, rel)
		st, err := os.Stat(p)
		if err != nil {
			t.Errorf("--%s: lockd-secrets made no %s: %v", f, rel, err)
			continue
		}
		if sys := st.Sys().(*syscall.Stat_t); int(sys.Uid) != uid || st.Mode().Perm() != 0o400 {
			t.Errorf("--%s: %s owner %d mode %v, want %d and 0400", f, rel, sys.Uid, st.Mode().Perm(), uid)
		}
		if err := cat(p); err != nil {
			t.Errorf("--%s: uid %d cannot read %s: %v", f, uid, rel, err)
		}
	}
}

// dockerignore is a .dockerignore, matched as docker does: every pattern
// relative to the context root, "*" and "?" within a path element, "**"
// across elements, and a path excluded when it or a directory above it
// matches.
type dockerignore []*regexp.Regexp

func parseDockerignore(t *testing.T, text string) dockerignore {
	t.Helper()
	var out dockerignore
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") {
			t.Fatalf(".dockerignore: exception %q: this matcher does not handle them", line)
		}
		p := filepath.ToSlash(filepath.Clean(strings.TrimPrefix(line, "/")))
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(p); i++ {
			switch {
			case strings.HasPrefix(p[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(p[i:], "**"):
				re.WriteString(".*")
				i++
			case p[i] == '*':
				re.WriteString("[^/]*")
			case p[i] == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(p[i : i+1]))
			}
		}
		re.WriteString("$")
		out = append(out, regexp.MustCompile(re.String()))
	}
	return out
}

func (d dockerignore) excluded(path string) bool {
	for p := path; p != "." && p != "/" && p != ""; p = filepath.Dir(p) {
		for _, re := range d {
			if re.MatchString(p) {
				return true
			}
		}
	}
	return false
}

// The image's build context (the repository root) leaves out .git, the dev
// directory and every secret deploy/'s steps write, and keeps what
// lockd.Dockerfile copies and builds from: go.mod, go.sum and every file
// of every package of this module that lockd imports.
func TestDockerignore(t *testing.T) {
	rootDir := filepath.Join(deployDir(t), "..")
	ign := parseDockerignore(t, string(mustRead(t, filepath.Join(rootDir, ".dockerignore"))))
	for _, p := range []string{".git", ".git/config", ".jetlock/lockd-dev-store.json", ".jetlock/n1/jetstream",
		"deploy/secrets/service.nk", "deploy/jetlock.env", "deploy/tls/out/ca-key.pem", "deploy/tls/out/clients/lockd-key.pem",
		"deploy/out-k8s/secrets/store.nk", "deploy/out-k8s/jetlock.env", "deploy/out-k8s/nats/server-key.pem", "deploy/out-k8s/ca.pem", "examples/js/node_modules/nats/index.js"} {
		if !ign.excluded(p) {
			t.Errorf(".dockerignore does not exclude %s", p)
		}
	}
	_, _, copies := dockerfile(t)
	var sources []string
	for _, c := range copies {
		if strings.HasPrefix(c[0], "--from") {
			continue
		}
		sources = append(sources, c[:len(c)-1]...)
	}
	if !slices.Contains(sources, ".") || !slices.Contains(sources, "go.mod") || !slices.Contains(sources, "go.sum") {
		t.Fatalf("lockd.Dockerfile copies %v, want go.mod, go.sum and .", sources)
	}
	need := []string{"go.mod", "go.sum"}
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if not .Standard}}{{.Module.Path}}|{{.Dir}}|{{join .GoFiles ","}}|{{join .EmbedFiles ","}}{{end}}`, "./service/cmd/lockd")
	cmd.Dir = rootDir
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	abs, err := filepath.Abs(rootDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 4 || f[0] != "github.com/jetlock/jetlock" {
			continue
		}
		rel, err := filepath.Rel(abs, f[1])
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range append(strings.Split(f[2], ","), strings.Split(f[3], ",")...) {
			if name != "" {
				need = append(need, filepath.ToSlash(filepath.Join(rel, name)))
			}
		}
	}
	if len(need) < 10 {
		t.Fatalf("lockd's sources: %v", need)
	}
	for _, p := range need {
		if ign.excluded(p) {
			t.Errorf(".dockerignore excludes %s, which lockd's build needs", p)
		}
	}
}
