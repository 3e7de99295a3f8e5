package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Run is one workload run under faults, to be checked.
type Run struct {
	H    *Harness
	Hist *History
	Reg  *Register
	W    *Workload
}

// NewRun starts a harness with one service instance per node and prepares
// a workload (tuned by tune, if not nil) recording into a new history.
func NewRun(t *testing.T, tune func(*Workload)) *Run {
	t.Helper()
	h := StartHarness(t)
	for node := 0; node < 3; node++ {
		h.Serve(node, ServiceConfig())
	}
	hist := NewHistory()
	h.Events = hist
	r := &Run{H: h, Hist: hist, Reg: NewRegister(hist)}
	r.W = &Workload{H: h, Hist: hist, Reg: r.Reg}
	if tune != nil {
		tune(r.W)
	}
	r.W.Prepare()
	return r
}

// Drive runs the workload for d. faults runs alongside with a context
// that ends 4s before the workload does; then every fault is healed, so
// the workload ends on a healthy cluster and its last leases are released.
func (r *Run) Drive(t *testing.T, d time.Duration, faults func(ctx context.Context)) {
	t.Helper()
	r.DriveUntil(t, d, nil, faults)
}

// DriveUntil is Drive for a run that must have done something before it
// ends (made so many faults, granted so many leases): what a run gets done
// in d depends on how busy the machine is, so the faults' context ends
// only once d-4s has passed and enough holds (or after 4d, when the test's
// own check then fails), and the workload runs on to d, and to at least
// 4s after the faults returned.
func (r *Run) DriveUntil(t *testing.T, d time.Duration, enough func() bool, faults func(ctx context.Context)) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); r.W.Run(ctx) }()
	fctx, fcancel := context.WithCancel(ctx)
	go func() {
		defer fcancel()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			el := time.Since(start)
			if el >= 4*d || el >= d-4*time.Second && (enough == nil || enough()) {
				return
			}
			select {
			case <-tick.C:
			case <-fctx.Done():
				return
			}
		}
	}()
	if faults != nil {
		faults(fctx)
	}
	<-fctx.Done()
	healed := time.Now()
	r.H.Settle()
	sleepCtx(ctx, max(time.Until(start.Add(d)), time.Until(healed.Add(4*time.Second))))
	cancel()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("workload did not stop")
	}
}

// atLeast returns a condition for DriveUntil: at least n operations of the
// history have ended as key ("acquire/ok").
func (r *Run) atLeast(n int, key string) func() bool {
	return func() bool { return r.Hist.Count(key) >= n }
}

// all returns a condition that holds when every one of conds holds.
func all(conds ...func() bool) func() bool {
	return func() bool {
		for _, c := range conds {
			if c != nil && !c() {
				return false
			}
		}
		return true
	}
}

// Check checks the run's history, logs a summary and fails the test on
// any violation, writing the history of the resources involved to a file.
func (r *Run) Check(t *testing.T, opt CheckOptions) *Report {
	t.Helper()
	if bucket := r.W.stopObservers(); opt.Bucket == nil {
		opt.Bucket = bucket
	}
	ops := r.Hist.Ops()
	start := time.Now()
	rep := Check(ops, r.Reg.Log(), opt)
	t.Logf("%d ops checked in %v: %s", len(ops), time.Since(start).Round(time.Millisecond), rep.Summary())
	g := &r.W.goStats
	t.Logf("go clients: %d grants, %d lost at once, %d gave up mid-wait", g.grants.Load(), g.lostAtGrant.Load(), g.abandoned.Load())
	if s := &r.W.sessStats; r.W.Sessions > 0 {
		codes := map[string]int{}
		for i := range ops {
			if o := &ops[i]; o.Result == Fail && (o.Session != "" || o.Kind == KOpen) {
				codes[o.label()+"/"+o.Code]++
				if o.Kind == KOpen {
					t.Logf("open refused: %v", o)
				}
			}
		}
		t.Logf("refusals in sessions: %v", codes)
		t.Logf("sessions: %d opened, %d closed (%d with acquires in flight), %d no longer kept alive, %d lost, %d leases (%d lock sets, %d permits), %d probes",
			s.opened.Load(), s.closed.Load()+s.closedInFlight.Load(), s.closedInFlight.Load(), s.abandoned.Load(), s.lost.Load(), s.grants.Load(),
			s.sets.Load(), s.permits.Load(), s.probes.Load())
		if r.W.primitives() == 0 {
			t.Logf("%d bucket writes watched", len(opt.Bucket))
		}
	}
	if r.W.primitives() > 0 {
		codes := map[string]int{}
		for i := range ops {
			if o := &ops[i]; o.Result != OK && (len(o.Resources) > 0 || o.Limit > 0 || o.Permit > 0 || o.Value != "") {
				codes[o.label()+"/"+o.Code]++
			}
		}
		t.Logf("refusals and unknown outcomes of sets, semaphores and elections: %v", codes)
		for _, o := range unexplainedLeaseLost(ops) {
			t.Logf("acquire answered lease_lost, neither cancelled nor granted before (not a safety violation): %v", o)
		}
		t.Logf("sets, semaphores and elections: %v; %d election events observed, %d bucket writes watched", &r.W.prim, r.W.observer.Received(), len(opt.Bucket))
	}
	for _, v := range rep.Anomalies {
		t.Logf("anomaly (not a safety violation) %v", v)
	}
	if strings.Contains(rep.Linearizable, "unknown") {
		t.Logf("the linearizability check ran out of time: %s", rep.Linearizable)
	} else if len(rep.Violations) == 0 && len(rep.Anomalies) == 0 {
		return rep
	}
	defer dumpHistory(t, ops, rep)
	if len(rep.Violations) == 0 {
		return rep
	}
	for _, v := range rep.Violations {
		t.Errorf("violation %v", v)
	}
	return rep
}

// dumpHistory writes every operation to a file kept after the test, for
// the post-mortem.
func dumpHistory(t *testing.T, ops []Op, rep *Report) {
	dir, err := os.MkdirTemp("", "faulttest-")
	if err != nil {
		t.Log(err)
		return
	}
	path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".history")
	var faults []Op
	byRes := map[string][]Op{}
	// The opens, keepalives and closes of a session are shown with every
	// resource it acquired (each of a set's, a permit's semaphore).
	sessionRes := map[string]map[string]bool{}
	for _, o := range ops {
		if o.Kind == KAcquire && o.Session != "" {
			if sessionRes[o.Session] == nil {
				sessionRes[o.Session] = map[string]bool{}
			}
			for _, r := range append([]string{o.Resource}, o.Resources...) {
				if r != "" {
					sessionRes[o.Session][r] = true
				}
			}
		}
	}
	for _, o := range ops {
		switch {
		case o.Kind == KFault:
			faults = append(faults, o)
		case o.Resource == "" && len(sessionRes[o.Session]) > 0:
			for r := range sessionRes[o.Session] {
				byRes[r] = append(byRes[r], o)
			}
		case len(o.Resources) > 0:
			// An operation on a lock set is shown with each resource.
			for _, r := range o.Resources {
				byRes[r] = append(byRes[r], o)
			}
		default:
			byRes[o.Resource] = append(byRes[o.Resource], o)
		}
	}
	var b strings.Builder
	for _, v := range rep.Violations {
		fmt.Fprintf(&b, "VIOLATION %v\n", v)
	}
	for _, v := range rep.Anomalies {
		fmt.Fprintf(&b, "ANOMALY %v\n", v)
	}
	names := make([]string, 0, len(byRes))
	for r := range byRes {
		names = append(names, r)
	}
	sort.Strings(names)
	for _, r := range names {
		fmt.Fprintf(&b, "\n== %s\n", r)
		list := append(byRes[r], faults...)
		sort.SliceStable(list, func(i, j int) bool { return list[i].Invoke < list[j].Invoke })
		for i := range list {
			fmt.Fprintln(&b, list[i].String())
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Log(err)
		return
	}
	t.Logf("history written to %s", path)
}

// every calls f every period (jittered by up to half of it) until ctx ends.
func every(ctx context.Context, period time.Duration, f func()) {
	for {
		sleepCtx(ctx, period/2+time.Duration(rand.Int64N(int64(period/2)+1)))
		if ctx.Err() != nil {
			return
		}
		f()
	}
}

// within reports how many operations of kind with result r were invoked
// and answered inside w.
func within(ops []Op, kind Kind, r Result, w Window) int {
	n := 0
	for _, o := range ops {
		if o.Kind == kind && o.Result == r && o.Invoke >= w.From && o.Complete <= w.To {
			n++
		}
	}
	return n
}

// driveLeaderChanges drives the workload for 20 s while the stream leader
// is made to step down every two seconds or so, and on until the leader
// has moved four times and enough holds (see DriveUntil); it checks the
// history, fails the test if the leader moved fewer than four times, and
// returns the check's report.
func driveLeaderChanges(t *testing.T, r *Run, enough func() bool) *Report {
	t.Helper()
	var changes atomic.Int32
	r.DriveUntil(t, 20*time.Second, all(func() bool { return changes.Load() >= 4 }, enough), func(ctx context.Context) {
		every(ctx, 2*time.Second, func() {
			if err := r.H.StepDown(); err == nil {
				changes.Add(1)
			}
		})
	})
	t.Logf("%d leader changes", changes.Load())
	rep := r.Check(t, CheckOptions{Status: true})
	if changes.Load() < 4 {
		t.Errorf("%d leader changes", changes.Load())
	}
	return rep
}

// driveClientPauses drives the workload for d, and on until enough holds
// (see DriveUntil), while, every 350 to 700 ms, a client's connection is
// paused for one to five seconds; it returns when every pause has ended
// and the history is checked, with the check's report.
func driveClientPauses(t *testing.T, r *Run, d time.Duration, enough func() bool) *Report {
	t.Helper()
	proxies := r.W.ClientProxies()
	var pauses sync.WaitGroup
	r.DriveUntil(t, d, enough, func(ctx context.Context) {
		every(ctx, 700*time.Millisecond, func() {
			i := rand.IntN(len(proxies))
			pauseFor(&pauses, proxies[i], time.Second+rand.N(4*time.Second), r.Hist, "client "+itoa(i))
		})
	})
	pauses.Wait()
	return r.Check(t, CheckOptions{Status: true})
}

// failOverAround waits until shortly before deadline, then pauses the
// service instance on node 0 for three seconds (counted in pauses) and
// replaces the one on node 1, which then knows only what the bucket
// holds; the instance on node 2 is left to act on the deadline. It
// returns node 1's new instance.
func failOverAround(r *Run, insts []*Instance, deadline time.Duration, pauses *sync.WaitGroup) *Instance {
	time.Sleep(max(0, deadline-300*time.Millisecond-r.Hist.Now()))
	pauseFor(pauses, insts[0].Proxy, 3*time.Second, r.Hist, "service on node 0")
	r.Hist.Event("replace the service on node 1")
	insts[1].Stop()
	return r.H.Serve(1, ServiceConfig())
}

// drivePausesAndReplacements drives the workload for 22 s, and on until
// enough holds (see DriveUntil), while, every one to two seconds, a
// service instance of live is paused for half a second to four seconds
// or, one time in four, replaced by a new one on its node; it returns when
// every pause has ended and the history is checked, with the check's
// report.
func drivePausesAndReplacements(t *testing.T, r *Run, live []*Instance, enough func() bool) *Report {
	t.Helper()
	var pauses sync.WaitGroup
	replaced := 0
	r.DriveUntil(t, 22*time.Second, enough, func(ctx context.Context) {
		for i := 0; ctx.Err() == nil; i++ {
			sleepCtx(ctx, time.Second+rand.N(time.Second))
			if ctx.Err() != nil {
				return
			}
			k := rand.IntN(len(live))
			if i%4 != 3 {
				pauseFor(&pauses, live[k].Proxy, 500*time.Millisecond+rand.N(3500*time.Millisecond), r.Hist, "service on node "+itoa(live[k].Node))
				continue
			}
			r.Hist.Event("replace the service on node %d", live[k].Node)
			live[k].Stop()
			live[k] = r.H.Serve(live[k].Node, ServiceConfig())
			replaced++
		}
	})
	pauses.Wait()
	t.Logf("%d instances replaced", replaced+1)
	return r.Check(t, CheckOptions{Status: true})
}

// pauseFor pauses p now and resumes it after d, in a goroutine counted in
// wg.
func pauseFor(wg *sync.WaitGroup, p *Proxy, d time.Duration, h *History, what string) {
	h.Event("pause %s for %v", what, d.Round(time.Millisecond))
	p.Pause()
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(d)
		p.Resume()
		h.Event("resume %s", what)
	}()
}
