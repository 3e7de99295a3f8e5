package service

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// A set's grant is one atomic batch: an instance that dies after sending
// any part of it but the commit leaves nothing written (JetStream drops
// the incomplete batch), and one that dies after the commit leaves the
// whole set granted, which a retry of the request finds. So half a set is
// never written, whatever step the crash interrupts.
func TestSetGrantCrashAtEveryStep(t *testing.T) {
	cl := startCluster(t)
	s, _ := startInstance(t, cl, DefaultConfig(), 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := newSetReq([]string{"cr/a", "cr/b", "cr/c"}, "req", "", origin{})
	r.ttl = 30 * time.Second
	obs, err := s.locks.sets.readAll(ctx, r.keys, true)
	if err != nil {
		t.Fatal(err)
	}
	crash := func(sent int) {
		_, nc, err := cl.ConnectService()
		if err != nil {
			t.Fatal(err)
		}
		ws := setGrantWrites(r, s.locks.sets.setRecord(r), obs, nil, check{})
		msgs := make([]*batchMsg, len(ws))
		for i, w := range ws {
			msgs[i] = s.locks.store.msgOf(w)
		}
		id := nuid.Next()
		for i, m := range msgs[:sent] {
			m.Header.Set(batchIDHeader, id)
			m.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
			if i == len(msgs)-1 {
				m.Header.Set(batchCommitHeader, "1")
			}
			if err := nc.PublishMsg(m.Msg); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		nc.Close() // the instance dies; its reply, if any, is lost
	}
	for sent := 1; sent < len(r.keys); sent++ {
		crash(sent)
		now, err := s.locks.sets.readAll(ctx, r.keys, true)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range now {
			if o.rev != obs[i].rev {
				t.Fatalf("a crash after %d of %d messages wrote %s (revision %d)", sent, len(r.keys), r.keys[i], o.rev)
			}
		}
	}
	crash(len(r.keys))
	var granted []observation
	deadline := time.Now().Add(10 * time.Second)
	for {
		granted, err = s.locks.sets.readAll(ctx, r.keys, true)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, o := range granted {
			if o.held() {
				n++
			}
		}
		if n == len(r.keys) {
			break
		}
		// Keys are read one by one: the batch may apply between two
		// reads, so only the end state tells.
		if time.Now().After(deadline) {
			t.Fatalf("after the commit %d of %d keys are held", n, len(r.keys))
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := s.locks.sets.acquireSet(ctx, r)
	if err != nil {
		t.Fatalf("the retry after the crash: %v", err)
	}
	if resp.LeaseID != granted[0].rec.LeaseID {
		t.Fatal("the retry after the crash got another lease")
	}
	for i, m := range resp.Resources {
		if m.Token != granted[i].rev || m.Resource != r.resources[i] {
			t.Fatalf("retry's tokens %+v, want the committed revisions", resp.Resources)
		}
	}
	// The set's records hold the set: three keys of one lease.
	if rec := granted[0].rec; rec.Set != r.set || rec.SetSize != 3 || rec.Set != setHash([]string{"cr/a", "cr/b", "cr/c"}) {
		t.Fatalf("record %+v", rec)
	}
}

// The JetStream limits the set size cap follows from, measured on the dev
// cluster's default settings: an atomic batch of 1,000 messages commits
// and one of 1,001 is refused, and batches beyond the 50 a stream
// assembles at once are refused whole and sent again by store.batch, so
// that many sets granted at once all commit.
func TestSetBatchLimits(t *testing.T) {
	cl := startCluster(t)
	s, _ := startInstance(t, cl, DefaultConfig(), 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	puts := func(prefix string, n int) []*batchMsg {
		msgs := make([]*batchMsg, n)
		for i := range msgs {
			msgs[i] = s.store.putMsg(prefix+strconv.Itoa(i), []byte("x"), 0, "")
		}
		return msgs
	}
	if _, err := s.store.batch(ctx, "put", puts("limit.ok.", 1000)); err != nil {
		t.Fatalf("a batch of 1000: %v", err)
	}
	if _, err := s.store.batch(ctx, "put", puts("limit.over.", 1001)); err == nil {
		t.Fatal("a batch of 1001 committed: the documented limit changed")
	}
	// The largest set's grant after waiting: two writes a resource and a
	// session check.
	if n := 2*streams.MaxSetSize + 1; n > 1000 {
		t.Fatalf("the largest set's batch has %d messages", n)
	}
	errs := make(chan error, 120)
	for i := range 120 {
		go func() {
			_, err := s.store.batch(ctx, "put", puts("limit.many."+strconv.Itoa(i)+".", 8))
			errs <- err
		}()
	}
	for range 120 {
		if err := <-errs; err != nil {
			t.Fatalf("one of 120 concurrent batches: %v", err)
		}
	}
}

// A waiting set is woken each time one of its keys frees. Woken while
// another of its keys is still held, it reads that key alone from the
// stream leader, not every key of the set, and keeps waiting; woken when
// the last frees, it is granted whole.
func TestWokenSetReadsTheKeyStillHeld(t *testing.T) {
	cl := startCluster(t)
	s, _ := startInstance(t, cl, DefaultConfig(), 0)
	// Every right in the service's account: it sees the store's reads.
	mon, err := nats.Connect(cl.URLs(), cl.ConnectOptions(devcluster.Admin)...)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	var reads atomic.Int64
	var mu sync.Mutex
	var what []string
	if _, err := mon.Subscribe("$JS.API.STREAM.MSG.GET.>", func(m *nats.Msg) {
		reads.Add(1)
		mu.Lock()
		what = append(what, time.Now().Format("05.000")+" "+string(m.Data))
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := mon.Flush(); err != nil {
		t.Fatal(err)
	}
	hold := func(res string) string {
		resp, err := serveOn(t, s, streams.OpAcquire, &streams.AcquireRequest{Resource: res, RequestID: "h-" + res, Owner: "holder", TTLms: 60_000})
		if err != nil {
			t.Fatal(err)
		}
		return resp.(*streams.LeaseResponse).LeaseID
	}
	release := func(res, lease string) {
		if _, err := serveOn(t, s, streams.OpRelease, &streams.ReleaseRequest{Resource: res, LeaseID: lease}); err != nil {
			t.Fatal(err)
		}
	}
	set := []string{"wk/a", "wk/b", "wk/c", "wk/d", "wk/e"}
	// The subscription's interest reaches the other nodes a moment later.
	waitFor(t, 10*time.Second, func() bool {
		if _, err := s.locks.store.read(context.Background(), streams.LeaseKey("wk/a")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		return reads.Load() > 0
	}, "the store's reads seen")
	b, e := hold("wk/b"), hold("wk/e")
	type result struct {
		resp any
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := serveOn(t, s, streams.OpAcquire, &streams.AcquireRequest{Resources: set, RequestID: "set", Owner: "waiter", TTLms: 60_000, WaitMs: 30_000})
		got <- result{resp, err}
	}()
	waitFor(t, 10*time.Second, func() bool {
		_, ok := s.locks.tracker.head(queueOf(streams.LeaseKey("wk/e")))
		return ok
	}, "the set queued")
	time.Sleep(300 * time.Millisecond) // its first steps are over
	before := reads.Load()
	release("wk/b", b)
	time.Sleep(400 * time.Millisecond) // the wake's step, before its recheck a second later
	if n := reads.Load() - before; n != 1 {
		mu.Lock()
		t.Fatalf("the set woken by the release of one key while another was held made %d reads, want 1 (of the key still held): %q", n, what)
	}
	select {
	case r := <-got:
		t.Fatalf("the set answered while wk/e was held: %v, %v", r.resp, r.err)
	default:
	}
	release("wk/e", e)
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if resp := r.resp.(*streams.SetLeaseResponse); len(resp.Resources) != len(set) {
			t.Fatalf("granted %+v", resp)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the set was not granted once its last key freed")
	}
}
