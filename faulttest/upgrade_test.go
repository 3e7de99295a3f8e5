//go:build unix

package faulttest

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
)

// upgradeFrom is the commit of the build the rolling upgrade starts from:
// the last one before a permit's grant wrote its semaphore's name record
// (docs/compatibility.md, "The semaphore's name record"). Its lockd reads
// a name record as a foreign value.
const upgradeFrom = "4744e34"

// A rolling upgrade keeps every lease: lockd of upgradeFrom and lockd of
// this tree serve one bucket at once (they share the queue group, so each
// request goes to either) under the fault tests' workload with every
// primitive: locks (raw and Go clients, some waiting, cancelled,
// abandoned), lock sets, semaphores of limits 1, 2 and 3, names used as a
// semaphore and then, once the permits end, as a lock (runSwap), sessions
// holding locks, sets and permits, and elections. Then the upgrade's
// steps (docs/compatibility.md): a second new lockd starts beside the old
// one, the old one is stopped with SIGTERM, and the load goes on against
// the two new ones. The history is checked as every fault test's is (no
// two holders of a lock or permit key, tokens rising, no acknowledged
// grant, renewal, release or keepalive lost, linearizable answers, a name
// one kind at a time), and the old instance must have granted every
// primitive (its audit log names the tokens), read name records, and
// exited 0 on SIGTERM.
//
// The lockd children run with the fault tests' budget (an answer within
// 1.5s of receipt, before the callers' 2.5s timeout) and a largest TTL of
// 5s, so that the old release's sweep may delete a name record that
// stood that long (5s plus the 500ms grace) within the test.
func TestRollingUpgradeKeepsEveryLease(t *testing.T) {
	root := repoRoot(t)
	bins := t.TempDir()
	// One build after the other: the second finds the modules the first
	// compiled in the build cache.
	oldBin, newBin := filepath.Join(bins, "lockd-"+upgradeFrom), filepath.Join(bins, "lockd-new")
	built, start := make(chan error, 1), time.Now()
	go func() {
		err := goBuild(root, newBin, nil)
		if err == nil {
			err = buildOldLockd(root, upgradeFrom, bins, oldBin)
		}
		built <- err
	}()
	h := StartHarness(t)
	hist := NewHistory()
	h.Events = hist
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	t.Logf("built lockd of the working tree and of %s in %v", upgradeFrom, time.Since(start).Round(time.Millisecond))

	old := startLockd(t, h, oldBin, "old")
	startLockd(t, h, newBin, "new-1")
	h.WaitReachable(30 * time.Second)

	r := &Run{H: h, Hist: hist, Reg: NewRegister(hist)}
	r.W = &Workload{H: h, Hist: hist, Reg: r.Reg, Hot: 3, Cold: 20, Raw: 6, Go: 2, Sessions: 2,
		Sets: 2, Sems: 3, Semaphores: 3, Limits: []int{1, 2, 3}, Swappers: 2, Candidates: 3}
	r.W.Prepare()

	var mixed Window // old and new lockd serving together
	var oldServed upgradeMetrics
	var exit int
	var exited bool
	r.DriveUntil(t, 26*time.Second, nil, func(ctx context.Context) {
		mixed.From = hist.Now()
		hist.Event("old and new lockd serve the bucket")
		// At least 12s, and on until every primitive was granted with
		// both serving, and by the old one (a busy machine is slow), for
		// at most 40s.
		for el := time.Duration(0); ctx.Err() == nil && el < 40*time.Second; el = hist.Now() - mixed.From {
			ops := hist.Ops()
			if el >= 12*time.Second && mixedEnough(ops, Window{From: mixed.From, To: 1 << 62}) && oldEnough(grantedBy(ops, old.granted(t))) {
				break
			}
			sleepCtx(ctx, 250*time.Millisecond)
		}
		oldServed = old.metrics(t)
		hist.Event("start a second new lockd beside the old one")
		startLockd(t, h, newBin, "new-2")
		hist.Event("stop the old lockd (SIGTERM)")
		old.child.Stop(30 * time.Second)
		mixed.To = hist.Now()
		exit, exited = old.child.ExitCode()
		hist.Event("old lockd exited (%d)", exit)
		sleepCtx(ctx, 8*time.Second) // the new lockd alone
	})
	rep := r.Check(t, CheckOptions{Status: true})

	ops := hist.Ops()
	t.Logf("with both serving [%v, %v]: %v", mixed.From.Round(time.Millisecond), mixed.To.Round(time.Millisecond), grantsWithin(ops, mixed))
	t.Logf("granted by the old lockd: %v", grantedBy(ops, old.granted(t)))
	t.Logf("after the old lockd stopped: %v", grantsWithin(ops, Window{From: mixed.To, To: hist.Now()}))
	t.Logf("the old lockd answered %d acquires granted and read %d foreign values (%d warnings logged); its sweep removed %d of them",
		oldServed.granted, oldServed.foreign, old.logged("value in the bucket that jetlock did not write"), old.logged("stale record removed", "foreign=true"))
	if !exited || exit != 0 {
		t.Errorf("the old lockd did not exit 0 within 30s of SIGTERM (exited %v, code %d); its log:\n%s", exited, exit, old.tail(30))
	}
	if !mixedEnough(ops, mixed) {
		t.Errorf("not every primitive was granted while both served: %v", grantsWithin(ops, mixed))
	}
	if byOld := grantedBy(ops, old.granted(t)); !oldEnough(byOld) {
		t.Errorf("the old lockd did not grant every primitive: %v", byOld)
	}
	if oldServed.granted == 0 || oldServed.foreign == 0 {
		t.Errorf("the old lockd granted %d acquires and read %d foreign values (name records): want both above 0", oldServed.granted, oldServed.foreign)
	}
	if rep.Counts["acquire/ok"] == 0 || len(rep.Violations) > 0 {
		t.Errorf("%d violations, %d locks granted", len(rep.Violations), rep.Counts["acquire/ok"])
	}
}

// mixedEnough reports whether ops answered within w grant every
// primitive: a lock, a set, a permit of each limit, a lock and a permit of
// a name that changes kind, a lease in a session and a leadership.
func mixedEnough(ops []Op, w Window) bool {
	g := grantsWithin(ops, w)
	for _, k := range []string{"acquire", "set-acquire", "permit-acquire/1", "permit-acquire/2", "permit-acquire/3",
		"swap-acquire", "swap-permit-acquire", "session-acquire", "campaign"} {
		if g[k] == 0 {
			return false
		}
	}
	return true
}

// oldEnough reports whether the old instance's grants g (see grantedBy)
// include a lock, a set, a permit, a leadership and a lease in a session.
// (A lock of a name that has been a semaphore it grants only once its
// sweep has removed the name record: too rare to ask for.)
func oldEnough(g map[string]int) bool {
	return g["acquire"] > 0 && g["set-acquire"] > 0 && g["permit-acquire/1"]+g["permit-acquire/2"]+g["permit-acquire/3"] > 0 &&
		g["campaign"] > 0 && g["session-acquire"]+g["session-permit-acquire"]+g["session-set-acquire"] > 0
}

// grantsWithin counts the grants answered within w by the label of their
// request (a permit's with its limit; a name that changes kind's as swap-).
func grantsWithin(ops []Op, w Window) map[string]int {
	out := map[string]int{}
	for i := range ops {
		o := &ops[i]
		if o.Kind != KAcquire || o.Result != OK || o.Complete < w.From || o.Complete > w.To {
			continue
		}
		k := o.label()
		if strings.Contains(o.Resource, "/swap/") {
			k = "swap-" + k
		} else if o.Limit > 0 && o.Session == "" {
			k += "/" + strconv.Itoa(o.Limit)
		}
		out[k]++
	}
	return out
}

// repoRoot returns the repository's top directory; the test needs its
// history.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("the rolling upgrade test builds lockd of commit %s from the repository's history, but git rev-parse failed: %v", upgradeFrom, err)
	}
	root := strings.TrimSpace(string(out))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", upgradeFrom+"^{commit}").Run(); err != nil {
		shallow, _ := exec.Command("git", "-C", root, "rev-parse", "--is-shallow-repository").Output()
		t.Fatalf("the rolling upgrade test builds lockd of commit %s from the repository's history, which lacks it (shallow clone: %s): clone the whole history (git fetch --unshallow)",
			upgradeFrom, strings.TrimSpace(string(shallow)))
	}
	return root
}

// buildOldLockd writes the tree of commit rev (what lockd is built from)
// to a directory under dir and builds its lockd there, to bin.
func buildOldLockd(root, rev, dir, bin string) error {
	src := filepath.Join(dir, "src-"+rev)
	cmd := exec.Command("git", "-C", root, "archive", "--format=tar", rev, "go.mod", "go.sum", "service", "streams", "internal")
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	xerr := untar(pipe, src)
	_, _ = io.Copy(io.Discard, pipe)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", rev, err, stderr.String())
	}
	if xerr != nil {
		return fmt.Errorf("git archive %s: %w", rev, xerr)
	}
	return goBuild(src, bin, []string{"GOWORK=off"})
}

// untar writes the regular files and directories of the tar stream r
// under dir.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		hd, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Join(dir, filepath.FromSlash(hd.Name))
		if !strings.HasPrefix(name, dir+string(filepath.Separator)) {
			return fmt.Errorf("%q leaves the directory", hd.Name)
		}
		switch hd.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(name, 0o755)
		case tar.TypeReg:
			err = writeFile(name, tr, hd.FileInfo().Mode().Perm())
		}
		if err != nil {
			return err
		}
	}
}

func writeFile(name string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// goBuild builds the lockd of the module in dir to bin, within 3 minutes.
func goBuild(dir, bin string, env []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./service/cmd/lockd")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build lockd in %s: %w\n%s", dir, err, out)
	}
	return nil
}

// lockdChild is a lockd process serving the harness's cluster.
type lockdChild struct {
	child      *devcluster.Child
	audit      string // its audit log
	metricsURL string
}

var metricsBanner = regexp.MustCompile(`Metrics: (http://\S+)/metrics`)

// startLockd starts lockd bin as name against h's cluster, with the fault
// tests' timings, and waits until it serves. It is stopped at cleanup,
// and its log shown if the test failed.
func startLockd(t *testing.T, h *Harness, bin, name string) *lockdChild {
	t.Helper()
	su, sp := h.C.User(devcluster.Service)
	tu, tp := h.C.User(devcluster.Store)
	cfg := ServiceConfig()
	dir := t.TempDir()
	l := &lockdChild{audit: filepath.Join(dir, name+".audit"), child: &devcluster.Child{Name: "lockd " + name, Path: bin, Log: filepath.Join(dir, name+".log"),
		Args: []string{"--server", h.C.URLs(), "--user", su, "--password", sp, "--store-user", tu, "--store-password", tp,
			"--queue-wait", cfg.QueueWait.String(), "--op-timeout", cfg.OpTimeout.String(), "--expiry-grace", cfg.ExpiryGrace.String(),
			"--max-ttl", "5s", "--default-ttl", "3s", "--metrics", "127.0.0.1:0", "--audit", filepath.Join(dir, name+".audit")}}}
	if err := l.child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.child.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("log of lockd %s (last lines):\n%s", name, l.tail(40))
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := l.child.WaitReady(ctx, 60*time.Second, func() bool {
		b, _ := os.ReadFile(l.child.Log)
		if !strings.Contains(string(b), "jetlock is serving") {
			return false
		}
		if m := metricsBanner.FindSubmatch(b); m != nil {
			l.metricsURL = string(m[1])
		}
		return true
	}); err != nil {
		t.Fatalf("%v:\n%s", err, l.tail(40))
	}
	h.Events.Event("lockd %s serves", name)
	return l
}

// tail returns the last n lines of the log.
func (l *lockdChild) tail(n int) string {
	b, _ := os.ReadFile(l.child.Log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// logged counts the lines of the instance's log that contain every one
// of parts.
func (l *lockdChild) logged(parts ...string) int {
	b, _ := os.ReadFile(l.child.Log)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// granted returns the tokens of the grants in the instance's audit log: a
// lease's, each permit's and each resource's of a set.
func (l *lockdChild) granted(t *testing.T) map[uint64]bool {
	t.Helper()
	b, err := os.ReadFile(l.audit)
	if err != nil {
		t.Error(err)
	}
	out := map[uint64]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		var e struct {
			Event string `json:"event"`
			Token uint64 `json:"token"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Event == "grant" && e.Token != 0 {
			out[e.Token] = true
		}
	}
	return out
}

// grantedBy counts by label, as grantsWithin does, the grants of ops whose
// token (one of a set's) is in tokens.
func grantedBy(ops []Op, tokens map[uint64]bool) map[string]int {
	var by []Op
	for _, o := range ops {
		mine := tokens[o.Token]
		for _, m := range o.Members {
			mine = mine || tokens[m.Token]
		}
		if mine {
			by = append(by, o)
		}
	}
	return grantsWithin(by, Window{To: 1 << 62})
}

// upgradeMetrics is what an instance's /metrics tells of its part.
type upgradeMetrics struct {
	granted int // acquires answered with a grant
	foreign int // values read that were not jetlock records
}

var (
	requestsLine = regexp.MustCompile(`^jetlock_requests_total\{([^}]*)\} (\S+)$`)
	foreignLine  = regexp.MustCompile(`^jetlock_foreign_records_total (\S+)$`)
)

// metrics scrapes the instance's /metrics.
func (l *lockdChild) metrics(t *testing.T) upgradeMetrics {
	t.Helper()
	var m upgradeMetrics
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(l.metricsURL + "/metrics")
	if err != nil {
		t.Errorf("scrape %s: %v", l.child.Name, err)
		return m
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if s := requestsLine.FindStringSubmatch(line); s != nil && strings.Contains(s[1], `op="acquire"`) && strings.Contains(s[1], `code="ok"`) {
			v, _ := strconv.ParseFloat(s[2], 64)
			m.granted += int(v)
		}
		if s := foreignLine.FindStringSubmatch(line); s != nil {
			v, _ := strconv.ParseFloat(s[1], 64)
			m.foreign += int(v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Errorf("scrape %s: %v", l.child.Name, err)
	}
	return m
}
