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

// On Linux a jetlock killed with SIGKILL takes its command with it (a
// parent-death SIGTERM): nothing renews the lease any more.
func TestRunCommandEndsWithJetlock(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := start(t, nil, "run", "--ttl", "5s", "run:deathsig", "--", "sh", "-c", `echo $$ > `+pidFile+`; exec sleep 60`)
	pid := pidOf(t, pidFile)
	time.Sleep(100 * time.Millisecond) // past the exec
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 10*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for running(pid) {
		if time.Now().After(deadline) {
			t.Fatal("the command outlived a killed jetlock")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
