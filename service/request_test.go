package service_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// The tests of this file hold the new primitives (semaphores, sets,
// sessions, elections) to the rules a single lock keeps: a request means
// one thing everywhere (its keys, its lease, its cost and its place in
// the renewal queue are decided from one decoding), a name is one thing
// at a time, and an honest caller beside a hostile one keeps its lease
// and gets its answers. They run the dev cluster's accounts.

// spend floods c with status requests until its tenant is refused for
// fair use, so that every request it sends next that is not free is
// refused too.
func spend(t *testing.T, c caller) {
	t.Helper()
	for i := 0; i < 1000; i++ {
		r := c.send(streams.OpStatus, streams.StatusRequest{Resource: fmt.Sprintf("spend/%d", i)})
		if r.errCode == streams.CodeUnavailable && strings.Contains(r.err.Message, "fair use") {
			return
		}
	}
	t.Fatal("1000 status requests were never refused for fair use")
}

// A permit renewed on time is kept while its tenant is over its rate:
// renewing (as the clients do, a third of the TTL after the last renewal)
// or releasing a permit the instance knows is free, as for a plain lease.
func TestPermitRenewalsAreFreeUnderFairUse(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	cfg.UserRate = 2
	env.Serve(cfg)
	noisy := caller{t: t, nc: env.ConnectAs(devcluster.App)}
	honest := caller{t: t, nc: env.ConnectAs(devcluster.Operator)}
	permit, rep := noisy.acquire(streams.AcquireRequest{Resource: "enc", RequestID: "p1", Limit: 3, TTLms: 3000})
	if rep.errCode != "" || permit.Permit == 0 {
		t.Fatalf("permit: %q %+v", rep.errCode, permit)
	}
	plain := noisy.mustAcquire("plain/1", "l1", 3000)
	h := honest.mustAcquire("honest/1", "h1", 30000)
	for round := 0; round < 3; round++ {
		if round > 0 {
			time.Sleep(time.Second) // a third of the TTL
		}
		spend(t, noisy)
		r := noisy.send(streams.OpRenew, streams.RenewRequest{Resource: "enc", Permit: permit.Permit, LeaseID: permit.LeaseID, TTLms: 3000})
		if r.errCode != "" {
			t.Fatalf("round %d: the permit's renewal over the rate: %q %s", round, r.errCode, r.err.Message)
		}
		if _, rep := noisy.renew("plain/1", plain.LeaseID, 3000); rep.errCode != "" {
			t.Fatalf("round %d: the plain lease's renewal: %q", round, rep.errCode)
		}
		if _, rep := honest.renew("honest/1", h.LeaseID, 30000); rep.errCode != "" {
			t.Fatalf("round %d: the honest tenant's renewal: %q", round, rep.errCode)
		}
	}
	spend(t, noisy)
	rr, r := ask[streams.ReleaseResponse](noisy, streams.OpRelease, streams.ReleaseRequest{Resource: "enc", Permit: permit.Permit, LeaseID: permit.LeaseID})
	if r.errCode != "" || !rr.Released {
		t.Fatalf("the permit's release over the rate: %q %s %+v", r.errCode, r.err.Message, rr)
	}
}

// A renewal naming a set that is not its lease's (a plain lease's id with
// 63 other names) is neither free nor first: it pays for every name, and
// is refused once its tenant's tokens are spent, while the renewal of the
// lease it names stays free. It is answered for what it is.
func TestASetRenewalPaysForEveryName(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	cfg.UserRate = 10 // a burst of 20: less than one such renewal's cost
	env.Serve(cfg)
	noisy := caller{t: t, nc: env.ConnectAs(devcluster.App)}
	honest := caller{t: t, nc: env.ConnectAs(devcluster.Operator)}
	a := noisy.mustAcquire("a", "a1", 30000)
	h := honest.mustAcquire("honest/2", "h2", 30000)
	names := []string{"a"}
	for i := 1; i < streams.DefaultSetSize; i++ {
		names = append(names, fmt.Sprintf("other/%d", i))
	}
	refused := 0
	for i := 0; i < 5; i++ {
		r := noisy.send(streams.OpRenew, streams.RenewRequest{Resources: names, LeaseID: a.LeaseID})
		switch {
		case r.errCode == streams.CodeUnavailable && strings.Contains(r.err.Message, "fair use"):
			refused++
		case r.errCode != streams.CodeInvalidRequest:
			t.Fatalf("a plain lease renewed as a set: %q %s, want invalid_request", r.errCode, r.err.Message)
		}
	}
	if refused < 3 {
		t.Fatalf("5 renewals naming 64 resources with a plain lease's id: %d refused for fair use, want at least 3", refused)
	}
	if _, rep := noisy.renew("a", a.LeaseID, 30000); rep.errCode != "" {
		t.Fatalf("the lease's own renewal beside them: %q %s", rep.errCode, rep.err.Message)
	}
	if _, rep := honest.renew("honest/2", h.LeaseID, 30000); rep.errCode != "" {
		t.Fatalf("the honest tenant's renewal: %q", rep.errCode)
	}
}

// A semaphore has one limit: with permits held under limit 3, an acquire
// of limit 1 is refused (whatever permit numbers are held), its status
// and a cancel naming another limit are refused, and status of limit 3
// shows the permit still held.
func TestASemaphoreHasOneLimit(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	var permits []streams.LeaseResponse
	for i := 1; i <= 3; i++ {
		p, rep := c.acquire(streams.AcquireRequest{Resource: "sem", RequestID: rid(i), Limit: 3})
		if rep.errCode != "" {
			t.Fatalf("permit %d: %q", i, rep.errCode)
		}
		permits = append(permits, p)
	}
	for _, p := range permits[:2] {
		if rr, _ := ask[streams.ReleaseResponse](c, streams.OpRelease, streams.ReleaseRequest{Resource: "sem", Permit: p.Permit, LeaseID: p.LeaseID}); !rr.Released {
			t.Fatalf("release of permit %d", p.Permit)
		}
	}
	r := c.send(streams.OpAcquire, streams.AcquireRequest{Resource: "sem", RequestID: "other", Limit: 1})
	if r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, "limit 3") {
		t.Fatalf("limit 1 while a limit-3 permit is held: %q %s, want invalid_request naming limit 3", r.errCode, r.err.Message)
	}
	if r := c.send(streams.OpStatus, streams.StatusRequest{Resource: "sem", Limit: 1}); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("status of limit 1: %q, want invalid_request", r.errCode)
	}
	if r := c.send(streams.OpCancel, streams.CancelRequest{Resource: "sem", RequestID: rid(3), Limit: 1}); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("cancel naming limit 1: %q, want invalid_request", r.errCode)
	}
	st, r := ask[streams.SemaphoreStatus](c, streams.OpStatus, streams.StatusRequest{Resource: "sem", Limit: 3})
	if r.errCode != "" || st.Limit != 3 || st.HeldPermits != 1 || st.Permits[0].Permit != permits[2].Permit {
		t.Fatalf("status of limit 3: %q %+v, want permit %d held", r.errCode, st, permits[2].Permit)
	}
}

// A name is one thing at a time: while a permit of semaphore "encoders"
// is held, a lock or an election of that name is refused, naming what it
// is, and status without a limit shows the semaphore; while a lock is
// held, a semaphore or an election of its name is refused. Once nothing
// holds or waits on the name, it may become anything.
func TestANameIsOneKindAtATime(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	p, rep := c.acquire(streams.AcquireRequest{Resource: "encoders", RequestID: "p", Limit: 3})
	if rep.errCode != "" {
		t.Fatal(rep.errCode)
	}
	for _, req := range []streams.AcquireRequest{
		{Resource: "encoders", RequestID: "lock"},
		{Resource: "encoders", RequestID: "leader", Value: "me"},
		{Resources: []string{"encoders", "other"}, RequestID: "set"},
	} {
		r := c.send(streams.OpAcquire, req)
		if r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, "semaphore of limit 3") {
			t.Fatalf("%+v while a permit is held: %q %s, want invalid_request naming the semaphore", req, r.errCode, r.err.Message)
		}
	}
	st, r := ask[streams.StatusResponse](c, streams.OpStatus, streams.StatusRequest{Resource: "encoders"})
	if r.errCode != "" || !st.Held || st.Limit != 3 || st.HeldPermits != 1 || len(st.Permits) != 1 || st.Permits[0].Permit != p.Permit {
		t.Fatalf("status of the semaphore's name without a limit: %q %s", r.errCode, r.raw)
	}
	if rr, _ := ask[streams.ReleaseResponse](c, streams.OpRelease, streams.ReleaseRequest{Resource: "encoders", Permit: p.Permit, LeaseID: p.LeaseID}); !rr.Released {
		t.Fatal("release of the permit")
	}
	l := c.mustAcquire("encoders", "lock", 30000)
	if r := c.send(streams.OpAcquire, streams.AcquireRequest{Resource: "encoders", RequestID: "p2", Limit: 3}); r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, "a lock") {
		t.Fatalf("a semaphore of a held lock's name: %q %s", r.errCode, r.err.Message)
	}
	if r := c.send(streams.OpAcquire, streams.AcquireRequest{Resource: "encoders", RequestID: "leader", Value: "me"}); r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, "a lock") {
		t.Fatalf("an election of a held lock's name: %q %s", r.errCode, r.err.Message)
	}
	if r := c.send(streams.OpStatus, streams.StatusRequest{Resource: "encoders", Limit: 3}); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("semaphore status of a lock: %q", r.errCode)
	}
	if ok, _ := c.release("encoders", l.LeaseID); !ok {
		t.Fatal("release of the lock")
	}
	if _, rep := c.acquire(streams.AcquireRequest{Resource: "encoders", RequestID: "p3", Limit: 2}); rep.errCode != "" {
		t.Fatalf("a free name as a semaphore of another limit: %q", rep.errCode)
	}
}

// A cancel of a permit's acquire costs what a cancel costs, whatever limit
// it names: a cancel of a name never acquired, sent twice (the second
// finds the first's tombstone, which reads as "granted before"), reads a
// handful of keys, never one per permit of the limit it names.
func TestASemaphoreCancelIsBoundedByTheSemaphore(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.ConnectAs(devcluster.App)}
	// Every right in the service's account: it sees the store's reads.
	mon := env.ConnectAs(devcluster.Admin)
	var reads atomic.Int64
	if _, err := mon.Subscribe("$JS.API.STREAM.MSG.GET.>", func(*nats.Msg) { reads.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := mon.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		var cr streams.CancelResponse
		c.send(streams.OpCancel, streams.CancelRequest{Resource: "never", RequestID: "x", Limit: streams.MaxLimit}).decode(t, &cr)
		if cr.Cancelled {
			t.Fatal("a cancel of a name never acquired cancelled something")
		}
	}
	if err := mon.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n > 12 {
		t.Fatalf("two cancels of limit %d on a name never acquired read %d keys from the stream leader", streams.MaxLimit, n)
	}
	// The honest path still works: a granted permit is cancelled.
	p, rep := c.acquire(streams.AcquireRequest{Resource: "sem2", RequestID: "y", Limit: 4})
	if rep.errCode != "" {
		t.Fatal(rep.errCode)
	}
	var cr streams.CancelResponse
	c.send(streams.OpCancel, streams.CancelRequest{Resource: "sem2", RequestID: "y", Limit: 4}).decode(t, &cr)
	if !cr.Cancelled {
		t.Fatalf("the cancel of granted permit %d cancelled nothing", p.Permit)
	}
}

// An operator revokes one permit (audited, with an end mark that says
// so); its holder's next renewal is lease_lost, the other permits stay;
// a caller may not.
func TestAnOperatorRevokesAPermit(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	op := caller{t: t, nc: env.ConnectAs(devcluster.Operator)}
	p1, _ := c.acquire(streams.AcquireRequest{Resource: "pool", RequestID: "a", Limit: 2})
	p2, _ := c.acquire(streams.AcquireRequest{Resource: "pool", RequestID: "b", Limit: 2})
	// Inside the service's account a request carries no stamp: forbidden.
	inside := caller{t: t, nc: env.ConnectAs(devcluster.Admin)}
	if r := inside.send(streams.OpRevoke, streams.RevokeRequest{Resource: "pool", Permit: p1.Permit, Reason: "stuck"}); r.errCode != streams.CodeForbidden {
		t.Fatalf("an unstamped revoke of a permit: %q", r.errCode)
	}
	rv, r := ask[streams.RevokeResponse](op, streams.OpRevoke, streams.RevokeRequest{Resource: "pool", Permit: p1.Permit, Reason: "stuck"})
	if r.errCode != "" || !rv.Revoked || rv.Permit != p1.Permit || rv.Resource != "pool" || rv.Token != p1.Token {
		t.Fatalf("the operator's revoke of permit %d: %q %+v", p1.Permit, r.errCode, rv)
	}
	if r := c.send(streams.OpRenew, streams.RenewRequest{Resource: "pool", Permit: p1.Permit, LeaseID: p1.LeaseID}); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("the revoked permit's renewal: %q, want lease_lost", r.errCode)
	}
	if r := c.send(streams.OpRenew, streams.RenewRequest{Resource: "pool", Permit: p2.Permit, LeaseID: p2.LeaseID}); r.errCode != "" {
		t.Fatalf("the other permit's renewal: %q", r.errCode)
	}
	if mark := endMark(t, env, streams.PermitResource("pool", p1.Permit)); mark == nil || mark.Why != "revoke" || mark.Reason != "stuck" {
		t.Fatalf("the revoked permit's end mark: %+v", mark)
	}
}

// Every request the contract allows fits the body cap: an acquire, renew
// and release of a set of the deployment's largest size, of names of the
// longest length, with the longest request id and owner.
func TestTheLargestValidSetFitsTheBodyCap(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	names := make([]string, cfg.MaxSetSize)
	for i := range names {
		names[i] = fmt.Sprintf("%03d-%s", i, strings.Repeat("n", streams.MaxResourceLen-4))
	}
	req := streams.AcquireRequest{Resources: names, RequestID: strings.Repeat("r", streams.MaxRequestIDLen),
		Owner: strings.Repeat("<", streams.MaxOwnerLen), TTLms: 30000}
	body, _ := json.Marshal(req)
	if len(body) <= 4096 {
		t.Fatalf("the test's set takes %d bytes: it should be over the old 4 KiB cap", len(body))
	}
	set, r := ask[streams.SetLeaseResponse](c, streams.OpAcquire, req)
	if r.errCode != "" || len(set.Resources) != len(names) {
		t.Fatalf("a set of %d names of %d bytes (%d bytes): %q %s", len(names), streams.MaxResourceLen, len(body), r.errCode, r.err.Message)
	}
	if _, r := ask[streams.SetLeaseResponse](c, streams.OpRenew, streams.RenewRequest{Resources: names, LeaseID: set.LeaseID}); r.errCode != "" {
		t.Fatalf("its renewal: %q %s", r.errCode, r.err.Message)
	}
	if rr, r := ask[streams.SetReleaseResponse](c, streams.OpRelease, streams.ReleaseRequest{Resources: names, LeaseID: set.LeaseID}); r.errCode != "" || !rr.Released {
		t.Fatalf("its release: %q %+v", r.errCode, rr)
	}
}

// A lease held in a session, in a deployment without a hold cap, lives
// as long as its session, and its reply says no hold limit; with a
// max_hold_ms over a day the reply's hold_until is the asked one, not a
// day. (That the service keeps it past a day is the tracker's test:
// TestSessionLeaseOutlivesItsRecordTTL.)
func TestASessionLeaseIsToldItsRealHold(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	cfg.MaxHold = 0
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	sess, r := ask[streams.SessionResponse](c, streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: "s", TTLms: 10000})
	if r.errCode != "" {
		t.Fatal(r.errCode)
	}
	twoDays := (48 * time.Hour).Milliseconds()
	before := time.Now()
	l, r := c.acquire(streams.AcquireRequest{Resource: "held/long", RequestID: "l", SessionID: sess.SessionID, MaxHoldMs: twoDays})
	if r.errCode != "" {
		t.Fatal(r.errCode)
	}
	until, err := streams.ParseTime(l.HoldUntil)
	if err != nil || until.Before(before.Add(47*time.Hour)) {
		t.Fatalf("hold_until %q of a 48 h hold in a session: want about now + 48 h", l.HoldUntil)
	}
	if st := c.status("held/long"); !st.Held || st.HoldUntil != l.HoldUntil {
		t.Fatalf("status %+v: want held until %s", st, l.HoldUntil)
	}
}

// A cancel belongs to the same caller as an acquire only when tenant,
// owner and request id all match: owner B, waiting with owner A's
// request id, is left waiting by A's cancel, gives up its wait and ends
// only that wait; A's lease stays and renews, and A's own cancel still
// ends it.
func TestACancelEndsOnlyItsOwnersRequest(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	a, rep := c.acquire(streams.AcquireRequest{Resource: "job", RequestID: "R", Owner: "host:100", TTLms: 30000})
	if rep.errCode != "" {
		t.Fatal(rep.errCode)
	}
	wait := c.acquireAsync(streams.AcquireRequest{Resource: "job", RequestID: "R", Owner: "host:200", WaitMs: 60000})
	waitForWaiters(t, c, "job", 1)
	// A's cancel while B waits with the same request id: B's wait is
	// another owner's, left alone (no tombstone, which would end it), and
	// the cancel touches nothing.
	var cr streams.CancelResponse
	c.send(streams.OpCancel, streams.CancelRequest{Resource: "job", RequestID: "R", Owner: "host:100"}).decode(t, &cr)
	if st := c.status("job"); cr.Cancelled || !st.Held || st.Token != a.Token || st.Waiters != 1 {
		t.Fatalf("A's cancel while B waits: %+v, status %+v; want nothing cancelled, A's lease held, B waiting", cr, st)
	}
	c.send(streams.OpCancel, streams.CancelRequest{Resource: "job", RequestID: "R", Owner: "host:200"}).decode(t, &cr)
	if !cr.Cancelled {
		t.Fatal("owner B's cancel of its own wait cancelled nothing")
	}
	if r := <-wait; r.errCode == "" {
		t.Fatalf("B's wait was granted: %s", r.raw)
	}
	if st := c.status("job"); !st.Held || st.Token != a.Token || st.Waiters != 0 {
		t.Fatalf("after B's cancel: %+v, want A's lease held and no waiter", st)
	}
	if _, rep := c.renew("job", a.LeaseID, 30000); rep.errCode != "" {
		t.Fatalf("A's renewal: %q", rep.errCode)
	}
	// B's cancel once more, with nothing of B's left: still A's lease.
	c.send(streams.OpCancel, streams.CancelRequest{Resource: "job", RequestID: "R", Owner: "host:200"}).decode(t, &cr)
	if cr.Cancelled || !c.status("job").Held {
		t.Fatal("a second cancel by owner B ended owner A's lease")
	}
	c.send(streams.OpCancel, streams.CancelRequest{Resource: "job", RequestID: "R", Owner: "host:100"}).decode(t, &cr)
	if !cr.Cancelled || c.status("job").Held {
		t.Fatal("A's own cancel did not end its lease")
	}
}

// A retry of a set's acquire renews the set, as a lock's retry does: the
// caller counts its deadline from the retry.
func TestARetriedSetIsRenewed(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	req := streams.AcquireRequest{Resources: []string{"s/a", "s/b"}, RequestID: "set", TTLms: 5000}
	first, r := ask[streams.SetLeaseResponse](c, streams.OpAcquire, req)
	if r.errCode != "" {
		t.Fatal(r.errCode)
	}
	time.Sleep(50 * time.Millisecond) // expires_at has milliseconds: the retry's must be later
	again, r := ask[streams.SetLeaseResponse](c, streams.OpAcquire, req)
	if r.errCode != "" || again.LeaseID != first.LeaseID {
		t.Fatalf("retry: %q %+v", r.errCode, again)
	}
	t1, _ := streams.ParseTime(first.ExpiresAt)
	t2, _ := streams.ParseTime(again.ExpiresAt)
	if !t2.After(t1) {
		t.Fatalf("the retry answered expires_at %s, the grant %s: not renewed", again.ExpiresAt, first.ExpiresAt)
	}
	if st := c.status("s/b"); st.ExpiresAt != again.ExpiresAt {
		t.Fatalf("the set's record expires at %s, the retry said %s", st.ExpiresAt, again.ExpiresAt)
	}
	for i, m := range again.Resources {
		if m.Token != first.Resources[i].Token {
			t.Fatalf("a retry changed %s's token", m.Resource)
		}
	}
}

// Naming part of a set, or more than it, in a renew or release is
// invalid_request that says so, and changes nothing: the set stays held.
func TestNamingPartOfASetSaysWhatIsWrong(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	set, r := ask[streams.SetLeaseResponse](c, streams.OpAcquire, streams.AcquireRequest{Resources: []string{"p/a", "p/b", "p/c"}, RequestID: "set"})
	if r.errCode != "" {
		t.Fatal(r.errCode)
	}
	for _, names := range [][]string{{"p/a", "p/b"}, {"p/a", "p/b", "p/c", "p/d"}} {
		r := c.send(streams.OpRenew, streams.RenewRequest{Resources: names, LeaseID: set.LeaseID})
		if r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, "set of 3") {
			t.Fatalf("renew naming %v: %q %s", names, r.errCode, r.err.Message)
		}
		r = c.send(streams.OpRelease, streams.ReleaseRequest{Resources: names, LeaseID: set.LeaseID})
		if r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, "set of 3") {
			t.Fatalf("release naming %v: %q %s", names, r.errCode, r.err.Message)
		}
	}
	for _, res := range []string{"p/a", "p/b", "p/c"} {
		if !c.status(res).Held {
			t.Fatalf("%s is no longer held", res)
		}
	}
}
