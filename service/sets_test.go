package service_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

func (c caller) acquireSet(req streams.AcquireRequest) (streams.SetLeaseResponse, reply) {
	c.t.Helper()
	return ask[streams.SetLeaseResponse](c, streams.OpAcquire, req)
}

func (c caller) mustAcquireSet(requestID string, ttlMs int64, resources ...string) streams.SetLeaseResponse {
	c.t.Helper()
	l, r := c.acquireSet(streams.AcquireRequest{Resources: resources, RequestID: requestID, TTLms: ttlMs})
	if r.errCode != "" {
		c.t.Fatalf("acquire %v: %s %s", resources, r.errCode, r.err.Message)
	}
	return l
}

// A free set is granted whole, with a token per resource (the revision of
// each key's grant), renewed and released whole.
func TestSetGrantRenewRelease(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	l := c.mustAcquireSet("s1", 5000, "set/b", "set/a", "set/c")
	if len(l.Resources) != 3 || l.Resources[0].Resource != "set/a" || l.Resources[2].Resource != "set/c" {
		t.Fatalf("grant %+v: want the three resources, sorted", l)
	}
	for i, m := range l.Resources {
		st := c.status(m.Resource)
		if !st.Held || st.Token != m.Token || st.SetSize != 3 {
			t.Fatalf("%s after the grant: %+v, want held with token %d in a set of 3", m.Resource, st, m.Token)
		}
		if i > 0 && m.Token != l.Resources[i-1].Token+1 {
			t.Fatalf("tokens %+v: one commit writes consecutive revisions", l.Resources)
		}
	}
	// A retry of the same request returns the same lease.
	if again := c.mustAcquireSet("s1", 5000, "set/c", "set/a", "set/b"); again.LeaseID != l.LeaseID {
		t.Fatal("a retried set acquire returned another lease")
	}
	var renewed streams.SetLeaseResponse
	c.send(streams.OpRenew, streams.RenewRequest{Resources: []string{"set/a", "set/b", "set/c"}, LeaseID: l.LeaseID, TTLms: 6000}).decode(t, &renewed)
	if renewed.TTLms != 6000 || renewed.Resources[1].Token != l.Resources[1].Token {
		t.Fatalf("renewal %+v: want ttl 6000 and the same tokens", renewed)
	}
	// A renewal naming another set, or a wrong lease id, changes nothing.
	if r := c.send(streams.OpRenew, streams.RenewRequest{Resources: []string{"set/a", "set/b"}, LeaseID: l.LeaseID}); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("renewal of a sub-set: %q, want invalid_request", r.errCode)
	}
	var rel streams.SetReleaseResponse
	c.send(streams.OpRelease, streams.ReleaseRequest{Resources: []string{"set/c", "set/b", "set/a"}, LeaseID: l.LeaseID}).decode(t, &rel)
	if !rel.Released {
		t.Fatal("release of the set released nothing")
	}
	for _, res := range []string{"set/a", "set/b", "set/c"} {
		if st := c.status(res); st.Held {
			t.Fatalf("%s held after the set's release", res)
		}
	}
	c.send(streams.OpRelease, streams.ReleaseRequest{Resources: []string{"set/a", "set/b", "set/c"}, LeaseID: l.LeaseID}).decode(t, &rel)
	if rel.Released {
		t.Fatal("a second release released something")
	}
}

// A set with one key held is refused, naming the holder, and nothing is
// written on its free keys.
func TestSetRefusedWritesNothing(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	other := caller{t: t, nc: env.Connect()}
	h := other.mustAcquire("rf/b", "h", 30000)
	before := c.status("rf/a")
	_, r := c.acquireSet(streams.AcquireRequest{Resources: []string{"rf/a", "rf/b", "rf/c"}, RequestID: "s", TTLms: 5000})
	if r.errCode != streams.CodeLocked || len(r.err.Holders) != 1 || r.err.Holders[0].Resource != "rf/b" || r.err.Holders[0].Token != h.Token {
		t.Fatalf("set with a held key: %q %+v, want locked naming rf/b", r.errCode, r.err)
	}
	for _, res := range []string{"rf/a", "rf/c"} {
		if st := c.status(res); st.Held || st.Token != before.Token {
			t.Fatalf("%s after the refused set: %+v", res, st)
		}
	}
}

// Bad inputs get clear errors and change nothing.
func TestSetBadInputs(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("bi/%02d", i)
	}
	for _, tc := range []struct {
		name string
		body any
		want string
	}{
		{"duplicates", streams.AcquireRequest{Resources: []string{"bi/a", "bi/b", "bi/a"}, RequestID: "r"}, "twice"},
		{"65 names", streams.AcquireRequest{Resources: many, RequestID: "r"}, "65 resources"},
		{"one name", streams.AcquireRequest{Resources: []string{"bi/a"}, RequestID: "r"}, "1 resources"},
		{"an invalid name", streams.AcquireRequest{Resources: []string{"bi/a", "bi/b c", "bi/d"}, RequestID: "r"}, "resources[1]"},
		{"resource and resources", streams.AcquireRequest{Resource: "bi/a", Resources: []string{"bi/b", "bi/c"}, RequestID: "r"}, "together"},
		{"empty list", `{"resources":[],"request_id":"r"}`, "0 resources"},
	} {
		r := c.send(streams.OpAcquire, tc.body)
		if r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, tc.want) {
			t.Errorf("%s: %q %q, want invalid_request saying %q", tc.name, r.errCode, r.err.Message, tc.want)
		}
	}
	for i := range 4 {
		if st := c.status(fmt.Sprintf("bi/%02d", i)); st.Held {
			t.Fatalf("bi/%02d held after refused sets", i)
		}
	}
	for _, res := range []string{"bi/a", "bi/b", "bi/c", "bi/d"} {
		if st := c.status(res); st.Held {
			t.Fatalf("%s held after refused sets", res)
		}
	}
}

// Two callers ask for {a,b} and {b,a}, waiting, over and over: neither
// deadlocks nor starves.
func TestSetsWaitWithoutDeadlock(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	env.Serve(testenv.Config())
	const rounds = 12
	var wg sync.WaitGroup
	got := make([]int, 2)
	for w, order := range [][]string{{"dl/a", "dl/b"}, {"dl/b", "dl/a"}} {
		c := caller{t: t, nc: env.Connect()}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				// No stall of the machine outlasts the TTL: an expiry
				// would make the release below find nothing.
				l, r := c.acquireSet(streams.AcquireRequest{Resources: order, RequestID: fmt.Sprintf("w%d-%d", w, i), TTLms: 120000, WaitMs: 60000})
				if r.errCode != "" {
					t.Errorf("caller %d round %d: %s %s", w, i, r.errCode, r.err.Message)
					return
				}
				got[w]++
				time.Sleep(5 * time.Millisecond)
				var rel streams.SetReleaseResponse
				c.send(streams.OpRelease, streams.ReleaseRequest{Resources: order, LeaseID: l.LeaseID}).decode(t, &rel)
				if !rel.Released {
					t.Errorf("caller %d round %d: release released nothing", w, i)
				}
			}
		}()
	}
	wg.Wait()
	if got[0] != rounds || got[1] != rounds {
		t.Fatalf("grants %v, want %d each", got, rounds)
	}
}

// A single-key waiter on b and a set waiter on {a,b} are served in arrival
// order, and a free key at the head of which a set waits is not taken by
// a later single waiter.
func TestSetAndSingleWaitersFIFO(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	holder := caller{t: t, nc: env.Connect()}
	hb := holder.mustAcquire("ff/b", "hb", 30000)
	// First a single waiter on b, then a set waiter on {a,b}.
	single := c.acquireAsync(streams.AcquireRequest{Resource: "ff/b", RequestID: "single", TTLms: 5000, WaitMs: 20000})
	waitForWaiters(t, c, "ff/b", 1)
	set := c.acquireAsync(streams.AcquireRequest{Resources: []string{"ff/a", "ff/b"}, RequestID: "set", TTLms: 5000, WaitMs: 20000})
	waitForWaiters(t, c, "ff/b", 2)
	// ff/a is free but the set is at its head: a later single acquire of
	// it is refused.
	if _, r := c.acquire(streams.AcquireRequest{Resource: "ff/a", RequestID: "late", TTLms: 5000}); r.errCode != streams.CodeLocked {
		t.Fatalf("a later acquire of a key reserved for a waiting set: %q", r.errCode)
	}
	if ok, _ := holder.release("ff/b", hb.LeaseID); !ok {
		t.Fatal("release")
	}
	var s1 streams.LeaseResponse
	(<-single).decode(t, &s1)
	released := time.Now()
	if ok, _ := c.release("ff/b", s1.LeaseID); !ok && time.Now().Before(expiresAt(t, s1)) {
		t.Fatal("release of the single waiter's lease")
	}
	var sl streams.SetLeaseResponse
	(<-set).decode(t, &sl)
	if sl.Resources[1].Token <= s1.Token {
		t.Fatalf("the set's token on b %d not above the single waiter's %d", sl.Resources[1].Token, s1.Token)
	}
	// The set was granted once the single waiter's lease ended (its
	// release, or its hand-over TTL if the test stalled that long), by the
	// service's clock, which is this process's.
	ended := released
	if exp := expiresAt(t, s1); exp.Before(ended) {
		ended = exp
	}
	if at := setGrantedAt(t, sl); at.Before(ended) {
		t.Fatalf("the set was granted at %v while the single waiter ahead of it held b (until %v)", at, ended)
	}
}

// A holder of {a,b} paused past its TTL is fenced on both: the set
// expires whole and its waiters are granted larger tokens.
func TestSetExpiresWholeAndIsFenced(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	other := caller{t: t, nc: env.Connect()}
	l := c.mustAcquireSet("paused", 1000, "ex/a", "ex/b")
	fence := newFencedStore()
	for _, m := range l.Resources {
		fence.write(m.Resource, m.Token)
	}
	// The holder pauses: no renewal. Others wait for each key.
	wa := other.acquireAsync(streams.AcquireRequest{Resource: "ex/a", RequestID: "wa", TTLms: 5000, WaitMs: 20000})
	wb := other.acquireAsync(streams.AcquireRequest{Resource: "ex/b", RequestID: "wb", TTLms: 5000, WaitMs: 20000})
	var ga, gb streams.LeaseResponse
	(<-wa).decode(t, &ga)
	(<-wb).decode(t, &gb)
	if !fence.write("ex/a", ga.Token) || !fence.write("ex/b", gb.Token) {
		t.Fatal("the new holders' writes were refused")
	}
	for _, m := range l.Resources {
		if fence.write(m.Resource, m.Token) {
			t.Fatalf("the paused set's late write on %s was accepted", m.Resource)
		}
	}
	if r := c.send(streams.OpRenew, streams.RenewRequest{Resources: []string{"ex/a", "ex/b"}, LeaseID: l.LeaseID}); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("the paused set's renewal: %q", r.errCode)
	}
	// One expiry ended both keys (one batch); the count may be taken a
	// moment after the grants it allowed.
	expired := func() float64 { return testenv.Metric(t, reg, "jetlock_leases_expired_total", nil) }
	testenv.Eventually(t, 30*time.Second, func() bool { return expired() >= 2 }, "the set's 2 keys counted as expired")
	if n := expired(); n != 2 {
		t.Fatalf("expired %v keys, want the set's 2", n)
	}
}

// Cancel of a waiting set removes every place; cancel of a granted set
// releases it whole.
func TestSetCancel(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	other := caller{t: t, nc: env.Connect()}
	h := other.mustAcquire("cx/b", "h", 30000)
	wait := c.acquireAsync(streams.AcquireRequest{Resources: []string{"cx/a", "cx/b"}, RequestID: "w", TTLms: 5000, WaitMs: 20000})
	waitForWaiters(t, c, "cx/a", 1)
	var cr streams.SetCancelResponse
	c.send(streams.OpCancel, streams.CancelRequest{Resources: []string{"cx/b", "cx/a"}, RequestID: "w"}).decode(t, &cr)
	if !cr.Cancelled {
		t.Fatal("cancel of a waiting set cancelled nothing")
	}
	if r := <-wait; r.errCode != streams.CodeLeaseLost {
		t.Fatalf("the cancelled wait: %q", r.errCode)
	}
	// The instance learns of the removed places from the bucket.
	testenv.Eventually(t, 30*time.Second, func() bool {
		return c.status("cx/a").Waiters == 0 && c.status("cx/b").Waiters == 0
	}, "places left after cancel")
	other.release("cx/b", h.LeaseID)
	c.mustAcquireSet("g", 5000, "cx/a", "cx/b")
	c.send(streams.OpCancel, streams.CancelRequest{Resources: []string{"cx/a", "cx/b"}, RequestID: "g"}).decode(t, &cr)
	if !cr.Cancelled || c.status("cx/a").Held || c.status("cx/b").Held {
		t.Fatal("cancel of a granted set left it held")
	}
	// The cancelled request is never granted after.
	if _, r := c.acquireSet(streams.AcquireRequest{Resources: []string{"cx/a", "cx/b"}, RequestID: "g", TTLms: 5000}); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("a retry of the cancelled set: %q", r.errCode)
	}
}

// A session may hold a set; the session's close releases it.
func TestSetInSession(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	id := c.mustOpen("with-set", 5000)
	l, r := c.acquireSet(streams.AcquireRequest{Resources: []string{"ss/a", "ss/b"}, RequestID: "r", SessionID: id})
	if r.errCode != "" || l.TTLms != 5000 {
		t.Fatalf("a set in a session: %q %+v", r.errCode, l)
	}
	if st := c.status("ss/a"); !st.InSession || st.SetSize != 2 {
		t.Fatalf("status: %+v", st)
	}
	if r := c.send(streams.OpRenew, streams.RenewRequest{Resources: []string{"ss/a", "ss/b"}, LeaseID: l.LeaseID}); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("renewal of a session's set: %q", r.errCode)
	}
	if cr := c.closeSession(id); cr.Released != 2 {
		t.Fatalf("close: %+v", cr)
	}
	if c.status("ss/a").Held || c.status("ss/b").Held {
		t.Fatal("the session's set outlived it")
	}
}

// A set is renewed and released whole: a renewal or release naming one of
// its resources is refused and changes nothing.
func TestSetMemberAloneRefused(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	l := c.mustAcquireSet("m", 5000, "mm/a", "mm/b")
	if _, r := c.renew("mm/a", l.LeaseID, 60000); r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, "whole") {
		t.Fatalf("renewal of one resource of a set: %q %q", r.errCode, r.err.Message)
	}
	if ok, r := c.release("mm/a", l.LeaseID); ok || r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("release of one resource of a set: %v %q", ok, r.errCode)
	}
	for _, m := range l.Resources {
		st := c.status(m.Resource)
		if !st.Held || st.Token != m.Token || st.ExpiresAt != l.ExpiresAt {
			t.Fatalf("%s after the refused requests: %+v", m.Resource, st)
		}
	}
}

// A retried waiting set acquire (its first reply lost) keeps its places
// and is granted, wherever each attempt is served.
func TestSetWaitRetryKeepsPlace(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	h := c.mustAcquire("rt/a", "h", 30000)
	req := streams.AcquireRequest{Resources: []string{"rt/a", "rt/b"}, RequestID: "set", TTLms: 5000, WaitMs: 20000}
	for range 3 {
		// The caller gives up on the reply; the wait goes on.
		if _, err := c.try(streams.OpAcquire, req, 300*time.Millisecond); err == nil {
			t.Fatal("the waiting set was answered while rt/a is held")
		}
	}
	retry := c.acquireAsync(req)
	waitForWaiters(t, c, "rt/b", 1)
	if ok, _ := c.release("rt/a", h.LeaseID); !ok {
		t.Fatal("release")
	}
	var l streams.SetLeaseResponse
	(<-retry).decode(t, &l)
	if len(l.Resources) != 2 || l.Resources[0].Token <= h.Token {
		t.Fatalf("the retried set: %+v", l)
	}
}

// A retry of a set acquire that another instance granted gets that lease,
// not lease_lost, whatever this instance has seen of the grant so far.
func TestSetRetryAcrossInstances(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	for i := range 20 {
		req := streams.AcquireRequest{Resources: []string{fmt.Sprintf("ra/%d/a", i), fmt.Sprintf("ra/%d/b", i), fmt.Sprintf("ra/%d/c", i)}, RequestID: "r", TTLms: 5000}
		first := c.acquireAsync(req)
		second := c.acquireAsync(req)
		var a, b streams.SetLeaseResponse
		(<-first).decode(t, &a)
		(<-second).decode(t, &b)
		if a.LeaseID != b.LeaseID {
			t.Fatalf("round %d: two attempts of one request got two leases", i)
		}
	}
}

// setGrantedAt returns when the set lease l, as answered to its acquire,
// was written, by the clock of the instance that granted it.
func setGrantedAt(t testing.TB, l streams.SetLeaseResponse) time.Time {
	t.Helper()
	at, err := streams.ParseTime(l.ExpiresAt)
	if err != nil {
		t.Fatalf("expires_at of %+v: %v", l, err)
	}
	return at.Add(-time.Duration(l.TTLms) * time.Millisecond)
}
