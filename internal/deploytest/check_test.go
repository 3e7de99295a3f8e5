package deploytest

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// lockdCheck builds lockd and runs `lockd check --json` against the
// cluster as role, with the flags deploy/README.md gives; it returns the
// exit code and the report.
func (c *cluster) lockdCheck(t *testing.T, bin, role string, extra ...string) (int, map[string]any, string) {
	t.Helper()
	seed, err := c.keys[role].Seed()
	if err != nil {
		t.Fatal(err)
	}
	nk := filepath.Join(t.TempDir(), role+".nk")
	if err := os.WriteFile(nk, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	cert := c.certs[certOf[role]]
	args := append([]string{"check", "--json", "--timeout=5s", "--server=" + c.urls(), "--tlsca=" + c.ca.CertFile,
		"--tlscert=" + cert.CertFile, "--tlskey=" + cert.KeyFile, "--store-nkey=" + nk}, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("lockd check: %v", err)
	}
	var report map[string]any
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("lockd check as %s: exit %d, output %q, stderr %q: %v", role, code, out, stderr.String(), err)
	}
	return code, report, stderr.String()
}

// buildLockd builds lockd into a temporary directory.
func buildLockd(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command builds lockd for this test: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "lockd")
	cmd := exec.Command(goBin, "build", "-o", bin, "./service/cmd/lockd")
	cmd.Dir = filepath.Join(deployDir(t), "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build lockd: %v\n%s", err, out)
	}
	return bin
}
