package service_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

func (c caller) openSession(requestID string, ttlMs int64) (streams.SessionResponse, reply) {
	c.t.Helper()
	return ask[streams.SessionResponse](c, streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: requestID, Owner: "sess-" + requestID, TTLms: ttlMs})
}

func (c caller) mustOpen(requestID string, ttlMs int64) string {
	c.t.Helper()
	s, r := c.openSession(requestID, ttlMs)
	if r.errCode != "" {
		c.t.Fatalf("open %s: %s %s", requestID, r.errCode, r.err.Message)
	}
	return s.SessionID
}

func (c caller) keepalive(id string) (streams.KeepaliveResponse, reply) {
	c.t.Helper()
	return ask[streams.KeepaliveResponse](c, streams.OpSessionKeepalive, streams.SessionKeepaliveRequest{SessionID: id})
}

func (c caller) closeSession(id string) streams.SessionCloseResponse {
	c.t.Helper()
	var cr streams.SessionCloseResponse
	c.send(streams.OpSessionClose, streams.SessionCloseRequest{SessionID: id}).decode(c.t, &cr)
	return cr
}

func (c caller) mustAcquireIn(session, resource, requestID string) streams.LeaseResponse {
	c.t.Helper()
	l, r := c.acquire(streams.AcquireRequest{Resource: resource, RequestID: requestID, SessionID: session})
	if r.errCode != "" {
		c.t.Fatalf("acquire %s in session: %s %s", resource, r.errCode, r.err.Message)
	}
	return l
}

// One keepalive keeps many leases; close releases them all, cancels the
// session's waits, wakes the waiters of its resources (each granted with
// a larger token), and answers how many it released. A second close
// changes nothing.
func TestSessionCloseEndsEverything(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	other := caller{t: t, nc: env.Connect()}

	// A TTL ten times the keepalives' period: a busy machine delays a
	// keepalive by far less.
	id := c.mustOpen("s1", 5000)
	var held []streams.LeaseResponse
	for i := range 5 {
		l := c.mustAcquireIn(id, fmt.Sprintf("sc/%d", i), rid(i))
		if l.TTLms != 5000 {
			t.Fatalf("a session lease's ttl_ms %d, want the session's 5000", l.TTLms)
		}
		held = append(held, l)
	}
	// Kept alive past its TTL twice over by keepalives alone.
	for range 20 {
		time.Sleep(500 * time.Millisecond)
		k, r := c.keepalive(id)
		if r.errCode != "" || k.Leases != 5 {
			t.Fatalf("keepalive: %q %+v, want 5 leases", r.errCode, k)
		}
	}
	for i := range held {
		st := c.status(fmt.Sprintf("sc/%d", i))
		if !st.Held || st.Token != held[i].Token || !st.InSession || st.SessionOwner != "sess-s1" {
			t.Fatalf("status of a kept session lease: %+v", st)
		}
		// Its expiry is its session's, not its hold limit's.
		if at, err := streams.ParseTime(st.ExpiresAt); err != nil || time.Until(at) > 10*time.Second {
			t.Fatalf("a session lease's expires_at %q: want its session's, within its TTL", st.ExpiresAt)
		}
	}
	if r := c.send(streams.OpStatus, streams.StatusRequest{Resource: "sc/none"}); strings.Contains(string(r.raw), "in_session") {
		t.Fatalf("status of a free resource names in_session: %s", r.raw)
	}
	// A renewal of a session lease is refused and changes nothing.
	if _, r := c.renew("sc/0", held[0].LeaseID, 30000); r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, "keep the session alive") {
		t.Fatalf("renew of a session lease: %q %q", r.errCode, r.err.Message)
	}
	// Another caller waits on sc/0; the session also waits on sc/9,
	// held by the other caller.
	wait := other.acquireAsync(streams.AcquireRequest{Resource: "sc/0", RequestID: "w0", WaitMs: 20000})
	waitForWaiters(t, c, "sc/0", 1)
	blocker := other.mustAcquire("sc/9", "b9", 30000)
	sessWait := c.acquireAsync(streams.AcquireRequest{Resource: "sc/9", RequestID: "sw", SessionID: id, WaitMs: 20000})
	waitForWaiters(t, c, "sc/9", 1)

	// The waits above may take long on a busy machine: the session is
	// kept alive up to its close, which is what ends its leases here.
	if k, r := c.keepalive(id); r.errCode != "" || k.Leases != 5 {
		t.Fatalf("keepalive before close: %q %+v, want 5 leases", r.errCode, k)
	}
	cr := c.closeSession(id)
	if !cr.Closed || cr.Released != 5 {
		t.Fatalf("close: %+v, want closed with 5 released", cr)
	}
	var granted streams.LeaseResponse
	(<-wait).decode(t, &granted)
	if granted.Token <= held[0].Token {
		t.Fatalf("the waiter's token %d is not above the session's %d", granted.Token, held[0].Token)
	}
	if r := <-sessWait; r.errCode != streams.CodeLeaseLost {
		t.Fatalf("the session's wait after close: %q, want lease_lost", r.errCode)
	}
	// The instance learns of the removed place from the bucket.
	testenv.Eventually(t, 30*time.Second, func() bool {
		st := c.status("sc/9")
		if st.Token != blocker.Token {
			t.Fatalf("sc/9 after the session's wait ended: %+v", st)
		}
		return st.Waiters == 0
	}, "sc/9 still counts the session's wait after it ended")
	for i := 1; i < 5; i++ {
		if st := c.status(fmt.Sprintf("sc/%d", i)); st.Held {
			t.Fatalf("sc/%d still held after close: %+v", i, st)
		}
	}
	if again := c.closeSession(id); again.Closed || again.Released != 0 {
		t.Fatalf("second close: %+v", again)
	}
	if _, r := c.keepalive(id); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("keepalive after close: %q, want lease_lost", r.errCode)
	}
	if _, r := c.acquire(streams.AcquireRequest{Resource: "sc/1", RequestID: "late", SessionID: id}); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("acquire in a closed session: %q, want lease_lost", r.errCode)
	}
	if _, r := c.openSession("s1", 3000); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("a retried open of an ended session: %q, want lease_lost", r.errCode)
	}
}

// A session not kept alive expires: every lease ends and each next waiter
// is granted with a larger token, so a fenced resource refuses the old
// holder's late write. Until then, nobody else is granted.
func TestSessionExpiryFreesLeases(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	other := caller{t: t, nc: env.Connect()}

	// Long enough for the acquires below on a busy machine; the session
	// is never kept alive after its open.
	sess, r := c.openSession("exp", 3000)
	if r.errCode != "" {
		t.Fatalf("open: %s %s", r.errCode, r.err.Message)
	}
	id := sess.SessionID
	a := c.mustAcquireIn(id, "se/a", "a")
	b := c.mustAcquireIn(id, "se/b", "b")
	fence := newFencedStore()
	if !fence.write("se/a", a.Token) {
		t.Fatal("the holder's first write was refused")
	}
	waitA := other.acquireAsync(streams.AcquireRequest{Resource: "se/a", RequestID: "wa", WaitMs: 20000})
	waitB := other.acquireAsync(streams.AcquireRequest{Resource: "se/b", RequestID: "wb", WaitMs: 20000})
	var ga, gb streams.LeaseResponse
	(<-waitA).decode(t, &ga)
	(<-waitB).decode(t, &gb)
	// Compared by the service's clock (it runs in this process): the
	// grants came after the session's expiry, not before.
	// The session's expiry as last answered (a session lease's is its
	// session's).
	end, err := streams.ParseTime(sess.ExpiresAt)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []streams.LeaseResponse{a, b} {
		if at := expiresAt(t, l); at.After(end) {
			end = at
		}
	}
	for _, g := range []streams.LeaseResponse{ga, gb} {
		if at := grantedAt(t, g); at.Before(end) {
			t.Fatalf("%s granted to another at %v, before the session's expiry %v", g.Resource, at, end)
		}
	}
	if ga.Token <= a.Token || gb.Token <= b.Token {
		t.Fatalf("tokens after expiry %d, %d not above %d, %d", ga.Token, gb.Token, a.Token, b.Token)
	}
	if !fence.write("se/a", ga.Token) || fence.write("se/a", a.Token) {
		t.Fatal("the fence did not refuse the expired session's late write")
	}
	if _, r := c.keepalive(id); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("keepalive of an expired session: %q", r.errCode)
	}
}

// fencedStore is a resource that keeps the highest token it accepted.
type fencedStore struct {
	mu      sync.Mutex
	highest map[string]uint64
}

func newFencedStore() *fencedStore { return &fencedStore{highest: map[string]uint64{}} }

func (f *fencedStore) write(res string, token uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if token < f.highest[res] {
		return false
	}
	f.highest[res] = token
	return true
}

// An acquire racing the close of its session, and a keepalive racing it,
// never leave a live lease on the ended session: whatever was granted is
// ended by the close, and nothing is granted after it.
func TestSessionRaces(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	env.Serve(testenv.Config()) // two instances: the close and the acquires may be served apart
	c := caller{t: t, nc: env.Connect()}
	for round := range 15 {
		id := c.mustOpen(fmt.Sprintf("race-%d", round), 30000)
		var wg sync.WaitGroup
		const n = 6
		granted := make([]bool, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, r := c.acquire(streams.AcquireRequest{Resource: fmt.Sprintf("race/%d/%d", round, i), RequestID: "r", SessionID: id})
				switch r.errCode {
				case "":
					granted[i] = true
				case streams.CodeLeaseLost:
				default:
					t.Errorf("acquire racing close: %s %s", r.errCode, r.err.Message)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, r := c.keepalive(id); r.errCode != "" && r.errCode != streams.CodeLeaseLost {
				t.Errorf("keepalive racing close: %s", r.errCode)
			}
		}()
		time.Sleep(time.Duration(round%4) * time.Millisecond)
		if cr := c.closeSession(id); !cr.Closed {
			t.Fatalf("round %d: close: %+v", round, cr)
		}
		wg.Wait()
		// Whatever was granted ended with the session: within the time
		// the other instance takes to step in at most.
		for i := range n {
			res := fmt.Sprintf("race/%d/%d", round, i)
			testenv.Eventually(t, 30*time.Second, func() bool { return !c.status(res).Held }, "%s (granted %v) still held after its session closed", res, granted[i])
		}
		if _, r := c.acquire(streams.AcquireRequest{Resource: fmt.Sprintf("race/%d/x", round), RequestID: "after", SessionID: id}); r.errCode != streams.CodeLeaseLost {
			t.Fatalf("acquire after close: %q", r.errCode)
		}
	}
}

// Bad inputs get clear errors and change nothing; another tenant cannot
// use, keep alive or close a session whose id it learned; the bounds hold.
func TestSessionBadInputs(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	cfg.MaxPerSession = 2
	cfg.MaxSessionsPerTenant = 2
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	thief := caller{t: t, nc: env.ConnectAs(devcluster.App)}

	id := c.mustOpen("good", 5000)
	l := c.mustAcquireIn(id, "bad/1", "one")
	forged := id[:streams.SessionHashLen] + strings.Repeat("0", streams.SessionSecretLen)
	unknown := strings.Repeat("ab", streams.SessionIDLen/2)
	for _, tc := range []struct {
		name, op string
		body     any
		code     string
	}{
		{"oversized id", streams.OpSessionKeepalive, `{"session_id":"` + strings.Repeat("a", 300) + `"}`, streams.CodeInvalidRequest},
		{"uppercase id", streams.OpSessionKeepalive, `{"session_id":"` + strings.ToUpper(id) + `"}`, streams.CodeInvalidRequest},
		{"missing id", streams.OpSessionClose, `{}`, streams.CodeInvalidRequest},
		{"unknown id", streams.OpSessionKeepalive, streams.SessionKeepaliveRequest{SessionID: unknown}, streams.CodeLeaseLost},
		{"forged secret", streams.OpSessionKeepalive, streams.SessionKeepaliveRequest{SessionID: forged}, streams.CodeLeaseLost},
		{"forged acquire", streams.OpAcquire, streams.AcquireRequest{Resource: "bad/2", RequestID: "f", SessionID: forged}, streams.CodeLeaseLost},
		{"ttl and session", streams.OpAcquire, streams.AcquireRequest{Resource: "bad/2", RequestID: "f", SessionID: id, TTLms: 5000}, streams.CodeInvalidRequest},
		{"open ttl too short", streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: "x", TTLms: 10}, streams.CodeInvalidRequest},
		{"open without request id", streams.OpSessionOpen, `{"ttl_ms":5000}`, streams.CodeInvalidRequest},
		{"open unknown field", streams.OpSessionOpen, `{"request_id":"y","session_id":"z"}`, streams.CodeInvalidRequest},
	} {
		if r := c.send(tc.op, tc.body); r.errCode != tc.code || r.err.Message == "" {
			t.Errorf("%s: %q %q, want %s", tc.name, r.errCode, r.err.Message, tc.code)
		}
	}
	// Another tenant with the very id: not its session.
	if _, r := thief.keepalive(id); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("another tenant's keepalive: %q", r.errCode)
	}
	if _, r := thief.acquire(streams.AcquireRequest{Resource: "bad/3", RequestID: "t", SessionID: id}); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("another tenant's acquire in the session: %q", r.errCode)
	}
	if cr := thief.closeSession(id); cr.Closed {
		t.Fatal("another tenant closed the session")
	}
	// Bounds: two leases and waits per session, two sessions per tenant.
	c.mustAcquireIn(id, "bad/4", "two")
	if _, r := c.acquire(streams.AcquireRequest{Resource: "bad/5", RequestID: "three", SessionID: id}); r.errCode != streams.CodeTooManyWaiters || !strings.Contains(r.err.Message, "session") {
		t.Fatalf("a third lease in a session capped at two: %q %q", r.errCode, r.err.Message)
	}
	c.mustOpen("second", 5000)
	if _, r := c.openSession("third", 5000); r.errCode != streams.CodeTooManyWaiters || !strings.Contains(r.err.Message, "sessions") {
		t.Fatalf("a third session of a tenant capped at two: %q %q", r.errCode, r.err.Message)
	}
	// Nothing changed: the session and its leases are as they were.
	k, r := c.keepalive(id)
	if r.errCode != "" || k.Leases != 2 {
		t.Fatalf("keepalive after the bad inputs: %q %+v", r.errCode, k)
	}
	if st := c.status("bad/1"); !st.Held || st.Token != l.Token {
		t.Fatalf("bad/1 after the bad inputs: %+v", st)
	}
	for _, res := range []string{"bad/2", "bad/3", "bad/5"} {
		if st := c.status(res); st.Held {
			t.Fatalf("%s held after refused acquires: %+v", res, st)
		}
	}
	// The session's owner is shown to its own tenant only.
	if st := thief.status("bad/1"); !st.InSession || st.SessionOwner != "" || st.Owner != "" {
		t.Fatalf("another tenant sees the session lease as %+v", st)
	}
}

// Open is idempotent by request id: a retry returns the same session (and
// keeps it alive); the same request id from another tenant is another
// session.
func TestSessionOpenIdempotent(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	app := caller{t: t, nc: env.ConnectAs(devcluster.App)}
	first := c.mustOpen("same", 5000)
	if again := c.mustOpen("same", 5000); again != first {
		t.Fatal("a retried open returned another session")
	}
	if theirs := app.mustOpen("same", 5000); theirs == first {
		t.Fatal("another tenant's open of the same request id returned this session")
	}
	if r := c.send(streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: "same", Owner: "someone else", TTLms: 5000}); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("the same request id for another owner: %q, want invalid_request", r.errCode)
	}
}

// A session and its leases survive the restart of the service, and the
// new instance expires them once keepalives stop.
func TestSessionSurvivesRestart(t *testing.T) {
	env := testenv.Start(t)
	first := env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	// The new instance counts the session's TTL from when it starts:
	// long enough for it to be reachable on a busy machine.
	id := c.mustOpen("restart", 5000)
	l := c.mustAcquireIn(id, "rs/1", "one")
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	env.Serve(testenv.Config())
	k, r := c.keepalive(id)
	if r.errCode != "" || k.Leases != 1 {
		t.Fatalf("keepalive after restart: %q %+v", r.errCode, k)
	}
	if st := c.status("rs/1"); !st.Held || st.Token != l.Token {
		t.Fatalf("the session's lease after restart: %+v", st)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return !c.status("rs/1").Held }, "the lease of a session no longer kept alive is freed")
	if _, r := c.keepalive(id); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("keepalive after expiry: %q", r.errCode)
	}
}

// Acquires racing the expiry of their session never leave a live lease on
// it: what was granted before the end ends with it, and nothing is
// granted after.
func TestSessionAcquireRacesExpiry(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	for round := range 4 {
		id := c.mustOpen(fmt.Sprintf("exp-race-%d", round), 1000)
		// No keepalive: the session ends 1.5 s after it was seen. Acquire
		// through that moment.
		deadline := time.Now().Add(2500 * time.Millisecond)
		var wg sync.WaitGroup
		for w := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(deadline); i++ {
					res := fmt.Sprintf("er/%d/%d/%d", round, w, i)
					_, r := c.acquire(streams.AcquireRequest{Resource: res, RequestID: "r", SessionID: id})
					switch r.errCode {
					case "", streams.CodeLeaseLost:
					default:
						t.Errorf("acquire racing expiry: %s %s", r.errCode, r.err.Message)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		testenv.Eventually(t, 30*time.Second, func() bool {
			for w := range 3 {
				for i := 0; ; i++ {
					st := c.status(fmt.Sprintf("er/%d/%d/%d", round, w, i))
					if st.Held {
						return false
					}
					if i > 150 {
						break
					}
				}
			}
			return true
		}, "round %d: a lease of the expired session is still held", round)
	}
}

// A waiter in a session is handed the resource as a lease of its session,
// which its session's close then releases.
func TestSessionWaiterHandedOver(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	other := caller{t: t, nc: env.Connect()}
	id := c.mustOpen("waits", 5000)
	h := other.mustAcquire("hw/1", "h", 30000)
	wait := c.acquireAsync(streams.AcquireRequest{Resource: "hw/1", RequestID: "w", SessionID: id, WaitMs: 20000})
	waitForWaiters(t, c, "hw/1", 1)
	if ok, _ := other.release("hw/1", h.LeaseID); !ok {
		t.Fatal("release")
	}
	var l streams.LeaseResponse
	(<-wait).decode(t, &l)
	if l.Token <= h.Token || l.TTLms != 5000 {
		t.Fatalf("handed over: %+v, want a token above %d and the session's ttl", l, h.Token)
	}
	if st := c.status("hw/1"); !st.InSession || st.Token != l.Token {
		t.Fatalf("status after the hand-over: %+v", st)
	}
	if _, r := c.renew("hw/1", l.LeaseID, 5000); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("renew of the handed-over session lease: %q", r.errCode)
	}
	if cr := c.closeSession(id); cr.Released != 1 {
		t.Fatalf("close: %+v", cr)
	}
	if st := c.status("hw/1"); st.Held {
		t.Fatalf("still held after close: %+v", st)
	}
}

// Closing a session of many leases ends them in atomic batches of many
// keys: far fewer commits than leases.
func TestSessionCloseBatches(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	js, err := jetstream.New(env.ConnectAs(devcluster.Store))
	if err != nil {
		t.Fatal(err)
	}
	id := c.mustOpen("many", 30000)
	const n = 200
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			c.mustAcquireIn(id, fmt.Sprintf("many/%03d", i), "r")
		}()
	}
	wg.Wait()
	stream, err := js.Stream(t.Context(), streams.StreamName(streams.DefaultBucket))
	if err != nil {
		t.Fatal(err)
	}
	before, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	deletes := func() float64 {
		return testenv.Metric(t, reg, "jetlock_store_commit_duration_seconds", map[string]string{"op": "delete"})
	}
	commitsBefore := deletes()
	if cr := c.closeSession(id); cr.Released != n {
		t.Fatalf("close: %+v, want %d released", cr, n)
	}
	// The session's delete, and the leases' in batches of up to 64.
	if commits := deletes() - commitsBefore; commits > 1+(n+63)/64 {
		t.Fatalf("close committed %v deletes for %d leases, want at most %d", commits, n, 1+(n+63)/64)
	}
	if m := testenv.Metric(t, reg, "jetlock_session_events_total", map[string]string{"event": "session_close"}); m != 1 {
		t.Fatalf("session_close events %v, want 1", m)
	}
	after, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// One delete per lease and one for the session, in about n/64 batches.
	if msgs := after.State.LastSeq - before.State.LastSeq; msgs != n+1 {
		t.Fatalf("close wrote %d messages, want %d", msgs, n+1)
	}
	for i := 0; i < n; i += 37 {
		if st := c.status(fmt.Sprintf("many/%03d", i)); st.Held {
			t.Fatalf("many/%03d held after close", i)
		}
	}
}

// A lease whose session's record is gone (as when every instance was down
// while the session ended and its end mark left the bucket) is nobody's:
// an instance that starts frees it, and an acquire takes it over.
func TestSessionOrphanLeaseFreed(t *testing.T) {
	env := testenv.Start(t)
	first := env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(env.ConnectAs(devcluster.Store))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), streams.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	gone := strings.Repeat("7", streams.SessionHashLen)
	for _, res := range []string{"orphan/1", "orphan/2"} {
		rec := fmt.Sprintf(`{"lease_id":"%s","request_id":"r","ttl_ms":3600000,"token":0,"granted_at":"2026-12-01T00:00:00.000Z","renewed_at":"2026-12-01T00:00:00.000Z","expires_at":"2026-12-01T01:00:00.000Z","session":"%s"}`,
			strings.Repeat("1", 32), gone)
		if _, err := kv.Put(t.Context(), streams.LeaseKey(res), []byte(rec)); err != nil {
			t.Fatal(err)
		}
	}
	env.Serve(testenv.Config())
	testenv.Eventually(t, 30*time.Second, func() bool { return !c.status("orphan/1").Held }, "the orphaned lease is freed")
	if l, r := c.acquire(streams.AcquireRequest{Resource: "orphan/2", RequestID: "new", TTLms: 5000}); r.errCode != "" {
		t.Fatalf("acquire over an orphaned lease: %s %s", r.errCode, r.err.Message)
	} else if l.Token == 0 {
		t.Fatal("no token")
	}
}
