package faulttest

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/testenv"
)

// The scenarios of the design input. Each runs the workload under one kind
// of fault and checks the whole history; most also play the fault once
// deterministically and assert its specific outcome.

// An acquire whose reply is lost after the grant committed is retried
// with the same request id: the same lease comes back, through any
// instance and across a leader change; once it has ended, lease_lost.
func TestResponseLostAfterCommit(t *testing.T) {
	t.Parallel()
	r := NewRun(t, func(w *Workload) { w.DropReply = 0.5 })
	nc0, _ := r.H.Connect(0, "probe-0")
	nc2, _ := r.H.Connect(2, "probe-2")
	// b is a's process again, on another connection (another node): the
	// same owner, as a retry of the same logical acquire must be.
	a := &Caller{NC: nc2, H: r.Hist, Client: 1000}
	b := &Caller{NC: nc0, H: r.Hist, Client: 1001, Owner: ownerOf(1000)}
	const ttl = 5 * time.Second

	committed := func(c *Caller, res string) uint64 {
		var tok uint64
		testenv.Eventually(t, 10*time.Second, func() bool {
			st := c.Status(res)
			tok = st.Token
			return st.Result == OK && st.Flag
		}, "the dropped acquire of %s never committed", res)
		return tok
	}
	a.AcquireDropReply("lost/1", "r1", ttl)
	tok := committed(a, "lost/1")
	first := a.Acquire("lost/1", "r1", ttl, 0, true)
	if first.Result != OK || first.Token != tok {
		t.Fatalf("retry after a lost reply: %v, want the lease with token %d", &first, tok)
	}
	again := b.Acquire("lost/1", "r1", ttl, 0, true)
	if err := r.H.StepDown(); err != nil {
		t.Fatal(err)
	}
	after := b.Acquire("lost/1", "r1", ttl, 0, true)
	for _, op := range []Op{again, after} {
		if op.Result != OK || op.LeaseID != first.LeaseID || op.Token != tok {
			t.Fatalf("retry: %v, want lease %s token %d", &op, short(first.LeaseID), tok)
		}
	}
	if rel := a.Release("lost/1", first.LeaseID); rel.Result != OK || !rel.Flag {
		t.Fatalf("release: %v", &rel)
	}
	if op := b.Acquire("lost/1", "r1", ttl, 0, true); op.Result != Fail || op.Code != "lease_lost" {
		t.Fatalf("retry after release: %v, want lease_lost", &op)
	}
	// The same with a cancel in place of the release, and a lost reply to
	// the cancel.
	a.AcquireDropReply("lost/2", "r2", ttl)
	committed(a, "lost/2")
	if c := b.Cancel("lost/2", "r2"); c.Result != OK || !c.Flag {
		t.Fatalf("cancel: %v", &c)
	}
	if op := a.Acquire("lost/2", "r2", ttl, 0, true); op.Result != Fail || op.Code != "lease_lost" {
		t.Fatalf("retry after cancel: %v, want lease_lost", &op)
	}
	if st := a.Status("lost/2"); st.Flag {
		t.Fatalf("cancelled request still holds: %v", &st)
	}

	r.DriveUntil(t, 16*time.Second, r.atLeast(20, "acquire/ok"), func(ctx context.Context) {
		every(ctx, 3*time.Second, func() { _ = r.H.StepDown() })
	})
	rep := r.Check(t, CheckOptions{Status: true})
	if rep.Counts["acquire/ok"] < 20 {
		t.Errorf("only %d grants", rep.Counts["acquire/ok"])
	}
}

// A client paused past its TTL (its connection frozen) loses the lease to
// another; when it wakes, its delayed renewal is refused and its write
// with the old token is rejected by the fenced register.
func TestClientPausedPastTTL(t *testing.T) {
	t.Parallel()
	r := NewRun(t, nil)
	ncA, pA := r.H.Connect(0, "paused")
	ncB, _ := r.H.Connect(1, "next")
	a := &Caller{NC: ncA, H: r.Hist, Client: 1000, Timeout: 15 * time.Second}
	b := &Caller{NC: ncB, H: r.Hist, Client: 1001}
	const ttl = 2 * time.Second

	la := a.Acquire("paused/1", "a", ttl, 0, false)
	if la.Result != OK || !r.Reg.Write(1000, "paused/1", la.Token, "") {
		t.Fatalf("acquire: %v", &la)
	}
	pA.Pause()
	renewed := make(chan Op, 1)
	go func() { renewed <- a.Renew("paused/1", la.LeaseID, ttl) }()
	var lb Op
	testenv.Eventually(t, 15*time.Second, func() bool {
		lb = b.Acquire("paused/1", "b", ttl, 0, false)
		return lb.Result == OK
	}, "the paused client's lease never expired")
	if lb.Complete < la.Deadline {
		t.Fatalf("granted at %v, before the paused holder's deadline %v", lb.Complete, la.Deadline)
	}
	if lb.Token <= la.Token || !r.Reg.Write(1001, "paused/1", lb.Token, "") {
		t.Fatalf("new holder: %v after %v", &lb, &la)
	}
	time.Sleep(500 * time.Millisecond)
	pA.Resume()
	if op := <-renewed; op.Result == OK {
		t.Fatalf("the paused client's delayed renewal succeeded: %v", &op)
	}
	if r.Reg.Write(1000, "paused/1", la.Token, "after the pause") {
		t.Fatal("the register accepted the paused client's stale token")
	}
	b.Release("paused/1", lb.LeaseID)

	driveClientPauses(t, r, 18*time.Second, nil)
}

// Delayed stale writes, at both ends. At the resource: a write prepared
// under a lease and delivered after the next holder's is rejected by the
// fence. At the service: an instance frozen mid-request (its store writes
// held in its proxy, its view of the bucket going stale) wakes up and
// delivers its compare-and-set writes late; none of them may take effect
// over newer state.
func TestDelayedStaleWrite(t *testing.T) {
	t.Parallel()
	r := NewRun(t, func(w *Workload) { w.StaleWrite = 0.5 })
	nc, _ := r.H.Connect(0, "probe")
	c := &Caller{NC: nc, H: r.Hist, Client: 1000}
	const ttl = time.Second
	la := c.Acquire("stale/1", "a", ttl, 0, false)
	if la.Result != OK {
		t.Fatalf("acquire: %v", &la)
	}
	var lb Op
	testenv.Eventually(t, 10*time.Second, func() bool {
		lb = c.Acquire("stale/1", "b", ttl, 0, false)
		return lb.Result == OK
	}, "the first lease never expired")
	if !r.Reg.Write(1000, "stale/1", lb.Token, "") {
		t.Fatal("the new holder's write was rejected")
	}
	if r.Reg.Write(1000, "stale/1", la.Token, "delayed write of the expired lease") {
		t.Fatal("the register accepted a delayed write with a stale token")
	}

	insts := r.H.Instances()
	var pauses sync.WaitGroup
	r.Drive(t, 20*time.Second, func(ctx context.Context) {
		every(ctx, 1500*time.Millisecond, func() {
			i := rand.IntN(len(insts))
			pauseFor(&pauses, insts[i].Proxy, 500*time.Millisecond+rand.N(4*time.Second), r.Hist, "service on node "+itoa(insts[i].Node))
		})
	})
	pauses.Wait()
	r.Check(t, CheckOptions{Status: true})
}

// One replica isolated at a time, a follower or the stream leader: the
// other two keep serving, and nothing breaks when it returns.
func TestOneReplicaIsolated(t *testing.T) {
	t.Parallel()
	r := NewRun(t, nil)
	var mu sync.Mutex // isolated is read by the condition of DriveUntil
	var isolated []Window
	grantsIsolated := func() int {
		mu.Lock()
		defer mu.Unlock()
		ops, n := r.Hist.Ops(), 0
		for _, w := range isolated {
			n += within(ops, KAcquire, OK, w)
		}
		return n
	}
	enough := all(r.atLeast(20, "acquire/ok"), func() bool { return grantsIsolated() > 0 })
	r.DriveUntil(t, 24*time.Second, enough, func(ctx context.Context) {
		for i := 0; ctx.Err() == nil; i++ {
			from := r.Hist.Now()
			if i%2 == 0 {
				r.H.Isolate((r.H.C.StreamLeader(lockStream) + 1 + rand.IntN(2)) % 3)
			} else if _, err := r.H.IsolateLeader(); err != nil {
				t.Logf("isolate leader: %v", err)
			}
			sleepCtx(ctx, 4*time.Second)
			mu.Lock()
			isolated = append(isolated, Window{From: from, To: r.Hist.Now()})
			mu.Unlock()
			r.H.Heal()
			r.H.WaitCurrent(10 * time.Second)
		}
	})
	rep := r.Check(t, CheckOptions{Status: true})
	grants := grantsIsolated()
	t.Logf("%d grants while a replica was isolated", grants)
	if grants == 0 || rep.Counts["acquire/ok"] < 20 {
		t.Errorf("the majority side did not keep serving: %d grants while isolated, %d in all", grants, rep.Counts["acquire/ok"])
	}
}

// Every node cut off from the others: no side has a quorum, so no lease
// is granted and no renewal succeeds anywhere; service resumes on heal.
func TestMajorityIsolated(t *testing.T) {
	t.Parallel()
	r := NewRun(t, nil)
	var cut Window
	// triedIn counts the acquires and renewals tried and answered (or
	// given up on) inside w.
	triedIn := func(w Window) int {
		var ops []Op
		for _, o := range r.Hist.Ops() {
			if o.Code != "pending" { // still under way: counted once it ends
				ops = append(ops, o)
			}
		}
		n := 0
		for _, k := range []Kind{KAcquire, KRenew} {
			for _, res := range []Result{Fail, Unknown} {
				n += within(ops, k, res, w)
			}
		}
		return n
	}
	r.Drive(t, 20*time.Second, func(ctx context.Context) {
		sleepCtx(ctx, 4*time.Second)
		r.H.IsolateAll() // returns once no route crosses the partition
		cut.From = r.Hist.Now()
		sleepCtx(ctx, 7*time.Second)
		// The partition lasts until the workload has tried it: on a busy
		// machine the first attempts may still be under way.
		for end := time.Now().Add(60 * time.Second); triedIn(Window{From: cut.From, To: r.Hist.Now()}) == 0 && time.Now().Before(end); {
			time.Sleep(250 * time.Millisecond)
		}
		cut.To = r.Hist.Now()
		r.H.Heal()
	})
	rep := r.Check(t, CheckOptions{Status: true, NoQuorum: []Window{cut}})
	ops := r.Hist.Ops()
	tried := triedIn(cut)
	after := within(ops, KAcquire, OK, Window{From: cut.To, To: r.Hist.Now()})
	t.Logf("without quorum: %d acquires and renewals tried, none succeeded; %d grants after healing", tried, after)
	if tried == 0 {
		t.Errorf("the partition was not exercised (%d tried)", tried)
	}
	if after == 0 {
		// The workload's window can close before the healed cluster has
		// elected its leaders on a busy machine: probe until it serves.
		nc, _ := r.H.Connect(0, "probe")
		c := &Caller{NC: nc, H: NewHistory(), Client: 1 << 20}
		testenv.Eventually(t, 30*time.Second, func() bool {
			return c.Acquire("probe/after-heal", "probe", 5*time.Second, 0, true).Result == OK
		}, "service did not resume after healing")
	}
	if rep.Counts["acquire/ok"] == 0 {
		t.Error("no grants at all")
	}
}

// The stream leader moves every two seconds or so while the workload runs.
func TestRepeatedLeaderChanges(t *testing.T) {
	t.Parallel()
	r := NewRun(t, nil)
	if rep := driveLeaderChanges(t, r, r.atLeast(20, "acquire/ok")); rep.Counts["acquire/ok"] < 20 {
		t.Errorf("%d grants", rep.Counts["acquire/ok"])
	}
}

// Waiters cancelled while the stream leader fails over: once a cancel is
// answered the request holds nothing and waits for nothing (a grant that
// raced the cancel is already released), the remaining waiters are
// answered, and the queue ends empty.
func TestWaiterCancelDuringFailover(t *testing.T) {
	t.Parallel()
	r := NewRun(t, func(w *Workload) { w.WaitShare, w.CancelShare = 0.6, 0.5 })
	nc, _ := r.H.Connect(1, "holder")
	holder := &Caller{NC: nc, H: r.Hist, Client: 1000}
	const res, ttl = "queue/1", 4 * time.Second
	lh := holder.Acquire(res, "holder", ttl, 0, false)
	if lh.Result != OK {
		t.Fatalf("acquire: %v", &lh)
	}
	const n = 6
	waiters := make([]*Caller, n)
	results := make(chan Op, n)
	for i := range waiters {
		wc, _ := r.H.Connect(i%3, "waiter")
		waiters[i] = &Caller{NC: wc, H: r.Hist, Client: 1001 + i, Timeout: 5 * time.Second}
		go func() { results <- waitAsAClientWould(waiters[i], res, "w"+itoa(i), ttl) }()
	}
	var cancellers [3]*Caller
	for node := range cancellers {
		cc, _ := r.H.Connect(node, "canceller")
		cancellers[node] = &Caller{NC: cc, H: r.Hist, Client: 1100 + node}
	}
	// Every waiter queued before the failover.
	testenv.Eventually(t, 30*time.Second, func() bool { return statusWaiters(holder, res) == n }, "%d waiters on %s", n, res)
	old, err := r.H.IsolateLeader()
	if err != nil {
		t.Fatal(err)
	}
	// Cancel from the majority side: a caller on the isolated node reaches
	// only the instance there, which has no quorum.
	canceller := cancellers[(old+1)%3]
	for i := 0; i < n/2; i++ {
		var op Op
		canceller.Owner = ownerOf(1001 + i) // waiter i's: a cancel is its acquirer's
		testenv.Eventually(t, 20*time.Second, func() bool {
			op = canceller.Cancel(res, "w"+itoa(i))
			return op.Result != Unknown
		}, "cancel during failover never answered")
		if op.Result != OK {
			t.Fatalf("cancel during failover: %v", &op)
		}
	}
	r.H.Heal()
	testenv.Eventually(t, 20*time.Second, func() bool {
		return holder.Release(res, lh.LeaseID).Result == OK
	}, "release after healing never answered")
	granted := 0
	for i := 0; i < n; i++ {
		op := <-results
		cancelled := op.Client-1001 < n/2
		t.Logf("waiter (cancelled %v): %v", cancelled, &op)
		switch {
		case op.Result == OK:
			c := waiters[op.Client-1001]
			rn := c.Renew(res, op.LeaseID, ttl)
			if rn.Result == OK && cancelled {
				t.Errorf("cancelled waiter %s still holds its lease: %v", op.RequestID, &rn)
			}
			// Logged, for a waiter behind it that is not granted: a
			// release that failed leaves the lock held for its TTL.
			rl := c.Release(res, op.LeaseID)
			t.Logf("  then: %v; %v", &rn, &rl)
			if !cancelled {
				granted++
			}
		case cancelled:
		case op.Result == Fail && op.Code == "lease_lost":
			// Its waiter record outlived its liveness window while its
			// instance was cut off (TestKnownBugPausedWaiterAnsweredLeaseLost).
			t.Logf("known issue: waiter %s, never cancelled, answered lease_lost", op.RequestID)
		default:
			t.Errorf("waiter %s, never cancelled, ended with %v", op.RequestID, &op)
		}
	}
	t.Logf("%d of the %d waiters not cancelled were granted", granted, n-n/2)
	testenv.Eventually(t, 15*time.Second, func() bool {
		st := holder.Status(res)
		return st.Result == OK && !st.Flag && statusWaiters(holder, res) == 0
	}, "the queue of %s did not drain", res)

	r.Drive(t, 20*time.Second, func(ctx context.Context) {
		for i := 0; ctx.Err() == nil; i++ {
			if i%2 == 0 {
				_ = r.H.StepDown()
				sleepCtx(ctx, 2*time.Second)
				continue
			}
			if _, err := r.H.IsolateLeader(); err != nil {
				t.Logf("isolate leader: %v", err)
			}
			sleepCtx(ctx, 3*time.Second)
			r.H.Heal()
			r.H.WaitCurrent(10 * time.Second)
		}
	})
	r.Check(t, CheckOptions{Status: true})
}

// The whole cluster crashes twice under load and restarts from its disks:
// the service instances ride it out, leases granted before are honoured
// to their deadlines, and tokens never go back.
func TestWholeClusterCrashRestart(t *testing.T) {
	t.Parallel()
	r := NewRun(t, nil)
	var crashes []Window
	var crashed atomic.Int32 // len(crashes), for the condition of DriveUntil
	enough := all(r.atLeast(30, "acquire/ok"), func() bool { return crashed.Load() >= 2 })
	r.DriveUntil(t, 28*time.Second, enough, func(ctx context.Context) {
		for ctx.Err() == nil {
			sleepCtx(ctx, 4*time.Second)
			if ctx.Err() != nil {
				return
			}
			from := r.Hist.Now()
			r.H.CrashAll()
			time.Sleep(time.Second + rand.N(time.Second))
			r.H.RestartAll()
			crashes = append(crashes, Window{From: from, To: r.Hist.Now()})
			crashed.Add(1)
			t.Logf("crash and restart took %v", (crashes[len(crashes)-1].To - from).Round(time.Millisecond))
		}
	})
	rep := r.Check(t, CheckOptions{Status: true})
	ops := r.Hist.Ops()
	for _, c := range crashes {
		var before, after uint64
		for _, o := range ops {
			if o.Kind != KAcquire || o.Result != OK {
				continue
			}
			if o.Complete < c.From {
				before = max(before, o.Token)
			} else if o.Invoke > c.To && (after == 0 || o.Token < after) {
				after = o.Token
			}
		}
		t.Logf("crash at %v: highest token before %d, lowest after %d", c.From.Round(time.Millisecond), before, after)
		if after != 0 && after <= before {
			t.Errorf("tokens went back across the crash at %v: %d after %d", c.From, after, before)
		}
	}
	if len(crashes) < 2 || rep.Counts["acquire/ok"] < 30 {
		t.Errorf("%d crashes, %d grants", len(crashes), rep.Counts["acquire/ok"])
	}
}

// waitAsAClientWould waits for res in its queue, retrying with the same
// request id while the outcome is unknown (which keeps its place), for at
// most a minute.
func waitAsAClientWould(c *Caller, res, rid string, ttl time.Duration) Op {
	deadline := time.Now().Add(time.Minute)
	retry := false
	for {
		op := c.Acquire(res, rid, ttl, 20*time.Second, retry)
		if op.Result != Unknown || time.Now().After(deadline) {
			return op
		}
		retry = true
		time.Sleep(200 * time.Millisecond)
	}
}
