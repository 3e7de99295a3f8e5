package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetlock/jetlock/streams"
)

// A cancel that arrives between a waiter's "locked" answer and its waiter
// write finds no record to remove; the waiter, once it has written its
// record, finds the cancel's tombstone and stops at once (lease_lost)
// instead of sitting out its wait.
func TestCancelBeforeTheWaiterWriteWins(t *testing.T) {
	s, req := runInternal(t, DefaultConfig())
	var holder streams.LeaseResponse
	json.Unmarshal(req(streams.OpAcquire, streams.AcquireRequest{Resource: "cb", RequestID: "h"}).Data, &holder)
	c, err := s.decodeCall(streams.OpAcquire, []byte(`{"resource":"cb","request_id":"w","wait_ms":30000}`), origin{})
	if err != nil {
		t.Fatal(err)
	}
	g := c.grant
	w := s.locks.handover.newWaiter(g)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The waiter's first decision: locked. Not queued yet.
	st, err := s.locks.lock(ctx, g.key)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.locks.leases.tryGrant(ctx, g, false)
	st.unlock()
	var oe *opError
	if !errors.As(err, &oe) || oe.code != streams.CodeLocked {
		t.Fatalf("first decision: %v, want locked", err)
	}
	// The cancel comes now.
	if m := req(streams.OpCancel, streams.CancelRequest{Resource: "cb", RequestID: "w"}); m.Header.Get(streams.HeaderErrorCode) != "" {
		t.Fatalf("cancel: %s", m.Data)
	}
	// Then the waiter writes its record: it must find the cancel.
	st, err = s.locks.lock(ctx, g.key)
	if err != nil {
		t.Fatal(err)
	}
	err = w.enqueue(ctx)
	st.unlock()
	if !errors.As(err, &oe) || oe.code != streams.CodeLeaseLost {
		t.Fatalf("queueing after the cancel: %v, want lease_lost", err)
	}
	if e, err := s.store.read(ctx, w.wkey); err != nil || e.held() {
		t.Fatalf("the cancelled waiter's record stays: %+v %v", e, err)
	}
}

// A wait that ends with an error removes its waiter record, so that a
// dead record never delays the next claimant (nor receives the resource
// by hand-over). Here grants are refused while the waiter waits (the
// stream went below the high-water mark); its next step fails.
func TestWaitEndingWithAnErrorRemovesItsRecord(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Recheck = 200 * time.Millisecond
	s, req := runInternal(t, cfg)
	json.Unmarshal(req(streams.OpAcquire, streams.AcquireRequest{Resource: "we", RequestID: "h"}).Data, new(streams.LeaseResponse))
	type answer struct {
		m   *nats.Msg
		err error
	}
	got := make(chan answer, 1)
	go func() {
		data, _ := json.Marshal(streams.AcquireRequest{Resource: "we", RequestID: "w", WaitMs: 20000})
		m, err := s.nc.Request(streams.Subject("jetlock", streams.OpAcquire), data, 25*time.Second)
		got <- answer{m, err}
	}()
	wkey := streams.WaitKey("we", requestHash("we", "w", ""))
	waitFor(t, 10*time.Second, func() bool { o, ok := s.tracker.get(wkey); return ok && o.held() }, "the waiter queued")
	// As if the stream had gone back below the high-water mark: grants
	// are refused. The floor is raised too, or the guard's next round
	// would see the stream above it and grant again.
	s.store.floor.Store(1 << 62)
	s.guard.below.Store(true)
	a := <-got
	if a.err != nil {
		t.Fatalf("waiter: %v", a.err)
	}
	m := a.m
	if code := m.Header.Get(streams.HeaderErrorCode); code != "503" {
		t.Fatalf("waiter answered %q %s, want unavailable", code, m.Data)
	}
	e, err := s.store.read(context.Background(), wkey)
	if err != nil || e.held() {
		t.Fatalf("the failed waiter's record stays: %+v %v", e, err)
	}
}

// What callers ask about costs the tracker nothing: a key never written
// is not kept, and a deleted key is forgotten after the retry window.
func TestTrackerKeepsOnlyWhatTheBucketHolds(t *testing.T) {
	tr := newTracker(0, time.Minute, 50*time.Millisecond)
	for i := range 10_000 {
		tr.observe(streams.LeaseKey(fmt.Sprintf("never/%d", i)), entry{})
	}
	if n := len(tr.keys) + len(tr.deleted); n != 0 {
		t.Fatalf("%d keys kept for reads of keys never written", n)
	}
	for i := range 1000 {
		key := streams.LeaseKey(fmt.Sprintf("gone/%d", i))
		tr.observe(key, entry{rev: uint64(2*i + 1), rec: &streams.Record{LeaseID: "l", RequestID: "r", TTLms: 1000}})
		tr.observe(key, entry{rev: uint64(2*i + 2)})
	}
	if l, _ := tr.counts(); l != 0 {
		t.Fatalf("%d leases listed after every one was deleted", l)
	}
	time.Sleep(60 * time.Millisecond)
	tr.popDue(time.Now(), 4096)
	if n := len(tr.keys) + len(tr.deleted); n != 0 {
		t.Fatalf("%d deleted keys kept after the retry window", n)
	}
}

// A hot key holds a bounded number of places: beyond maxWaiting requests
// waiting for it, the next is refused at once, and a waiting request gives
// up at its deadline. Another key is not held up by it, whatever shard it
// shares with the hot one.
func TestKeyLocksBoundWaitingAndRespectDeadlines(t *testing.T) {
	p := newKeyLocks(2)
	ctx := context.Background()
	held, err := p.lock(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 2)
	for range 2 {
		go func() {
			st, err := p.lock(ctx, "hot")
			if err == nil {
				st.unlock()
			}
			waiting <- err
		}()
	}
	waitFor(t, 5*time.Second, func() bool {
		return p.waiting("hot") == 2
	}, "two requests wait")
	if _, err := p.lock(ctx, "hot"); !errors.Is(err, errBusy) || !errors.Is(err, errUnavailable) {
		t.Fatalf("a third waiter: %v, want busy", err)
	}
	for i := range 2 * keyLockShards {
		other, err := p.lock(ctx, fmt.Sprintf("other%d", i))
		if err != nil {
			t.Fatalf("another key beside the flooded one: %v", err)
		}
		other.unlock()
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	p2 := newKeyLocks(10)
	h2, _ := p2.lock(ctx, "k")
	if _, err := p2.lock(short, "k"); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errUnavailable) {
		t.Fatalf("a waiter past its deadline: %v", err)
	}
	h2.unlock()
	held.unlock()
	for range 2 {
		if err := <-waiting; err != nil {
			t.Fatal(err)
		}
	}
}

// stampedRequest is a request as micro hands it over, with the header the
// NATS server stamps and a reply subject.
type stampedRequest struct {
	testRequest
	info, reply string
}

func (r stampedRequest) Headers() micro.Headers {
	return micro.Headers{requestInfoHeader: []string{r.info}}
}
func (r stampedRequest) Reply() string { return r.reply }

// A sender whose account and user names are longer than a record may hold
// is refused before any work: a record with that tenant would read as
// foreign, nobody's lease, and block its key.
func TestOverlongTenantIsRefused(t *testing.T) {
	cl := startCluster(t)
	s, _ := startInstance(t, cl, DefaultConfig(), 0)
	sub, err := s.nc.SubscribeSync(streams.ServiceInboxPrefix + ".long")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(streams.AcquireRequest{Resource: "long/1", RequestID: "r1"})
	info := fmt.Sprintf(`{"acc":"CALLERS","user":%q}`, strings.Repeat("u", streams.MaxTenantLen))
	s.dispatch(streams.OpAcquire, stampedRequest{testRequest: testRequest{data: data}, info: info, reply: sub.Subject})
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "400" || !strings.Contains(string(m.Data), "at most 512") {
		t.Fatalf("acquire of an overlong tenant: %s %s", code, m.Data)
	}
	if o, ok := s.tracker.get(streams.LeaseKey("long/1")); ok && o.held() {
		t.Fatal("an acquire of an overlong tenant was granted")
	}
}
