//go:build linux

package main_test

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// A leader whose jetlock is killed (SIGKILL: no resignation) is followed by
// exactly one new leader, the standby, with a larger token, once the lease
// has expired; by then the old leader's command is gone, so two leaders'
// commands never ran at once.
func TestElectLeaderKilledStandbyElected(t *testing.T) {
	t.Parallel()
	const name = "elect-cli:killed"
	dir := t.TempDir()
	aOut := filepath.Join(dir, "a")
	a := start(t, nil, "elect", "--ttl", "2s", name, "--value", "a", "--", "sh", "-c",
		waitScript(aOut, filepath.Join(dir, "never"), "JETLOCK_TOKEN"))
	af := readFields(t, aOut)
	aToken, _ := strconv.ParseUint(af[0], 10, 64)
	guard := childOf(t, a.cmd.Process.Pid)
	aCmd := childOf(t, guard)

	bOut, bFinish := filepath.Join(dir, "b"), filepath.Join(dir, "b-finish")
	b := start(t, nil, "elect", "--ttl", "5s", name, "--value", "b", "--", "sh", "-c",
		waitScript(bOut, bFinish, "JETLOCK_TOKEN"))
	time.Sleep(time.Second)
	if exists(bOut) {
		t.Fatal("the standby ran while the leader led")
	}
	c := newClient(t)
	if st := status(t, c, name); !st.Held || st.Token != aToken {
		t.Fatalf("status before the kill: %+v", st)
	}

	killed := time.Now()
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	bf := readFields(t, bOut)
	elected := time.Since(killed)
	t.Logf("standby elected %v after the leader was killed", elected)
	if !groupGone(aCmd) {
		t.Fatal("the killed leader's command still ran when the standby was elected")
	}
	bToken, _ := strconv.ParseUint(bf[0], 10, 64)
	if bToken <= aToken {
		t.Fatalf("new leader's token %d not above %d", bToken, aToken)
	}
	// The lease had to expire first: no sooner than its TTL after the
	// kill's moment, less the time since its last renewal (a third of it).
	if elected < 2*time.Second*2/3 {
		t.Fatalf("standby elected %v after the kill, before the leader's lease could expire", elected)
	}
	if st := status(t, c, name); !st.Held || st.Token != bToken {
		t.Fatalf("status after the failover: %+v, want the standby with token %d", st, bToken)
	}
	if err := os.WriteFile(bFinish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wantCode(t, b.wait(t, 20*time.Second), 0)
	if st := status(t, c, name); st.Held {
		t.Fatalf("held after the leader resigned: %+v", st)
	}
}

// A leader paused past its TTL (jetlock, its guard and its command, as in a
// frozen VM) is succeeded by the standby; when the old leader's command
// resumes, its write with the old token is refused by the fenced store,
// and the old jetlock, resumed, stops it and exits 79.
func TestElectPausedLeaderIsFenced(t *testing.T) {
	t.Parallel()
	const name = "elect-cli:paused"
	_, b := pausedHolderIsFenced(t, name,
		[]string{"elect", "--ttl", "3s", "--value", "a", name}, // a TTL a busy machine still renews
		[]string{"elect", "--ttl", "5s", "--grace", "1s", "--value", "b", name})
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	b.wait(t, 20*time.Second)
}
