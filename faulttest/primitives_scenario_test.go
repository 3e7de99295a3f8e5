package faulttest

import (
	"sync"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// Scenarios with lock sets, semaphores and elections in the mix. Each
// plays its fault once on a set, a permit and a leadership
// deterministically and asserts the outcome, then runs the workload with
// actors of sets, semaphores and elections under the same kind of fault
// and checks the whole history, the election events and the bucket's
// writes.

// primitivesMix puts actors of sets, semaphores and elections into a
// run's workload, beside a few raw actors and one Go client.
func primitivesMix(w *Workload) {
	w.Raw, w.Go, w.Sets, w.Sems, w.Candidates, w.Elections = 4, 1, 5, 5, 5, 2
}

const scenarioLimit = 3

// tokensOf maps each resource of a set grant or renewal to its token.
func tokensOf(op Op) map[string]uint64 {
	out := map[string]uint64{}
	for _, m := range op.Members {
		out[m.Resource] = m.Token
	}
	return out
}

// writeEach writes to each resource of a set grant with its own token and
// reports whether the register accepted every write.
func writeEach(r *Run, client int, op Op, note string) bool {
	ok := true
	for _, m := range op.Members {
		ok = r.Reg.Write(client, m.Resource, m.Token, note) && ok
	}
	return ok
}

// rejectsShared reports whether the register refused a write with the
// token of set grant op to every resource that the later set grant next
// took over (and wrote to).
func rejectsShared(r *Run, client int, op, next Op, note string) bool {
	taken := tokensOf(next)
	for _, m := range op.Members {
		if _, ok := taken[m.Resource]; ok && r.Reg.Write(client, m.Resource, m.Token, note) {
			return false
		}
	}
	return true
}

// waitAnswered sends a waiting acquire (send, retried with the same
// request id) until its outcome is known, for at most a minute, as a
// client would: a retry keeps the waiter's place.
func waitAnswered(send func(retry bool) Op) Op {
	deadline := time.Now().Add(time.Minute)
	retry := false
	for {
		op := send(retry)
		if op.Result != Unknown || time.Now().After(deadline) {
			return op
		}
		retry = true
		time.Sleep(200 * time.Millisecond)
	}
}

// waitEvent waits until the observer has recorded an event of kind for
// token on res, and returns it.
func waitEvent(t *testing.T, r *Run, res, kind string, token uint64) Op {
	t.Helper()
	var ev Op
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, o := range r.Hist.Ops() {
			if o.Kind == KEvent && o.Resource == res && o.Event == kind && o.Token == token {
				ev = o
				return true
			}
		}
		return false
	}, "no %s event for token %d of %s", kind, token, res)
	return ev
}

// setTaken checks a set grant that had to wait for an earlier one: no
// earlier than after (the earlier holder's deadline), each shared
// resource with a token above the earlier one's, every write accepted.
func setTaken(t *testing.T, r *Run, op, prev Op, after time.Duration) {
	t.Helper()
	if op.Result != OK || len(op.Members) != len(sortedSet(op.Resources)) {
		t.Fatalf("set acquire: %v", &op)
	}
	if op.Complete < after {
		t.Fatalf("set granted at %v, before the earlier holder's deadline %v: %v", op.Complete, after, &op)
	}
	before := tokensOf(prev)
	for res, tok := range tokensOf(op) {
		if p, ok := before[res]; ok && tok <= p {
			t.Fatalf("%s granted with token %d after %d: %v", res, tok, p, &op)
		}
	}
	if !writeEach(r, op.Client, op, "") {
		t.Fatalf("the register refused the new set holder's writes: %v", &op)
	}
}

// A client paused (its connection frozen) past its TTL while it holds a
// lock set, a permit and an election's leadership loses all three: the
// overlapping set waited for is granted once its deadline has passed,
// with larger tokens on the resources they share; a waiter gets its
// permit, with a larger token; the next candidate is elected, and the
// observer sees the old leader's end and the new one's election. When it
// wakes, its delayed renewals are refused and the register refuses its
// writes with each old token. Then the workload runs with sets, semaphores
// and elections while clients are paused at random, often past their TTL.
func TestPrimitivesClientPausedPastTTL(t *testing.T) {
	t.Parallel()
	r := NewRun(t, primitivesMix)
	ncA, pA := r.H.Connect(0, "paused")
	ncB, _ := r.H.Connect(1, "next")
	a := &Caller{NC: ncA, H: r.Hist, Client: 1000, Timeout: 15 * time.Second}
	b := &Caller{NC: ncB, H: r.Hist, Client: 1001, Timeout: 15 * time.Second}
	const ttl = 2 * time.Second
	const sem, elect = "ppaused/sem", "ppaused/elect"

	setA := a.AcquireSet([]string{"ppaused/2", "ppaused/0", "ppaused/1"}, "a-set", ttl, 0, false)
	if setA.Result != OK || !writeEach(r, 1000, setA, "") {
		t.Fatalf("set acquire: %v", &setA)
	}
	var others []Op
	for i := 0; i < scenarioLimit-1; i++ {
		o := b.AcquirePermit(sem, scenarioLimit, "other-"+itoa(i), 20*time.Second, 0, false)
		if o.Result != OK {
			t.Fatalf("permit: %v", &o)
		}
		others = append(others, o)
	}
	permA := a.AcquirePermit(sem, scenarioLimit, "a-permit", ttl, 0, false)
	keyA := streams.PermitResource(sem, permA.Permit)
	if permA.Result != OK || !r.Reg.Write(1000, keyA, permA.Token, "") {
		t.Fatalf("permit: %v", &permA)
	}
	leadA := a.Campaign(elect, "a-leader", "a:1", ttl, 0, false)
	if leadA.Result != OK || !r.Reg.Write(1000, elect, leadA.Token, "") {
		t.Fatalf("campaign: %v", &leadA)
	}
	waitEvent(t, r, elect, streams.EventElected, leadA.Token)
	deadline := min(setA.Deadline, permA.Deadline, leadA.Deadline)

	pA.Pause()
	r.Hist.Event("pause client 1000")
	delayed := make(chan Op, 3)
	go func() { delayed <- a.RenewSet(setA.Resources, setA.LeaseID, ttl) }()
	go func() { delayed <- a.RenewPermit(sem, permA.Permit, permA.LeaseID, ttl) }()
	go func() { delayed <- a.Proclaim(elect, leadA.LeaseID, "a:2", ttl) }()
	var setB, permB, leadB Op
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		setB = waitAnswered(func(retry bool) Op {
			return b.AcquireSet([]string{"ppaused/3", "ppaused/1", "ppaused/2"}, "b-set", 5*time.Second, 10*time.Second, retry)
		})
	}()
	go func() {
		defer wg.Done()
		permB = waitAnswered(func(retry bool) Op {
			return b.AcquirePermit(sem, scenarioLimit, "b-permit", 5*time.Second, 10*time.Second, retry)
		})
	}()
	go func() {
		defer wg.Done()
		leadB = waitAnswered(func(retry bool) Op { return b.Campaign(elect, "b-leader", "b:1", 5*time.Second, 10*time.Second, retry) })
	}()
	wg.Wait()
	setTaken(t, r, setB, setA, setA.Deadline)
	if permB.Result != OK || permB.Permit != permA.Permit || permB.Complete < permA.Deadline || permB.Token <= permA.Token ||
		!r.Reg.Write(1001, keyA, permB.Token, "") {
		t.Fatalf("the waiter's permit: %v, after the paused holder's %v", &permB, &permA)
	}
	if leadB.Result != OK || leadB.Complete < leadA.Deadline || leadB.Token <= leadA.Token || !r.Reg.Write(1001, elect, leadB.Token, "") {
		t.Fatalf("the next candidate: %v, after the paused leader %v", &leadB, &leadA)
	}
	waitEvent(t, r, elect, streams.EventEnded, leadA.Token)
	waitEvent(t, r, elect, streams.EventElected, leadB.Token)
	time.Sleep(500 * time.Millisecond)
	pA.Resume()
	r.Hist.Event("resume client 1000")
	for i := 0; i < 3; i++ {
		if op := <-delayed; op.Result == OK {
			t.Fatalf("a renewal delayed past the deadline %v succeeded: %v", deadline, &op)
		}
	}
	if !rejectsShared(r, 1000, setA, setB, "after the pause") || r.Reg.Write(1000, keyA, permA.Token, "after the pause") ||
		r.Reg.Write(1000, elect, leadA.Token, "after the pause") {
		t.Fatal("the register accepted a stale token of the paused client")
	}
	if op := a.ReleaseSet(setA.Resources, setA.LeaseID); op.Result != OK || op.Flag {
		t.Fatalf("release of the lost set: %v, want released:false", &op)
	}
	b.ReleaseSet(setB.Resources, setB.LeaseID)
	b.ReleasePermit(sem, permB.Permit, permB.LeaseID)
	for _, o := range others {
		b.ReleasePermit(sem, o.Permit, o.LeaseID)
	}
	b.Release(elect, leadB.LeaseID)

	rep := driveClientPauses(t, r, 20*time.Second, primitiveActivity(r))
	checkPrimitiveActivity(t, r, rep)
}

// A lock set, a permit and a leadership no longer renewed expire while
// the service fails over: around their expiry, the instance on one node is
// paused and the one on another replaced (the new one knows them only from
// the bucket). The remaining instance ends them: the set whole (the
// overlapping set waiting for it is granted, no earlier than its
// deadline and with larger tokens), the permit to its waiter, the
// leadership to the next candidate; what the paused instance does when it
// wakes takes none of them back. Then the workload runs with sets,
// semaphores and elections while instances are paused and replaced at
// random.
func TestPrimitivesExpiryDuringServiceFailover(t *testing.T) {
	t.Parallel()
	r := NewRun(t, primitivesMix)
	insts := r.H.Instances()
	ncA, _ := r.H.Connect(0, "holder")
	ncB, _ := r.H.Connect(2, "waiter")
	a := &Caller{NC: ncA, H: r.Hist, Client: 1000}
	b := &Caller{NC: ncB, H: r.Hist, Client: 1001, Timeout: 15 * time.Second}
	const ttl = 2 * time.Second
	const sem, elect = "pfailover/sem", "pfailover/elect"

	setA := a.AcquireSet([]string{"pfailover/0", "pfailover/1", "pfailover/2", "pfailover/3"}, "a-set", ttl, 0, false)
	if setA.Result != OK || !writeEach(r, 1000, setA, "") {
		t.Fatalf("set acquire: %v", &setA)
	}
	var perms []Op
	for i := 0; i < scenarioLimit; i++ {
		p := a.AcquirePermit(sem, scenarioLimit, "a-permit-"+itoa(i), ttl, 0, false)
		if p.Result != OK || !r.Reg.Write(1000, streams.PermitResource(sem, p.Permit), p.Token, "") {
			t.Fatalf("permit: %v", &p)
		}
		perms = append(perms, p)
	}
	leadA := a.Campaign(elect, "a-leader", "a:1", ttl, 0, false)
	if leadA.Result != OK || !r.Reg.Write(1000, elect, leadA.Token, "") {
		t.Fatalf("campaign: %v", &leadA)
	}
	var pauses sync.WaitGroup
	repl := failOverAround(r, insts, setA.Deadline, &pauses)
	var setB, permB, leadB Op
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		setB = answered(t, 60*time.Second, "waiting set", func() Op {
			return b.AcquireSet([]string{"pfailover/3", "pfailover/4", "pfailover/1"}, "b-set", 5*time.Second, 10*time.Second, true)
		})
		if setB.Result == OK {
			keptPast(t, "set", func() Op { return b.RenewSet(setB.Resources, setB.LeaseID, 30*time.Second) })
		}
	}()
	go func() {
		defer wg.Done()
		permB = answered(t, 60*time.Second, "waiting permit", func() Op {
			return b.AcquirePermit(sem, scenarioLimit, "b-permit", 5*time.Second, 10*time.Second, true)
		})
		if permB.Result == OK {
			keptPast(t, "permit", func() Op { return b.RenewPermit(sem, permB.Permit, permB.LeaseID, 30*time.Second) })
		}
	}()
	go func() {
		defer wg.Done()
		leadB = answered(t, 60*time.Second, "campaign", func() Op {
			return b.Campaign(elect, "b-leader", "b:1", 5*time.Second, 10*time.Second, true)
		})
		if leadB.Result == OK {
			keptPast(t, "leadership", func() Op { return b.Proclaim(elect, leadB.LeaseID, "b:1", 30*time.Second) })
		}
	}()
	wg.Wait()
	setTaken(t, r, setB, setA, setA.Deadline)
	if permB.Result != OK || permB.Complete < perms[0].Deadline || !r.Reg.Write(1001, streams.PermitResource(sem, permB.Permit), permB.Token, "") {
		t.Fatalf("the waiter's permit: %v", &permB)
	}
	for _, p := range perms {
		if p.Permit == permB.Permit && permB.Token <= p.Token {
			t.Fatalf("permit %d granted with token %d after %d", p.Permit, permB.Token, p.Token)
		}
	}
	if leadB.Result != OK || leadB.Complete < leadA.Deadline || leadB.Token <= leadA.Token || !r.Reg.Write(1001, elect, leadB.Token, "") {
		t.Fatalf("the next candidate: %v, after the leader %v", &leadB, &leadA)
	}
	waitEvent(t, r, elect, streams.EventElected, leadB.Token)
	pauses.Wait()
	time.Sleep(time.Second) // what the woken instance had held is delivered
	if op := answered(t, 20*time.Second, "set renewal", func() Op { return b.RenewSet(setB.Resources, setB.LeaseID, 5*time.Second) }); op.Result != OK {
		t.Fatalf("the new holder lost its set after the paused instance woke: %v", &op)
	}
	if op := answered(t, 20*time.Second, "permit renewal", func() Op { return b.RenewPermit(sem, permB.Permit, permB.LeaseID, 5*time.Second) }); op.Result != OK {
		t.Fatalf("the new holder lost its permit after the paused instance woke: %v", &op)
	}
	if op := answered(t, 20*time.Second, "proclaim", func() Op { return b.Proclaim(elect, leadB.LeaseID, "b:2", 5*time.Second) }); op.Result != OK {
		t.Fatalf("the new leader lost its lease after the paused instance woke: %v", &op)
	}
	if !rejectsShared(r, 1000, setA, setB, "the expired set's token") || r.Reg.Write(1000, elect, leadA.Token, "the expired leader's token") {
		t.Fatal("the register accepted a token of the expired set or leadership")
	}
	if op := answered(t, 20*time.Second, "set renewal", func() Op { return a.RenewSet(setA.Resources, setA.LeaseID, ttl) }); op.Result != Fail || op.Code != "lease_lost" {
		t.Fatalf("renewal of the expired set: %v, want lease_lost", &op)
	}
	waitEvent(t, r, elect, streams.EventProclaimed, leadB.Token)
	b.ReleaseSet(setB.Resources, setB.LeaseID)
	b.ReleasePermit(sem, permB.Permit, permB.LeaseID)
	b.Release(elect, leadB.LeaseID)

	rep := drivePausesAndReplacements(t, r, []*Instance{insts[0], repl, insts[2]}, primitiveActivity(r))
	checkPrimitiveActivity(t, r, rep)
}

// Lock sets, semaphores and elections across stream leader changes: a set
// is renewed after a step-down with the same tokens and released after
// another, and an overlapping set is then free at once, with larger
// tokens; a permit released after a step-down goes to its waiter; a leader
// proclaims after a step-down (status and the events show the new value)
// and resigns after another, and the waiting candidate is elected. Then
// the workload runs with sets, semaphores and elections while the stream
// leader moves every two seconds or so.
func TestPrimitivesAcrossLeaderChanges(t *testing.T) {
	t.Parallel()
	r := NewRun(t, primitivesMix)
	ncA, _ := r.H.Connect(0, "holder")
	ncB, _ := r.H.Connect(1, "next")
	a := &Caller{NC: ncA, H: r.Hist, Client: 1000}
	b := &Caller{NC: ncB, H: r.Hist, Client: 1001, Timeout: 15 * time.Second}
	const ttl = 5 * time.Second
	const sem, elect = "pleader/sem", "pleader/elect"

	setA := a.AcquireSet([]string{"pleader/1", "pleader/0"}, "a-set", ttl, 0, false)
	if setA.Result != OK || !writeEach(r, 1000, setA, "") {
		t.Fatalf("set acquire: %v", &setA)
	}
	var perms []Op
	for i := 0; i < scenarioLimit; i++ {
		p := a.AcquirePermit(sem, scenarioLimit, "a-permit-"+itoa(i), ttl, 0, false)
		if p.Result != OK {
			t.Fatalf("permit: %v", &p)
		}
		perms = append(perms, p)
	}
	leadA := a.Campaign(elect, "a-leader", "a:1", ttl, 0, false)
	if leadA.Result != OK {
		t.Fatalf("campaign: %v", &leadA)
	}
	permB := make(chan Op, 1)
	go func() {
		permB <- waitAnswered(func(retry bool) Op {
			return b.AcquirePermit(sem, scenarioLimit, "b-permit", ttl, 12*time.Second, retry)
		})
	}()
	leadB := make(chan Op, 1)
	go func() {
		leadB <- waitAnswered(func(retry bool) Op { return b.Campaign(elect, "b-leader", "b:1", ttl, 12*time.Second, retry) })
	}()

	if err := r.H.StepDown(); err != nil {
		t.Fatal(err)
	}
	renewed := answered(t, 20*time.Second, "set renewal", func() Op { return a.RenewSet([]string{"pleader/0", "pleader/1"}, setA.LeaseID, ttl) })
	if renewed.Result != OK || len(renewed.Members) != 2 || tokensOf(renewed)["pleader/0"] != tokensOf(setA)["pleader/0"] ||
		tokensOf(renewed)["pleader/1"] != tokensOf(setA)["pleader/1"] {
		t.Fatalf("set renewal after a leader change: %v, want the tokens of %v", &renewed, &setA)
	}
	if op := answered(t, 20*time.Second, "proclaim", func() Op { return a.Proclaim(elect, leadA.LeaseID, "a:2", ttl) }); op.Result != OK || op.Token != leadA.Token {
		t.Fatalf("proclaim after a leader change: %v", &op)
	}
	waitEvent(t, r, elect, streams.EventProclaimed, leadA.Token)
	if st := answered(t, 20*time.Second, "status", func() Op { return b.Status(elect) }); st.Result != OK || !st.Flag || st.Token != leadA.Token || st.Value != "a:2" {
		t.Fatalf("status of the election after a proclaim: %v, want token %d and value a:2", &st, leadA.Token)
	}
	if err := r.H.StepDown(); err != nil {
		t.Fatal(err)
	}
	if op := answered(t, 20*time.Second, "set release", func() Op { return a.ReleaseSet(setA.Resources, setA.LeaseID) }); op.Result != OK || !op.Flag {
		t.Fatalf("set release after a leader change: %v", &op)
	}
	setB := answered(t, 20*time.Second, "set acquire", func() Op {
		return b.AcquireSet([]string{"pleader/1", "pleader/2", "pleader/0"}, "b-set", ttl, 0, true)
	})
	setTaken(t, r, setB, setA, 0)
	if op := answered(t, 20*time.Second, "permit release", func() Op { return a.ReleasePermit(sem, perms[1].Permit, perms[1].LeaseID) }); op.Result != OK || !op.Flag {
		t.Fatalf("permit release after a leader change: %v", &op)
	}
	if op := <-permB; op.Result != OK || op.Permit != perms[1].Permit || op.Token <= perms[1].Token {
		t.Fatalf("the waiter for a permit: %v, want permit %d with a token above %d", &op, perms[1].Permit, perms[1].Token)
	} else {
		b.ReleasePermit(sem, op.Permit, op.LeaseID)
	}
	if op := answered(t, 20*time.Second, "resign", func() Op { return a.Release(elect, leadA.LeaseID) }); op.Result != OK || !op.Flag {
		t.Fatalf("resign after a leader change: %v", &op)
	}
	lb := <-leadB
	if lb.Result != OK || lb.Token <= leadA.Token {
		t.Fatalf("the waiting candidate: %v, after %v", &lb, &leadA)
	}
	waitEvent(t, r, elect, streams.EventEnded, leadA.Token)
	waitEvent(t, r, elect, streams.EventElected, lb.Token)
	b.ReleaseSet(setB.Resources, setB.LeaseID)
	b.Release(elect, lb.LeaseID)
	for i, p := range perms {
		if i != 1 {
			a.ReleasePermit(sem, p.Permit, p.LeaseID)
		}
	}

	rep := driveLeaderChanges(t, r, primitiveActivity(r))
	checkPrimitiveActivity(t, r, rep)
}

// What a run of sets, semaphores and elections must have done for its
// check to mean much.
const minSetGrants, minPermits, minLeaderships, minEvents = 8, 10, 5, 10

// primitiveActivity is the condition for DriveUntil that a run's actors
// of sets, semaphores and elections have done enough.
func primitiveActivity(r *Run) func() bool {
	return all(r.atLeast(minSetGrants, "set-acquire/ok"), r.atLeast(minPermits, "permit-acquire/ok"), r.atLeast(minLeaderships, "campaign/ok"),
		func() bool { return r.W.observer.Received() >= minEvents })
}

// checkPrimitiveActivity fails a run whose actors of sets, semaphores and
// elections did too little for its check to mean much.
func checkPrimitiveActivity(t *testing.T, r *Run, rep *Report) {
	t.Helper()
	sets, permits, leaders := rep.Counts["set-acquire/ok"], rep.Counts["permit-acquire/ok"], rep.Counts["campaign/ok"]
	events := r.W.observer.Received()
	if sets < minSetGrants || permits < minPermits || leaders < minLeaderships || events < minEvents || len(r.W.bucketLog) == 0 {
		t.Errorf("sets, semaphores and elections were hardly exercised: %d set grants, %d permits, %d leaderships, %d events, %d bucket writes",
			sets, permits, leaders, events, len(r.W.bucketLog))
	}
}
