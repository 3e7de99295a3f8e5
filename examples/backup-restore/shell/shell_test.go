// Package shell_test runs the shell version of the backup-restore example
// (run.sh) against a real cluster and service, and checks its narrative.
package shell_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/testenv"
)

func TestShellBackupRestore(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the shell example needs a POSIX shell and process groups")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := t.TempDir()
	for pkg, out := range map[string]string{"../../../client/cmd/jetlock": "jetlock", "./fencedstore": "fencedstore"} {
		build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(bin, out), pkg)
		if b, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	env := testenv.Start(t)
	env.Serve(testenv.Config()) // expiry grace 0.5s

	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	cmd := exec.CommandContext(rctx, "sh", "run.sh")
	cmd.Env = append(os.Environ(), "NATS_URL="+env.Cluster.URLs(),
		"JETLOCK="+filepath.Join(bin, "jetlock"), "FENCEDSTORE="+filepath.Join(bin, "fencedstore"))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	text := string(out)
	t.Logf("run.sh took %v:\n%s", time.Since(start).Round(time.Millisecond), text)
	if err != nil {
		t.Fatalf("run.sh: %v", err)
	}

	num := func(re string) uint64 {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("narrative has no line matching %q", re)
		}
		n, _ := strconv.ParseUint(m[1], 10, 64)
		return n
	}
	t1 := num(`(?m)^backup\s+holds lock:backup:user123 with token (\d+)$`)
	t2 := num(`(?m)^restore\s+holds lock:backup:user123 with token (\d+)$`)
	if t1 == 0 || t2 <= t1 {
		t.Fatalf("tokens: backup %d, restore %d; want the restore's larger", t1, t2)
	}
	s1, s2 := strconv.FormatUint(t1, 10), strconv.FormatUint(t2, 10)
	locked := `restore without --wait: exit 75 (jetlock: locked: resource is held by another lease (owner backup-service, token ` + s1 + `))`
	restored := `restored user123 to backup-1 ("photos v1"): accepted: token ` + s2
	rejected := `backup   store: REJECTED: token ` + s1 + ` is stale for lock:backup:user123, token ` + s2 + ` was already accepted`
	for _, want := range []string{
		locked,
		`backup paused (SIGSTOP to jetlock, its guard and the job's process group)`,
		restored,
		rejected,
		`jetlock: lease_lost: `,
		`backup's jetlock exited 79: lease lost, job stopped`,
		`store: user123's content "photos v1", latest backup backup-1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("narrative lacks %q", want)
		}
	}
	if strings.Contains(text, "finished (jetlock should have stopped it)") {
		t.Error("the backup job ran to its end after its lease was lost")
	}
	if r, w := strings.Index(text, rejected), strings.Index(text, restored); r < 0 || w < 0 || r < w {
		t.Errorf("the rejection (at %d) does not follow the restore's write (at %d)", r, w)
	}
}
