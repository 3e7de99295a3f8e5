package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// deploy/README.md's Kubernetes steps run as one block from the repository
// root: no cd, every kubectl in namespace jetlock, helm install with that
// namespace and the pinned chart version nats-values.yaml is written for,
// every deploy/ file it names present, and every generated file it names
// (in deploy/out-k8s, which deploy/.gitignore and .dockerignore cover) one
// that make-ca.sh and make-nkeys.sh make with the block's arguments.
func TestKubernetesBlock(t *testing.T) {
	text := readDeploy(t, "README.md")
	start := strings.Index(text, "\n## Kubernetes\n")
	if start < 0 {
		t.Fatal("README.md has no section Kubernetes")
	}
	sec := text[start+1:]
	if end := strings.Index(sec[1:], "\n## "); end >= 0 {
		sec = sec[:end+1]
	}
	// One fenced block (or one indented block), nothing between its lines.
	var block []string
	if n := strings.Count(sec, "```sh\n"); n > 0 {
		if n != 1 {
			t.Fatalf("the Kubernetes section has %d code blocks, want one", n)
		}
		body := sec[strings.Index(sec, "```sh\n")+len("```sh\n"):]
		end := strings.Index(body, "\n```")
		if end < 0 {
			t.Fatal("the Kubernetes block does not end")
		}
		block = strings.Split(body[:end], "\n")
	} else {
		lines := strings.Split(sec, "\n")
		first, last := -1, -1
		for i, l := range lines {
			if strings.HasPrefix(l, "    ") {
				if first < 0 {
					first = i
				}
				last = i
			}
		}
		if first < 0 {
			t.Fatal("the Kubernetes section has no code block")
		}
		for _, l := range lines[first : last+1] {
			if !strings.HasPrefix(l, "    ") {
				t.Fatalf("the Kubernetes steps are not one block: %q between them", l)
			}
			block = append(block, l)
		}
	}
	var cmds []string
	cur := ""
	for _, l := range block {
		l = strings.TrimSpace(l)
		if strings.HasSuffix(l, `\`) {
			cur += strings.TrimSuffix(l, `\`)
			continue
		}
		cmds = append(cmds, cur+l)
		cur = ""
	}
	root := filepath.Join(deployDir(t), "..")
	generated := map[string]bool{}
	helm := false
	for _, cmd := range cmds {
		for _, seg := range strings.Split(cmd, "|") {
			for _, part := range strings.Split(seg, "&&") {
				f := strings.Fields(part)
				if len(f) == 0 {
					continue
				}
				switch {
				case f[0] == "cd":
					t.Errorf("the block changes directory: %q", part)
				case f[0] == "kubectl" && strings.Join(f, " ") != "kubectl create namespace jetlock" &&
					!strings.Contains(part, " -n jetlock ") && !strings.Contains(part, " --namespace jetlock "):
					t.Errorf("kubectl outside namespace jetlock: %q", part)
				case len(f) > 1 && f[0] == "helm" && f[1] == "install":
					helm = true
					if !strings.Contains(part, " --version "+chartVersion+" ") || !strings.Contains(part, " --namespace jetlock ") {
						t.Errorf("%q: want --version %s --namespace jetlock", part, chartVersion)
					}
				}
			}
		}
		for _, m := range regexp.MustCompile(`(?:^|[\s=])(deploy/[^\s"]+)`).FindAllStringSubmatch(cmd, -1) {
			p := m[1]
			if rel, ok := strings.CutPrefix(p, "deploy/out-k8s/"); ok {
				generated[rel] = true
				continue
			}
			if p == "deploy/out-k8s" { // the scripts' output directory
				continue
			}
			if _, err := os.Stat(filepath.Join(root, p)); err != nil {
				t.Errorf("the block names %s: %v", p, err)
			}
		}
	}
	if !strings.Contains("\n"+readDeploy(t, ".gitignore"), "\nout*/\n") {
		t.Error("deploy/.gitignore does not ignore out-k8s/, where the block writes keys")
	}
	if !helm {
		t.Error("the block has no helm install")
	}
	if !strings.Contains(readDeploy(t, "k8s/nats-values.yaml"), "--version "+chartVersion+" ") {
		t.Errorf("k8s/nats-values.yaml does not say it is for chart %s", chartVersion)
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl for make-ca.sh")
	}
	dir := t.TempDir()
	ca := exec.Command("sh", filepath.Join(deployDir(t), "tls", "make-ca.sh"), dir, "nats")
	ca.Env = append(os.Environ(), "DAYS=2", "EXTRA_SANS=DNS:*.nats-headless")
	if b, err := ca.CombinedOutput(); err != nil {
		t.Fatalf("make-ca.sh: %v\n%s", err, b)
	}
	makeNkeys(t, buildNK(t), dir)
	for p := range generated {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("the block uses %s, which make-ca.sh and make-nkeys.sh do not make: %v", p, err)
		}
	}
	if len(generated) < 6 {
		t.Errorf("the block uses only %v of the generated files", generated)
	}
}
