package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

func waitConfig() service.Config {
	cfg := testenv.Config()
	cfg.WaiterLiveness = 2 * time.Second
	cfg.Reservation = time.Second
	cfg.HandoverTTL = 2 * time.Second
	return cfg
}

// acquireAsync sends a waiting acquire and delivers its reply.
func (c caller) acquireAsync(req streams.AcquireRequest) <-chan reply {
	ch := make(chan reply, 1)
	go func() { ch <- c.send(streams.OpAcquire, req) }()
	return ch
}

func waitForWaiters(t *testing.T, c caller, res string, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() bool { return c.status(res).Waiters == n }, "%d waiters on %s", n, res)
}

// countWakeMessages counts the wake messages on the wire.
func countWakeMessages(t *testing.T, nc *nats.Conn) *atomic.Int64 {
	var n atomic.Int64
	sub, err := nc.Subscribe("jetlock.wake.>", func(*nats.Msg) { n.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &n
}

// noWaiterRecordsLeft waits until the bucket holds no waiter record. The
// listing is read by an ordered consumer, which the server may place on a
// replica a moment behind the leader, so the last deletes may show late.
func noWaiterRecordsLeft(t *testing.T, env *testenv.Env) {
	t.Helper()
	js, _ := jetstream.New(env.ConnectAs(devcluster.Inspector))
	kv, err := js.KeyValue(context.Background(), streams.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	testenv.Eventually(t, 30*time.Second, func() bool {
		lister, err := kv.ListKeysFiltered(context.Background(), streams.WaitKeyPrefix+">")
		if err != nil {
			t.Fatal(err)
		}
		keys = keys[:0]
		for k := range lister.Keys() {
			keys = append(keys, k)
		}
		return len(keys) == 0
	}, "waiter records left behind: %v", &keys) // printed as they were last listed
}

// 50 waiters on one hot resource are granted in ticket order, and every
// release wakes exactly one waiter: no thundering herd. The waiters are
// this instance's own, so they are woken in process, without a message.
func TestWaitersFIFOAndOneWakePerRelease(t *testing.T) {
	env := testenv.Start(t)
	cfg := waitConfig()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	messages := countWakeMessages(t, env.ConnectAs(devcluster.Service))
	wakes := func() int { return int(testenv.Metric(t, reg, "jetlock_wakes_total", nil)) }
	const res, n = "hot/1", 50
	holder := c.mustAcquire(res, "holder", 30000)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		ch := c.acquireAsync(streams.AcquireRequest{Resource: res, RequestID: rid(i), Owner: fmt.Sprint(i), TTLms: 30000, WaitMs: 60000})
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep := <-ch
			var l streams.LeaseResponse
			if rep.errCode != "" {
				t.Errorf("waiter %d: %s %s", i, rep.errCode, rep.err.Message)
				return
			}
			rep.decode(t, &l)
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if ok, _ := c.release(res, l.LeaseID); !ok {
				t.Errorf("waiter %d: release failed", i)
			}
		}()
		waitForWaiters(t, c, res, i+1) // fixes the ticket order
	}
	if ok, _ := c.release(res, holder.LeaseID); !ok {
		t.Fatal("holder release failed")
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("grant order %v, want 0..%d", order, n-1)
		}
	}
	// One wake per release that had a waiter behind it: the holder's and
	// those of the first n-1 waiters.
	testenv.Eventually(t, 30*time.Second, func() bool { return wakes() >= n }, "wakes")
	time.Sleep(200 * time.Millisecond) // room for a surplus wake to show
	if got := wakes(); got != n {
		t.Fatalf("%d wakes for %d releases with waiters, want exactly one each", got, n)
	}
	if got := messages.Load(); got != 0 {
		t.Fatalf("%d wake messages published for waiters of the instance itself, want none", got)
	}
	if st := c.status(res); st.Held || st.Waiters != 0 {
		t.Fatalf("after the run: %+v", st)
	}
	noWaiterRecordsLeft(t, env)
}

func TestWaitDeadlineHonoured(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(waitConfig())
	c := caller{t: t, nc: env.Connect()}
	holder := c.mustAcquire("wd/1", "holder", 30000)
	start := time.Now()
	rep := c.send(streams.OpAcquire, streams.AcquireRequest{Resource: "wd/1", RequestID: "w", WaitMs: 1500})
	el := time.Since(start)
	if rep.errCode != streams.CodeLocked || rep.err.Holder == nil || rep.err.Holder.Token != holder.Token {
		t.Fatalf("wait ended with %q %+v, want locked with the holder", rep.errCode, rep.err)
	}
	// Never before its deadline; the upper bound only catches a wait that
	// outlived it by far (the holder's lease lasts 30s).
	if el < 1500*time.Millisecond || el > 1500*time.Millisecond+20*time.Second {
		t.Fatalf("wait of 1.5s answered after %v", el)
	}
	if st := c.status("wd/1"); st.Waiters != 0 || st.Token != holder.Token {
		t.Fatalf("after the wait: %+v", st)
	}
	// A release after the wait ended grants nothing to the departed waiter.
	c.release("wd/1", holder.LeaseID)
	time.Sleep(300 * time.Millisecond)
	if st := c.status("wd/1"); st.Held {
		t.Fatalf("departed waiter was granted: %+v", st)
	}
}

func TestCancelRemovesWaiterAndLeavesNothing(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(waitConfig())
	c := caller{t: t, nc: env.Connect()}
	holder := c.mustAcquire("cw/1", "holder", 30000)
	ch := c.acquireAsync(streams.AcquireRequest{Resource: "cw/1", RequestID: "w", WaitMs: 30000})
	waitForWaiters(t, c, "cw/1", 1)
	if !c.cancel("cw/1", "w") {
		t.Fatal("cancel of a waiter answered cancelled:false")
	}
	select {
	case rep := <-ch:
		if rep.errCode != streams.CodeLeaseLost {
			t.Fatalf("cancelled waiter answered %q", rep.errCode)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("cancelled waiter still waiting")
	}
	c.release("cw/1", holder.LeaseID)
	time.Sleep(300 * time.Millisecond) // room for a wrong grant to show
	testenv.Eventually(t, 30*time.Second, func() bool {
		st := c.status("cw/1")
		if st.Held {
			t.Fatalf("after cancel: %+v", st)
		}
		return st.Waiters == 0
	}, "the cancelled waiter still counted")
	if _, rep := c.acquire(streams.AcquireRequest{Resource: "cw/1", RequestID: "w"}); rep.errCode != streams.CodeLeaseLost {
		t.Fatalf("retry of the cancelled request: %q, want lease_lost", rep.errCode)
	}
	noWaiterRecordsLeft(t, env)
}

// A waiter whose instance died: its retry on another instance keeps its
// place; one that never retries delays the next by a few seconds at most,
// and the skip keeps ticket order (w2 before w3).
func TestWaitersOfAStoppedInstance(t *testing.T) {
	env := testenv.Start(t)
	cfg := waitConfig()
	cfg.Reservation = 2 * time.Second // twice the re-check period
	a := env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	holder := c.mustAcquire("dead/1", "holder", 30000)
	r1 := c.acquireAsync(streams.AcquireRequest{Resource: "dead/1", RequestID: "w1", TTLms: 30000, WaitMs: 30000})
	r2 := c.acquireAsync(streams.AcquireRequest{Resource: "dead/1", RequestID: "w2", TTLms: 30000, WaitMs: 30000})
	waitForWaiters(t, c, "dead/1", 2)
	env.Serve(cfg)
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []<-chan reply{r1, r2} {
		if rep := <-r; rep.errCode != streams.CodeUnavailable {
			t.Fatalf("waiter of a stopping instance answered %q, want unavailable", rep.errCode)
		}
	}
	// w2 retries (same request id, keeps its place); w1 never does.
	w3 := c.acquireAsync(streams.AcquireRequest{Resource: "dead/1", RequestID: "w3", TTLms: 30000, WaitMs: 30000})
	r2 = c.acquireAsync(streams.AcquireRequest{Resource: "dead/1", RequestID: "w2", TTLms: 30000, WaitMs: 30000})
	time.Sleep(300 * time.Millisecond) // both usually queued before the release; the order holds either way
	released := time.Now()
	c.release("dead/1", holder.LeaseID)
	rep := <-r2
	var l2 streams.LeaseResponse
	rep.decode(t, &l2)
	// w1 holds w2 back until its record lapses or its reservation passes,
	// not for its whole wait: the grant's time is the service's (it runs
	// in this process), and the bound leaves w2's own wait of 30s far
	// behind, which is where a waiter that is never skipped would end.
	bound := cfg.WaiterLiveness + cfg.ExpiryGrace + cfg.Reservation + cfg.Recheck + 10*time.Second
	if d := grantedAt(t, l2).Sub(released); d > bound {
		t.Fatalf("retried waiter granted %v after the release, want within %v", d, bound)
	}
	c.release("dead/1", l2.LeaseID)
	var l3 streams.LeaseResponse
	(<-w3).decode(t, &l3)
	if l3.Token <= l2.Token {
		t.Fatalf("w3 granted token %d, w2 token %d: w3 went first", l3.Token, l2.Token)
	}
}

func TestHandoverGrantStartsShort(t *testing.T) {
	env := testenv.Start(t)
	cfg := waitConfig()
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	holder := c.mustAcquire("ho/1", "holder", 30000)
	ch := c.acquireAsync(streams.AcquireRequest{Resource: "ho/1", RequestID: "w", TTLms: 60000, WaitMs: 30000})
	waitForWaiters(t, c, "ho/1", 1)
	c.release("ho/1", holder.LeaseID)
	var l streams.LeaseResponse
	(<-ch).decode(t, &l)
	if l.TTLms != cfg.HandoverTTL.Milliseconds() {
		t.Fatalf("hand-over grant ttl_ms %d, want %d", l.TTLms, cfg.HandoverTTL.Milliseconds())
	}
	// The caller that went away never renews: freed within the short TTL.
	// The bound is generous for a busy machine and still far below the
	// 60s the waiter asked for.
	testenv.Eventually(t, cfg.HandoverTTL+cfg.ExpiryGrace+20*time.Second, func() bool { return !c.status("ho/1").Held }, "hand-over grant not expired")
	// A live holder's first renewal extends it to what it asked for.
	ch = c.acquireAsync(streams.AcquireRequest{Resource: "ho/1", RequestID: "w2", TTLms: 60000, WaitMs: 30000})
	var l2 streams.LeaseResponse
	(<-ch).decode(t, &l2)
	if r, rep := c.renew("ho/1", l2.LeaseID, 60000); rep.errCode != "" || r.TTLms != 60000 {
		t.Fatalf("renewal: %+v %s", r, rep.errCode)
	}
}

// The caps of the queue: per resource, and per tenant (a NATS user as the
// server vouches for it, whatever owner its requests name), so that one
// tenant's waits never take another's place.
func TestWaiterCaps(t *testing.T) {
	env := testenv.Start(t)
	cfg := waitConfig()
	cfg.MaxWaitersPerResource = 2
	cfg.MaxWaitersPerTenant = 1
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	app := caller{t: t, nc: env.ConnectAs(devcluster.App)}
	third := caller{t: t, nc: env.ConnectAs(devcluster.Operator)}
	h1 := c.mustAcquire("cap/1", "h", 30000)
	c.mustAcquire("cap/2", "h", 30000)
	ra := c.acquireAsync(streams.AcquireRequest{Resource: "cap/1", RequestID: "a", WaitMs: 20000})
	rb := app.acquireAsync(streams.AcquireRequest{Resource: "cap/1", RequestID: "b", Owner: "bob", WaitMs: 20000})
	waitForWaiters(t, c, "cap/1", 2)
	if _, rep := third.acquire(streams.AcquireRequest{Resource: "cap/1", RequestID: "c", WaitMs: 20000}); rep.errCode != streams.CodeTooManyWaiters || rep.status != 429 {
		t.Fatalf("third waiter: %q, want too_many_waiters", rep.errCode)
	}
	// The caller's second wait, under another owner: its tenant's cap.
	if _, rep := c.acquire(streams.AcquireRequest{Resource: "cap/2", RequestID: "d", Owner: "someone-else", WaitMs: 20000}); rep.errCode != streams.CodeTooManyWaiters {
		t.Fatalf("the caller's second waiter: %q, want too_many_waiters", rep.errCode)
	}
	// Another tenant's wait on cap/2 is not refused for it.
	rd := third.acquireAsync(streams.AcquireRequest{Resource: "cap/2", RequestID: "d", WaitMs: 20000})
	waitForWaiters(t, c, "cap/2", 1)
	if st := c.status("cap/1"); st.Waiters != 2 || st.Token != h1.Token {
		t.Fatalf("refused waiters changed the queue: %+v", st)
	}
	for _, w := range []struct {
		c     caller
		r     <-chan reply
		id    string
		on    string
		owner string
	}{{c, ra, "a", "cap/1", ""}, {app, rb, "b", "cap/1", "bob"}, {third, rd, "d", "cap/2", ""}} {
		if !w.c.cancel(w.on, w.id, w.owner) {
			t.Fatal("cancel of a queued waiter failed")
		}
		if rep := <-w.r; rep.errCode != streams.CodeLeaseLost {
			t.Fatalf("cancelled waiter: %q", rep.errCode)
		}
	}
}

// Idle waiters cost no write: waiters queued on held locks, served by two
// instances that follow each other, leave the bucket untouched for
// several liveness windows (counted from the stream's last sequence), and
// every one of them keeps its place: neither instance takes the other's
// waiters for dead while it is heard.
func TestIdleWaitersWriteNothing(t *testing.T) {
	env := testenv.Start(t)
	cfg := waitConfig()
	env.Serve(cfg)
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	const locks, perLock = 4, 10
	var replies []<-chan reply
	for i := range locks {
		res := fmt.Sprintf("idle/%d", i)
		c.mustAcquire(res, "holder", 60000)
		for j := range perLock {
			replies = append(replies, c.acquireAsync(streams.AcquireRequest{Resource: res, RequestID: fmt.Sprintf("w%d", j), TTLms: 30000, WaitMs: 60000}))
		}
	}
	for i := range locks {
		waitForWaiters(t, c, fmt.Sprintf("idle/%d", i), perLock)
	}
	js, err := jetstream.New(env.ConnectAs(devcluster.Inspector))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), streams.StreamName(streams.DefaultBucket))
	if err != nil {
		t.Fatal(err)
	}
	lastSeq := func() uint64 {
		info, err := stream.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	before := lastSeq()
	// Four liveness windows: a waiter that rewrote its record each third
	// of the window would have written twelve times.
	time.Sleep(4 * (cfg.WaiterLiveness + cfg.ExpiryGrace))
	if after := lastSeq(); after != before {
		t.Fatalf("%d idle waiters wrote %d messages in %v, want none", locks*perLock, after-before, 4*(cfg.WaiterLiveness+cfg.ExpiryGrace))
	}
	for i := range locks {
		if st := c.status(fmt.Sprintf("idle/%d", i)); st.Waiters != perLock {
			t.Fatalf("idle/%d has %d waiters, want %d: a live instance's waiter was removed", i, st.Waiters, perLock)
		}
	}
	for i := range locks {
		for j := range perLock {
			c.cancel(fmt.Sprintf("idle/%d", i), fmt.Sprintf("w%d", j))
		}
	}
	for _, r := range replies {
		if rep := <-r; rep.errCode != streams.CodeLeaseLost {
			t.Fatalf("cancelled waiter answered %q, want lease_lost", rep.errCode)
		}
	}
}

// The tenant's waiter cap is exact on one instance: 160 waits on as many
// resources, sent at once by one tenant whose cap is 50, queue exactly 50
// (each place is counted from its reservation, before its write).
func TestTenantWaiterCapIsExactOnOneInstance(t *testing.T) {
	env := testenv.Start(t)
	cfg := waitConfig()
	cfg.MaxWaitersPerTenant = 50
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	const n = 160
	for i := range n {
		c.mustAcquire(fmt.Sprintf("cap/%d", i), "holder", 60000)
	}
	replies := make([]<-chan reply, n)
	for i := range n {
		replies[i] = c.acquireAsync(streams.AcquireRequest{Resource: fmt.Sprintf("cap/%d", i), RequestID: "w", WaitMs: 60000})
	}
	// The refused answer at once; the queued ones wait.
	refused := 0
	testenv.Eventually(t, 30*time.Second, func() bool {
		for i, r := range replies {
			if r == nil {
				continue
			}
			select {
			case rep := <-r:
				if rep.errCode != streams.CodeTooManyWaiters {
					t.Fatalf("cap/%d answered %q while held, want too_many_waiters or a wait", i, rep.errCode)
				}
				refused++
				replies[i] = nil
			default:
			}
		}
		return refused >= n-cfg.MaxWaitersPerTenant
	}, "%d waits refused, want %d", &refused, n-cfg.MaxWaitersPerTenant)
	queued := 0
	for i := range n {
		queued += c.status(fmt.Sprintf("cap/%d", i)).Waiters
	}
	if queued != cfg.MaxWaitersPerTenant || refused != n-cfg.MaxWaitersPerTenant {
		t.Fatalf("%d queued and %d refused of %d waits at once, want exactly %d queued", queued, refused, n, cfg.MaxWaitersPerTenant)
	}
	for i, r := range replies {
		if r == nil {
			continue
		}
		c.cancel(fmt.Sprintf("cap/%d", i), "w")
		if rep := <-r; rep.errCode != streams.CodeLeaseLost {
			t.Fatalf("cancelled waiter of cap/%d answered %q, want lease_lost", i, rep.errCode)
		}
	}
}

// A waiter of an older release beside this one, during a rolling upgrade:
// its record says how long it lives unrewritten (liveness_ms) and its
// instance rewrites it, without heartbeats of the kind this release sends.
// This instance keeps it while it is rewritten, hands it the resource
// (the grant goes to its wake subject, which its instance answers), and
// removes a record whose rewrites have stopped, as the older release does.
func TestWaiterOfAnOlderReleaseIsHonoured(t *testing.T) {
	env := testenv.Start(t)
	cfg := waitConfig()
	// A window that a stall of the test's rewrites between two of them
	// (a quarter window apart) would have to last most of, to pass.
	cfg.WaiterLiveness = 4 * time.Second
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	holder := c.mustAcquire("old/1", "holder", 30000)
	// The older instance: its wake subjects, and its writes to the bucket.
	svcNC, storeNC, err := env.Cluster.ConnectService()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svcNC.Close)
	t.Cleanup(storeNC.Close)
	wakes, err := svcNC.SubscribeSync("jetlock.wake.older.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := svcNC.Flush(); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(storeNC)
	kv, err := js.KeyValue(t.Context(), streams.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	const kept, dropped = "00000000000000000000000000000000000000a1", "00000000000000000000000000000000000000b2"
	liveness := cfg.WaiterLiveness
	write := func(hash string, ticket, rev uint64) uint64 {
		now := time.Now().UTC()
		w := streams.Waiter{RequestID: "older-" + hash[len(hash)-2:], Ticket: ticket, QueuedAt: streams.FormatTime(now),
			LivenessMs: liveness.Milliseconds(), RefreshedAt: streams.FormatTime(now), ExpiresAt: streams.FormatTime(now.Add(liveness)),
			Wake: "jetlock.wake.older." + hash, LeaseTTLms: 30000}
		var seq uint64
		var err error
		if rev == 0 {
			seq, err = kv.Create(t.Context(), streams.WaitKey("old/1", hash), w.AppendJSON(nil))
		} else {
			seq, err = kv.Update(t.Context(), streams.WaitKey("old/1", hash), w.AppendJSON(nil), rev)
		}
		if err != nil {
			t.Fatalf("write the older release's waiter %s: %v", hash, err)
		}
		return seq
	}
	keptTicket := write(kept, 0, 0)
	write(dropped, 0, 0) // never rewritten
	waitForWaiters(t, c, "old/1", 2)
	// The older instance rewrites one record every quarter of its window,
	// for two windows; the other is removed meanwhile.
	rev := keptTicket
	for end := time.Now().Add(2 * (liveness + cfg.ExpiryGrace)); time.Now().Before(end); {
		time.Sleep(liveness / 4)
		rev = write(kept, keptTicket, rev)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return c.status("old/1").Waiters == 1 }, "the record no longer rewritten removed")
	if _, err := kv.Get(t.Context(), streams.WaitKey("old/1", kept)); err != nil {
		t.Fatalf("the rewritten record was removed: %v", err)
	}
	// The release hands the resource to the older release's waiter.
	c.release("old/1", holder.LeaseID)
	m, err := wakes.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("no grant on the older waiter's wake subject: %v", err)
	}
	var grant streams.LeaseResponse
	if err := json.Unmarshal(m.Data, &grant); err != nil || m.Subject != "jetlock.wake.older."+kept || grant.Token <= holder.Token {
		t.Fatalf("wake %s %s: want the grant for %s", m.Subject, m.Data, kept)
	}
	if st := c.status("old/1"); !st.Held || st.Token != grant.Token {
		t.Fatalf("after the hand-over: %+v, want held with token %d", st, grant.Token)
	}
}
