//go:build unix

package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// readFields waits for path and returns the fields of its first line.
func readFields(t *testing.T, path string) []string {
	t.Helper()
	waitFile(t, path, 20*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.HasSuffix(string(b), "\n") || time.Now().After(deadline) {
			return strings.Fields(string(b))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitScript writes its environment's VARS to out, then waits until
// finish exists (at most 60s).
func waitScript(out, finish string, vars ...string) string {
	echo := ""
	for _, v := range vars {
		echo += ` "$` + v + `"`
	}
	return `echo` + echo + ` > ` + out + `.tmp && mv ` + out + `.tmp ` + out +
		`; i=0; while [ ! -e ` + finish + ` ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done`
}

// The leader runs its command with its token; a standby waits; leader
// shows the leader and --watch follows every change; when the leader's
// command exits it resigns and the standby runs at once, with a larger
// token.
func TestElectRunsTheLeaderAndHandsOver(t *testing.T) {
	t.Parallel()
	const name = "elect-cli:hand-over"
	dir := t.TempDir()
	watch := start(t, nil, "leader", "--watch", "--json", "--for", "40s", name)
	// The watcher is up: its first line (a status read) is out, and its
	// subscription to the election's events has reached every node.
	waitOutput(t, watch, func(out string) bool { return strings.Contains(out, "\n") }, 20*time.Second)
	(&testenv.Env{T: t, Cluster: cluster}).WaitInterest(devcluster.Account, streams.EventSubject(streams.DefaultPrefix, name))

	aOut, aFinish := filepath.Join(dir, "a"), filepath.Join(dir, "a-finish")
	// A TTL far above the bound on the hand-over below: "at once" is
	// told from "after the TTL" on a busy machine too.
	a := start(t, nil, "elect", "--ttl", "30s", name, "--value", "host-a:80", "--", "sh", "-c",
		waitScript(aOut, aFinish, "JETLOCK_RESOURCE", "JETLOCK_TOKEN"))
	af := readFields(t, aOut)
	if len(af) != 2 || af[0] != name {
		t.Fatalf("the leader's command got %q", af)
	}
	aToken, _ := strconv.ParseUint(af[1], 10, 64)
	if aToken == 0 {
		t.Fatalf("JETLOCK_TOKEN %q", af[1])
	}
	bOut, bFinish := filepath.Join(dir, "b"), filepath.Join(dir, "b-finish")
	b := start(t, nil, "elect", "--ttl", "5s", "--value", "host-b:80", name, "--", "sh", "-c",
		waitScript(bOut, bFinish, "JETLOCK_RESOURCE", "JETLOCK_TOKEN"))
	deadline := time.Now().Add(10 * time.Second)
	for status(t, newClient(t), name).Waiters != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the standby never queued")
		}
		time.Sleep(50 * time.Millisecond)
	}
	r := jl(t, "leader", name)
	wantCode(t, r, 0)
	if want := name + `: leader "host-a:80", token ` + af[1] + "\n"; r.stdout != want {
		t.Fatalf("leader printed %q, want %q", r.stdout, want)
	}
	if exists(bOut) {
		t.Fatal("the standby's command runs while a leads")
	}

	if err := os.WriteFile(aFinish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wantPassthrough(t, a.wait(t, 20*time.Second), 0)
	handedOver := time.Now()
	bf := readFields(t, bOut)
	if took := time.Since(handedOver); took > 10*time.Second {
		t.Fatalf("the standby ran %v after the leader resigned", took)
	}
	if bToken, _ := strconv.ParseUint(bf[1], 10, 64); len(bf) != 2 || bToken <= aToken {
		t.Fatalf("the standby's command got %q, want a token above %d", bf, aToken)
	}
	r = jl(t, "leader", "--json", name)
	wantCode(t, r, 0)
	var now struct {
		Election string `json:"election"`
		Leader   bool   `json:"leader"`
		Token    uint64 `json:"token"`
		Value    string `json:"value"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &now); err != nil || !now.Leader || now.Value != "host-b:80" || strconv.FormatUint(now.Token, 10) != bf[1] {
		t.Fatalf("leader --json printed %q (%v)", r.stdout, err)
	}
	if err := os.WriteFile(bFinish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wantPassthrough(t, b.wait(t, 20*time.Second), 0)
	r = jl(t, "leader", name)
	if wantCode(t, r, 0); r.stdout != name+": no leader\n" {
		t.Fatalf("leader printed %q", r.stdout)
	}

	// The watcher saw it all, in order: wait for its last event, b's end.
	waitOutput(t, watch, func(out string) bool {
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, `"event":"ended"`) && strings.Contains(line, `"token":`+bf[1]) {
				return true
			}
		}
		return false
	}, 20*time.Second)
	_ = watch.cmd.Process.Signal(os.Interrupt)
	w := watch.wait(t, 10*time.Second)
	wantCode(t, w, 0)
	var seen []string
	for _, line := range strings.Split(strings.TrimSpace(w.stdout), "\n") {
		var ev struct {
			Event  string `json:"event"`
			Leader bool   `json:"leader"`
			Token  uint64 `json:"token"`
			Value  string `json:"value"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("watch line %q: %v", line, err)
		}
		seen = append(seen, ev.Event+" "+ev.Value+" "+strconv.FormatUint(ev.Token, 10))
	}
	a0, b0 := af[1], bf[1]
	want := []string{"ended  0", "elected host-a:80 " + a0, "ended  " + a0, "elected host-b:80 " + b0, "ended  " + b0}
	if len(seen) == len(want)-1 { // a's end, in the same write as b's election, came second and was dropped
		want = append(want[:2], want[3:]...)
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("leader --watch saw\n%s\nwant\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}

// A leader whose leadership is revoked stops its command (exit 79) and
// the standby takes over; a standby with --wait gives up with 75.
func TestElectLostLeadershipStopsCommand(t *testing.T) {
	t.Parallel()
	const name = "elect-cli:lost"
	dir := t.TempDir()
	aOut := filepath.Join(dir, "a")
	a := start(t, nil, "elect", "--ttl", "3s", "--grace", "700ms", name, "--", "sh", "-c", waitScript(aOut, filepath.Join(dir, "never"), "JETLOCK_TOKEN"))
	readFields(t, aOut)
	r := jl(t, "elect", "--wait", "500ms", name, "--", "true")
	wantError(t, r, 75)

	bOut := filepath.Join(dir, "b")
	b := start(t, nil, "elect", "--ttl", "3s", name, "--", "sh", "-c", `echo $JETLOCK_TOKEN > `+bOut+`.tmp && mv `+bOut+`.tmp `+bOut)
	time.Sleep(500 * time.Millisecond)
	wantCode(t, jl(t, operator("revoke", name, "--reason", "test")...), 0)
	res := a.wait(t, 20*time.Second)
	wantCode(t, res, 79)
	if !strings.Contains(res.stderr, "lease_lost") {
		t.Fatalf("stderr %q", res.stderr)
	}
	wantPassthrough(t, b.wait(t, 20*time.Second), 0)
	if !exists(bOut) {
		t.Fatal("the standby's command never ran")
	}
}

// run --limit N runs at most N at once, each with its permit and its
// token in the environment; the others wait and run when one finishes.
func TestRunLimitRunsAtMostN(t *testing.T) {
	t.Parallel()
	const name = "sem-cli:pool"
	dir := t.TempDir()
	finish := filepath.Join(dir, "finish")
	var procs []*proc
	for i := range 3 {
		out := filepath.Join(dir, strconv.Itoa(i))
		procs = append(procs, start(t, nil, "run", "--limit", "2", "--wait", "30s", "--ttl", "5s", name, "--", "sh", "-c",
			waitScript(out, finish, "JETLOCK_RESOURCE", "JETLOCK_PERMIT", "JETLOCK_TOKEN")))
	}
	deadline := time.Now().Add(20 * time.Second)
	running := func() (n int, permits map[string]bool) {
		permits = map[string]bool{}
		for i := range 3 {
			if b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(i))); err == nil {
				f := strings.Fields(string(b))
				if len(f) != 3 || f[0] != name || (f[1] != "1" && f[1] != "2") || f[2] == "" {
					t.Fatalf("a command got %q", b)
				}
				permits[f[1]] = true
				n++
			}
		}
		return n, permits
	}
	for {
		n, permits := running()
		if n > 2 {
			t.Fatal("three run at once with --limit 2")
		}
		if n == 2 {
			if len(permits) != 2 {
				t.Fatalf("two commands with the same permit: %v", permits)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d commands started in 20s, want 2", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if n, _ := running(); n != 2 {
		t.Fatalf("%d commands run with --limit 2", n)
	}
	r := jl(t, "run", "--limit", "2", name, "--", "true")
	wantError(t, r, 75)
	if want := "jetlock: locked: semaphore " + name + " has no free permit (limit 2)\n"; r.stderr != want {
		t.Fatalf("stderr %q, want %q", r.stderr, want)
	}
	r = jl(t, "run", "--limit", "3", name, "--", "true")
	wantError(t, r, 2)
	if !strings.Contains(r.stderr, "limit") {
		t.Fatalf("another limit: %q", r.stderr)
	}
	if err := os.WriteFile(finish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		wantPassthrough(t, p.wait(t, 30*time.Second), 0)
	}
	if n, _ := running(); n != 3 {
		t.Fatalf("%d of 3 commands ran", n)
	}
}

// Bad input for elect, leader and run --limit exits 2 before anything
// connects.
func TestElectAndLimitBadInput(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"run", "--limit", "0", "sem-cli:bad", "--", "true"},
		{"run", "--limit", "1001", "sem-cli:bad", "--", "true"},
		{"run", "--limit", "2", "sem-cli:a", "sem-cli:b", "--", "true"},
		{"elect", "elect-cli:bad", "--value", strings.Repeat("v", 1025), "--", "true"},
		{"elect", "elect-cli:bad", "--value", "a\tb", "--", "true"},
		{"elect", "elect-cli:bad"},
		{"elect", "bad#name", "--", "true"},
		{"leader", "--for", "1s", "elect-cli:bad"},
	} {
		r := start(t, []string{"NATS_URL=nats://127.0.0.1:1"}, args...).wait(t, 20*time.Second)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "jetlock: usage: ") {
			t.Errorf("jetlock %q: exit %d, stderr %q; want exit 2 and a usage error", args, r.code, r.stderr)
		}
	}
}

// elect and leader have --help with an example.
func TestElectHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"elect", "leader"} {
		r := jl(t, cmd, "--help")
		if r.code != 0 || !strings.Contains(r.stdout, "Example:\n") || !strings.Contains(r.stdout, "jetlock "+cmd) {
			t.Errorf("jetlock %s --help: exit %d\n%s", cmd, r.code, r.stdout)
		}
	}
	if r := jl(t, "run", "--help"); !strings.Contains(r.stdout, "--limit") {
		t.Errorf("jetlock run --help does not mention --limit:\n%s", r.stdout)
	}
}
