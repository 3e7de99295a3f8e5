package service_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// A semaphore of 3 under 20 contending callers never has more than 3
// valid permits (checked by a fenced store per permit, and by a count of
// holders), every caller is served, and the pool is full at once: the
// first grants are held until three permits are held together, so the
// count of holders is known to have reached the limit whatever the
// scheduling of the machine.
func TestSemaphoreBoundsHolders(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	env.Serve(testenv.Config())
	fence := newFencedStore()
	const limit = 3
	var holding, most atomic.Int64
	full := make(chan struct{}) // closed when limit permits were held at once
	var fullOnce sync.Once
	var wg sync.WaitGroup
	const callers, rounds = 20, 3
	for w := range callers {
		c := caller{t: t, nc: env.Connect()}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				// The TTL outlasts the wait for a full pool below: a lease
				// that expired while held would let a fourth in.
				l, r := c.acquire(streams.AcquireRequest{Resource: "pool", Limit: limit, RequestID: fmt.Sprintf("w%d-%d", w, i), TTLms: 120000, WaitMs: 90000})
				if r.errCode != "" {
					t.Errorf("caller %d: %s %s", w, r.errCode, r.err.Message)
					return
				}
				if l.Permit < 1 || l.Permit > limit || l.Resource != "pool" {
					t.Errorf("grant %+v: want a permit of pool in 1..%d", l, limit)
				}
				n := holding.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				if n == limit {
					fullOnce.Do(func() { close(full) })
				}
				if !fence.write(fmt.Sprintf("pool#%d", l.Permit), l.Token) {
					t.Errorf("the fence of permit %d refused token %d", l.Permit, l.Token)
				}
				// Until the pool has been full once, hold: the other
				// permits must be granted beside this one.
				select {
				case <-full:
				case <-time.After(60 * time.Second):
					t.Errorf("caller %d held permit %d for 60s and the pool never had %d holders at once (most %d)", w, l.Permit, limit, most.Load())
				}
				holding.Add(-1)
				var rr streams.ReleaseResponse
				c.send(streams.OpRelease, streams.ReleaseRequest{Resource: "pool", Permit: l.Permit, LeaseID: l.LeaseID}).decode(t, &rr)
				if !rr.Released || rr.Resource != "pool" {
					t.Errorf("release of permit %d: %+v", l.Permit, rr)
				}
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m != limit {
		t.Fatalf("at most %d permits were held at once: want exactly %d", m, limit)
	}
}

// Waiters of a semaphore are served in arrival order, a release wakes one,
// and the permit of a holder that stopped renewing comes back at expiry.
func TestSemaphoreFIFOAndExpiry(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	var held []streams.LeaseResponse
	for i := range 2 {
		l, r := c.acquire(streams.AcquireRequest{Resource: "sem", Limit: 2, RequestID: rid(i), TTLms: 30000})
		if r.errCode != "" {
			t.Fatal(r.errCode)
		}
		held = append(held, l)
	}
	if held[0].Permit == held[1].Permit {
		t.Fatal("two holders got the same permit")
	}
	if _, r := c.acquire(streams.AcquireRequest{Resource: "sem", Limit: 2, RequestID: "x", TTLms: 30000}); r.errCode != streams.CodeLocked {
		t.Fatalf("a third acquire of a semaphore of 2: %q", r.errCode)
	}
	var waits []<-chan reply
	for i := range 3 {
		waits = append(waits, c.acquireAsync(streams.AcquireRequest{Resource: "sem", Limit: 2, RequestID: fmt.Sprintf("w%d", i), TTLms: 1000, WaitMs: 20000}))
		testenv.Eventually(t, 10*time.Second, func() bool {
			var st streams.SemaphoreStatus
			c.send(streams.OpStatus, streams.StatusRequest{Resource: "sem", Limit: 2}).decode(t, &st)
			return st.Waiters == i+1 && st.HeldPermits == 2
		}, "%d waiters", i+1)
	}
	// Without its permit, the lease id names no lease of "sem".
	if ok, r := c.release("sem", held[0].LeaseID); ok || r.errCode != "" {
		t.Fatalf("a release naming no permit: %v %q", ok, r.errCode)
	}
	var rr streams.ReleaseResponse
	c.send(streams.OpRelease, streams.ReleaseRequest{Resource: "sem", Permit: held[0].Permit, LeaseID: held[0].LeaseID}).decode(t, &rr)
	if !rr.Released {
		t.Fatal("release of a permit released nothing")
	}
	var first streams.LeaseResponse
	(<-waits[0]).decode(t, &first)
	if first.Permit != held[0].Permit || first.Token <= held[0].Token {
		t.Fatalf("the first waiter got %+v: want permit %d with a larger token", first, held[0].Permit)
	}
	// The first waiter never renews (TTL 1 s): its permit comes back at
	// expiry, to the next waiter, and not before: the release woke one
	// waiter only. The two grants' times come from the one instance's
	// clock, so they compare whatever the machine's load.
	var second streams.LeaseResponse
	(<-waits[1]).decode(t, &second)
	if second.Permit != first.Permit || second.Token <= first.Token {
		t.Fatalf("the second waiter got %+v after the first's permit expired", second)
	}
	if granted, expired := grantedAt(t, second), expiresAt(t, first); granted.Before(expired) {
		t.Fatalf("the second waiter was granted at %v, before the first's permit expired at %v: a release woke two waiters", granted, expired)
	}
	// The third waiter, cancelled, leaves the queue.
	var cr streams.CancelResponse
	c.send(streams.OpCancel, streams.CancelRequest{Resource: "sem", Limit: 2, RequestID: "w2"}).decode(t, &cr)
	if !cr.Cancelled {
		t.Fatal("cancel of a waiting permit request cancelled nothing")
	}
	if r := <-waits[2]; r.errCode != streams.CodeLeaseLost {
		t.Fatalf("the cancelled wait: %q", r.errCode)
	}
}

// Bad inputs get clear errors and change nothing: limits outside 1..1000,
// a limit another holder disagrees with, a limit with a set.
func TestSemaphoreBadInputs(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	c.send(streams.OpAcquire, streams.AcquireRequest{Resource: "bs", Limit: 3, RequestID: "a", TTLms: 30000}).decode(t, &streams.LeaseResponse{})
	for _, tc := range []struct {
		name string
		body any
		want string
	}{
		{"limit 0", `{"resource":"bs2","request_id":"b","limit":0}`, "limit 0"},
		{"limit 1001", streams.AcquireRequest{Resource: "bs2", RequestID: "b", Limit: 1001}, "limit 1001"},
		{"mismatched limit", streams.AcquireRequest{Resource: "bs", RequestID: "b", Limit: 4}, "semaphore of limit 3"},
		{"limit with a set", streams.AcquireRequest{Resources: []string{"bs", "bt"}, RequestID: "b", Limit: 2}, "limit and resources"},
		{"value too large", streams.AcquireRequest{Resource: "bs3", RequestID: "b", Value: strings.Repeat("v", 1025)}, "value is 1025 bytes"},
	} {
		r := c.send(streams.OpAcquire, tc.body)
		if r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, tc.want) {
			t.Errorf("%s: %q %q, want invalid_request saying %q", tc.name, r.errCode, r.err.Message, tc.want)
		}
	}
	var st streams.SemaphoreStatus
	c.send(streams.OpStatus, streams.StatusRequest{Resource: "bs", Limit: 3}).decode(t, &st)
	if st.HeldPermits != 1 || st.Waiters != 0 {
		t.Fatalf("status after the bad inputs: %+v", st)
	}
	if s := c.status("bs2"); s.Held {
		t.Fatal("bs2 held after refused acquires")
	}
}

// An election: the leader's value is in status and events, a renewal with
// a value proclaims it (same token), and when the leader resigns the next
// candidate is elected at once; observers see every change in order.
func TestElectionValueAndEvents(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	obs := env.Connect()
	events := make(chan streams.ElectionEvent, 16)
	sub, err := obs.Subscribe(streams.EventSubject(streams.DefaultPrefix, "elect/x"), func(m *nats.Msg) {
		var ev streams.ElectionEvent
		if err := jsonUnmarshal(m.Data, &ev); err == nil {
			events <- ev
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := obs.Flush(); err != nil {
		t.Fatal(err)
	}
	env.WaitInterest(devcluster.Account, streams.EventSubject(streams.DefaultPrefix, "elect/x"))
	lead, r := c.acquire(streams.AcquireRequest{Resource: "elect/x", RequestID: "a", TTLms: 10000, Value: "node-a"})
	if r.errCode != "" {
		t.Fatal(r.errCode)
	}
	standby := c.acquireAsync(streams.AcquireRequest{Resource: "elect/x", RequestID: "b", TTLms: 10000, WaitMs: 20000, Value: "node-b"})
	waitForWaiters(t, c, "elect/x", 1)
	if st := c.status("elect/x"); st.Value != "node-a" || st.Token != lead.Token {
		t.Fatalf("status of the election: %+v", st)
	}
	var p streams.LeaseResponse
	c.send(streams.OpRenew, streams.RenewRequest{Resource: "elect/x", LeaseID: lead.LeaseID, Value: "node-a:v2"}).decode(t, &p)
	if p.Token != lead.Token || c.status("elect/x").Value != "node-a:v2" {
		t.Fatal("proclaim changed the token or not the value")
	}
	if ok, _ := c.release("elect/x", lead.LeaseID); !ok {
		t.Fatal("resign")
	}
	var next streams.LeaseResponse
	(<-standby).decode(t, &next)
	want := []struct {
		event, value string
		token        uint64
	}{
		{streams.EventElected, "node-a", lead.Token},
		{streams.EventProclaimed, "node-a:v2", lead.Token},
		{streams.EventEnded, "node-a:v2", lead.Token},
		{streams.EventElected, "node-b", next.Token},
	}
	// Every instance announces what it takes in: keep the first of each
	// revision, in revision order, as an observer does.
	var got []streams.ElectionEvent
	seen := map[string]bool{}
	deadline := time.After(30 * time.Second)
	for len(got) < len(want) {
		select {
		case ev := <-events:
			k := fmt.Sprint(ev.Revision, ev.Event)
			if seen[k] {
				continue
			}
			seen[k] = true
			if len(got) > 0 && ev.Revision < got[len(got)-1].Revision {
				continue // an older event from a slower instance
			}
			got = append(got, ev)
		case <-deadline:
			t.Fatalf("events %+v, want %+v", got, want)
		}
	}
	for i, w := range want {
		if got[i].Event != w.event || got[i].Value != w.value || got[i].Token != w.token || got[i].Resource != "elect/x" {
			t.Fatalf("event %d: %+v, want %+v", i, got[i], w)
		}
	}
}

// A leader held in a session proclaims a new value with a renewal that
// names it; its lease stays the session's.
func TestElectionInSessionProclaims(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	id := c.mustOpen("leader", 3000)
	l, r := c.acquire(streams.AcquireRequest{Resource: "es/1", RequestID: "c", SessionID: id, Value: "v1"})
	if r.errCode != "" {
		t.Fatal(r.errCode)
	}
	var p streams.LeaseResponse
	c.send(streams.OpRenew, streams.RenewRequest{Resource: "es/1", LeaseID: l.LeaseID, Value: "v2"}).decode(t, &p)
	if p.Token != l.Token || p.TTLms != 3000 {
		t.Fatalf("proclaim in a session: %+v", p)
	}
	if st := c.status("es/1"); st.Value != "v2" || !st.InSession {
		t.Fatalf("status: %+v", st)
	}
	if _, r := c.renew("es/1", l.LeaseID, 0); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("a renewal without a value of a session lease: %q", r.errCode)
	}
	if cr := c.closeSession(id); cr.Released != 1 {
		t.Fatalf("close: %+v", cr)
	}
}

// expiresAt returns when the lease l expires, by the clock of the instance
// that granted it.
func expiresAt(t testing.TB, l streams.LeaseResponse) time.Time {
	t.Helper()
	at, err := streams.ParseTime(l.ExpiresAt)
	if err != nil {
		t.Fatalf("expires_at of %+v: %v", l, err)
	}
	return at
}

// grantedAt returns when the lease l, as answered to its acquire, was
// written, by the clock of the instance that granted it.
func grantedAt(t testing.TB, l streams.LeaseResponse) time.Time {
	t.Helper()
	return expiresAt(t, l).Add(-time.Duration(l.TTLms) * time.Millisecond)
}
