package faulttest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/testenv"
)

// Scenarios with sessions in the mix. Each plays its fault once on a
// session deterministically and asserts the outcome, then runs the
// workload with session actors under the same kind of fault and checks
// the whole history.

// sessionMix puts session actors into a run's workload, beside fewer raw
// and Go-client actors.
func sessionMix(w *Workload) { w.Raw, w.Go, w.Sessions = 8, 2, 6 }

// answered repeats f while its outcome is unknown, for at most timeout,
// and returns its last operation.
func answered(t *testing.T, timeout time.Duration, what string, f func() Op) Op {
	t.Helper()
	var op Op
	testenv.Eventually(t, timeout, func() bool {
		op = f()
		return op.Result != Unknown
	}, "%s never answered: %v", what, &op)
	return op
}

// keptPast renews a lease just granted after a wait (for the hand-over
// TTL, 5s) to a TTL that outlasts the rest of a scenario however busy the
// machine: what a scenario then checks is that a woken instance takes
// none of it back, not how soon the test renews.
func keptPast(t *testing.T, what string, renew func() Op) {
	t.Helper()
	if op := answered(t, 20*time.Second, what+" renewal after the grant", renew); op.Result != OK {
		t.Errorf("renewal of the %s just granted: %v", what, &op)
	}
}

// mustTake acquires res for c, retrying until granted, and checks that
// the grant came no earlier than after (the previous holder's deadline),
// with a token above prev, and that the register takes its writes.
func mustTake(t *testing.T, r *Run, c *Caller, res, rid string, after time.Duration, prev uint64) Op {
	t.Helper()
	var op Op
	tried := false
	testenv.Eventually(t, 30*time.Second, func() bool {
		op = c.Acquire(res, rid, 5*time.Second, 0, tried)
		tried = true
		return op.Result == OK
	}, "%s never became free: %v", res, &op)
	if op.Complete < after {
		t.Fatalf("%s granted at %v, before the session's deadline %v: %v", res, op.Complete, after, &op)
	}
	if op.Token <= prev || !r.Reg.Write(c.Client, res, op.Token, "") {
		t.Fatalf("%s granted with token %d after %d, or its write was refused: %v", res, op.Token, prev, &op)
	}
	return op
}

// openWith opens a session for c and acquires res... in it, each written
// to once with its token.
func openWith(t *testing.T, r *Run, c *Caller, rid string, ttl time.Duration, res ...string) (Op, []Op) {
	t.Helper()
	open := c.OpenSession(rid, ttl, false)
	if open.Result != OK || open.TTL != ttl {
		t.Fatalf("open: %v", &open)
	}
	var held []Op
	for i, name := range res {
		l := c.AcquireIn(name, fmt.Sprintf("%s-%d", rid, i), open.Session, 0, false)
		if l.Result != OK || l.TTL != ttl || !r.Reg.Write(c.Client, name, l.Token, "session") {
			t.Fatalf("acquire %s in the session: %v", name, &l)
		}
		held = append(held, l)
	}
	return open, held
}

// A client paused (its connection frozen) past its session's TTL loses the
// session and every lease in it: each is granted to another, no earlier
// than the session's deadline and with a larger token; when it wakes, its
// delayed keepalive is refused, so is an acquire in the session, its close
// finds the session ended, and the register rejects its writes with the old
// tokens. Then the workload runs with sessions while clients are paused at
// random, often past their sessions' TTLs.
func TestSessionClientPausedPastTTL(t *testing.T) {
	t.Parallel()
	r := NewRun(t, sessionMix)
	ncA, pA := r.H.Connect(0, "paused")
	ncB, _ := r.H.Connect(1, "next")
	a := &Caller{NC: ncA, H: r.Hist, Client: 1000, Timeout: 15 * time.Second}
	b := &Caller{NC: ncB, H: r.Hist, Client: 1001}
	const ttl = 2 * time.Second
	res := []string{"spaused/0", "spaused/1", "spaused/2"}
	open, held := openWith(t, r, a, "sp", ttl, res...)
	k := a.Keepalive(open.Session)
	if k.Result != OK {
		t.Fatalf("keepalive: %v", &k)
	}
	pA.Pause()
	r.Hist.Event("pause client 1000")
	kept := make(chan Op, 1)
	go func() { kept <- a.Keepalive(open.Session) }()
	var next []Op
	for i, name := range res {
		next = append(next, mustTake(t, r, b, name, "b"+itoa(i), k.Deadline, held[i].Token))
	}
	time.Sleep(500 * time.Millisecond)
	pA.Resume()
	r.Hist.Event("resume client 1000")
	if op := <-kept; op.Result == OK {
		t.Fatalf("the paused client's delayed keepalive succeeded: %v", &op)
	}
	for i, name := range res {
		if r.Reg.Write(1000, name, held[i].Token, "after the pause") {
			t.Fatalf("the register accepted the paused client's stale token on %s", name)
		}
	}
	if op := answered(t, 20*time.Second, "acquire in the lost session", func() Op {
		return a.AcquireIn("spaused/3", "sp-late", open.Session, 0, false)
	}); op.Result != Fail || op.Code != "lease_lost" {
		t.Fatalf("acquire in the lost session: %v, want lease_lost", &op)
	}
	if op := answered(t, 20*time.Second, "close", func() Op { return a.CloseSession(open.Session) }); op.Result != OK || op.Flag {
		t.Fatalf("close of the lost session: %v, want closed:false", &op)
	}
	for i, name := range res {
		b.Release(name, next[i].LeaseID)
	}

	rep := driveClientPauses(t, r, 20*time.Second, sessionActivity(r))
	checkSessionActivity(t, rep, &r.W.sessStats)
}

// A session no longer kept alive expires while the service fails over:
// around its expiry, the instance on one node is paused and the one on
// another replaced (the new one knows the session only from the bucket).
// The remaining instance ends it: its leases go to a waiter, no earlier
// than the session's deadline and with larger tokens, and what the paused
// instance does when it wakes (its view of the session is stale) takes
// none of them back. Then the workload runs with sessions while instances
// are paused and replaced at random.
func TestSessionExpiryDuringServiceFailover(t *testing.T) {
	t.Parallel()
	r := NewRun(t, sessionMix)
	insts := r.H.Instances()
	ncA, _ := r.H.Connect(0, "session holder")
	ncB, _ := r.H.Connect(2, "waiter")
	a := &Caller{NC: ncA, H: r.Hist, Client: 1000}
	b := &Caller{NC: ncB, H: r.Hist, Client: 1001, Timeout: 15 * time.Second}
	const ttl = 2 * time.Second
	res := []string{"sfailover/0", "sfailover/1", "sfailover/2"}
	open, held := openWith(t, r, a, "sf", ttl, res...)
	var pauses sync.WaitGroup
	repl := failOverAround(r, insts, open.Deadline, &pauses)
	var next []Op
	for i, name := range res {
		op := answered(t, 60*time.Second, "waiting acquire", func() Op {
			return b.Acquire(name, "b"+itoa(i), 5*time.Second, 10*time.Second, true)
		})
		if op.Result != OK {
			t.Fatalf("waiting for %s: %v", name, &op)
		}
		if op.Complete < open.Deadline || op.Token <= held[i].Token || !r.Reg.Write(1001, name, op.Token, "") {
			t.Fatalf("%s granted at %v (session deadline %v) with token %d (session's %d), or its write refused: %v",
				name, op.Complete, open.Deadline, op.Token, held[i].Token, &op)
		}
		keptPast(t, name, func() Op { return b.Renew(name, op.LeaseID, 30*time.Second) })
		next = append(next, op)
	}
	pauses.Wait()
	time.Sleep(time.Second) // what the woken instance had held is delivered
	for i, name := range res {
		if op := answered(t, 20*time.Second, "renewal", func() Op { return b.Renew(name, next[i].LeaseID, 5*time.Second) }); op.Result != OK {
			t.Fatalf("the new holder of %s lost its lease after the paused instance woke: %v", name, &op)
		}
		if r.Reg.Write(1000, name, held[i].Token, "the expired session's token") {
			t.Fatalf("the register accepted the expired session's token on %s", name)
		}
	}
	if op := answered(t, 20*time.Second, "keepalive", func() Op { return a.Keepalive(open.Session) }); op.Result != Fail || op.Code != "lease_lost" {
		t.Fatalf("keepalive of the expired session: %v, want lease_lost", &op)
	}
	for i, name := range res {
		b.Release(name, next[i].LeaseID)
	}

	rep := drivePausesAndReplacements(t, r, []*Instance{insts[0], repl, insts[2]}, sessionActivity(r))
	checkSessionActivity(t, rep, &r.W.sessStats)
}

// Sessions across stream leader changes: a session opened before a
// step-down is kept alive and acquires after it; closed after another,
// it releases every lease it held (each is free for another at once), and
// a second close finds it ended. Then the workload runs with sessions
// while the stream leader moves every two seconds or so.
func TestSessionsAcrossLeaderChanges(t *testing.T) {
	t.Parallel()
	r := NewRun(t, sessionMix)
	ncA, _ := r.H.Connect(0, "session holder")
	ncB, _ := r.H.Connect(1, "next")
	a := &Caller{NC: ncA, H: r.Hist, Client: 1000}
	b := &Caller{NC: ncB, H: r.Hist, Client: 1001}
	const ttl = 4 * time.Second
	res := []string{"sleader/0", "sleader/1", "sleader/2", "sleader/3"}
	open, held := openWith(t, r, a, "sl", ttl, res[:3]...)
	if err := r.H.StepDown(); err != nil {
		t.Fatal(err)
	}
	if op := answered(t, 20*time.Second, "keepalive", func() Op { return a.Keepalive(open.Session) }); op.Result != OK {
		t.Fatalf("keepalive after a leader change: %v", &op)
	}
	l := answered(t, 20*time.Second, "acquire", func() Op { return a.AcquireIn(res[3], "sl-3", open.Session, 0, true) })
	if l.Result != OK {
		t.Fatalf("acquire in the session after a leader change: %v", &l)
	}
	held = append(held, l)
	if err := r.H.StepDown(); err != nil {
		t.Fatal(err)
	}
	c := answered(t, 20*time.Second, "close", func() Op { return a.CloseSession(open.Session) })
	if c.Result != OK || !c.Flag || c.Note != "released=4" {
		t.Fatalf("close after a leader change: %v, want closed:true, released=4", &c)
	}
	for i, name := range res {
		lb := answered(t, 20*time.Second, "acquire", func() Op { return b.Acquire(name, "b"+itoa(i), 5*time.Second, 0, true) })
		if lb.Result != OK || lb.Token <= held[i].Token {
			t.Fatalf("%s after the session's close: %v, want a grant with a token above %d", name, &lb, held[i].Token)
		}
		b.Release(name, lb.LeaseID)
	}
	if op := answered(t, 20*time.Second, "close", func() Op { return a.CloseSession(open.Session) }); op.Result != OK || op.Flag {
		t.Fatalf("second close: %v, want closed:false", &op)
	}

	rep := driveLeaderChanges(t, r, sessionActivity(r))
	checkSessionActivity(t, rep, &r.W.sessStats)
}

// What a run of sessions must have done for its check to mean much:
// grants of single resources, of lock sets and of permits in sessions,
// keepalives and closes.
const minSessionGrants, minSessionSets, minSessionPermits, minKeepalives, minCloses = 10, 2, 2, 10, 3

// sessionActivity is the condition for DriveUntil that a run's session
// actors have done enough.
func sessionActivity(r *Run) func() bool {
	s := &r.W.sessStats
	return all(r.atLeast(minSessionGrants, "session-acquire/ok"), r.atLeast(minSessionSets, "session-set-acquire/ok"),
		r.atLeast(minSessionPermits, "session-permit-acquire/ok"), r.atLeast(minKeepalives, "keepalive/ok"),
		func() bool { return s.closed.Load()+s.closedInFlight.Load() >= minCloses })
}

// checkSessionActivity fails a run whose session actors did too little for
// its check to mean much.
func checkSessionActivity(t *testing.T, rep *Report, s *sessionStats) {
	t.Helper()
	grants, sets, permits := rep.Counts["session-acquire/ok"], rep.Counts["session-set-acquire/ok"], rep.Counts["session-permit-acquire/ok"]
	closes := s.closed.Load() + s.closedInFlight.Load()
	if grants < minSessionGrants || sets < minSessionSets || permits < minSessionPermits || rep.Counts["keepalive/ok"] < minKeepalives || closes < minCloses {
		t.Errorf("sessions were hardly exercised: %d grants in sessions (%d of lock sets, %d of permits), %d keepalives, %d closes",
			grants, sets, permits, rep.Counts["keepalive/ok"], closes)
	}
}
