package main_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// running reports whether pid is a live process (not gone, not a zombie).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// A jetlock killed with SIGKILL takes its command's whole process group
// with it (its guard sees the control pipe close): a grandchild, a child
// that ignores SIGTERM (SIGKILL after --grace) and an orphan that left the
// group (setsid; the guard is its subreaper) are all gone within the
// grace, and before a caller waiting for the lock is granted it. Before
// the guard, only the direct child got a parent-death SIGTERM.
func TestRunCommandEndsWithJetlock(t *testing.T) {
	t.Parallel()
	const grace = 700 * time.Millisecond // the most a 3s TTL allows is 750ms
	for _, c := range []struct{ name, script string }{
		{"child", `echo $$ > %pid; exec sleep 60`},
		{"grandchild", `echo $$ > %pid; (sh -c 'echo $$ > %pid2; exec sleep 60'; touch %late); true`},
		{"ignores-sigterm", `trap '' TERM; echo $$ > %pid; sh -c 'trap "" TERM; echo $$ > %pid2; i=0; while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done'; touch %late`},
		{"left-the-group", `echo $$ > %pid; setsid sh -c 'echo $$ > %pid2; sleep 60; touch %late' & wait`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			pidFile, pid2File, late := filepath.Join(dir, "pid"), filepath.Join(dir, "pid2"), filepath.Join(dir, "late")
			script := strings.NewReplacer("%pid2", pid2File, "%pid", pidFile, "%late", late).Replace(c.script)
			resource := "run:deathsig:" + c.name
			p := start(t, nil, "run", "--ttl", "3s", "--grace", grace.String(), resource, "--", "sh", "-c", script)
			pids := []int{pidOf(t, pidFile)}
			if strings.Contains(c.script, "%pid2") {
				pids = append(pids, pidOf(t, pid2File))
			}
			granted := waitForGrant(t, resource)
			if err := p.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			deadline := killed.Add(10 * time.Second)
			for anyRunning(pids) || !groupGone(pids[0]) {
				if time.Now().After(deadline) {
					t.Fatalf("the command (%v) outlived a killed jetlock by 10s", pids)
				}
				time.Sleep(10 * time.Millisecond)
			}
			gone := time.Now()
			if took := gone.Sub(killed); took > grace+time.Second {
				t.Fatalf("the command went %v after jetlock was killed, want within the grace %v (+1s)", took, grace)
			}
			select {
			case at := <-granted:
				if !at.After(gone) {
					t.Fatalf("another caller was granted the lock %v before the command was gone", gone.Sub(at))
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the lease of the killed jetlock never expired")
			}
			if exists(late) {
				t.Fatal("the command's work ran on after jetlock was killed")
			}
		})
	}
}

func anyRunning(pids []int) bool {
	for _, pid := range pids {
		if running(pid) {
			return true
		}
	}
	return false
}
