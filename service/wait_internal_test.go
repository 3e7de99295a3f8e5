package service

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// A lost wake message (core NATS is at-most-once) never strands a waiter:
// its timer re-check claims the lock. The test loses the wake by
// unhooking the waiter's wake channel, so the message arrives and is
// dropped, exactly as if it had been lost on the wire.
func TestLostWakeIsRecoveredByRecheck(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Recheck = 500 * time.Millisecond
	s, req := runInternal(t, cfg)
	var holder streams.LeaseResponse
	json.Unmarshal(req(streams.OpAcquire, streams.AcquireRequest{Resource: "lw", RequestID: "h"}).Data, &holder)
	got := make(chan *nats.Msg, 1)
	go func() {
		got <- req(streams.OpAcquire, streams.AcquireRequest{Resource: "lw", RequestID: "w", WaitMs: 15000})
	}()
	dropWakes(t, s, "lw", "w")
	wakesBefore := testCounter(s.metrics.wakes)
	released := time.Now()
	req(streams.OpRelease, streams.ReleaseRequest{Resource: "lw", LeaseID: holder.LeaseID})
	select {
	case m := <-got:
		if m.Header.Get(streams.HeaderErrorCode) != "" {
			t.Fatalf("waiter: %s", m.Data)
		}
		if d := time.Since(released); d > cfg.Recheck+2*time.Second {
			t.Fatalf("granted %v after the release", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter stranded by the lost wake")
	}
	if testCounter(s.metrics.wakes) != wakesBefore+1 {
		t.Fatal("the release sent no wake, so none was lost: the test proves nothing")
	}
}

// dropWakes waits until the waiting acquire requestID is the only waiter
// queued on res, then unhooks its wake channel: wake messages still arrive
// and are dropped, exactly as if lost on the wire. It returns the channel
// it unhooked.
func dropWakes(t *testing.T, s *Service, res, requestID string) chan *streams.LeaseResponse {
	t.Helper()
	hash := requestHash(res, requestID, "")
	var wake chan *streams.LeaseResponse
	waitFor(t, 10*time.Second, func() bool {
		if n, _ := s.tracker.waiterCounts(streams.EncodeResource(res), ""); n != 1 {
			return false
		}
		s.wakes.mu.Lock()
		defer s.wakes.mu.Unlock()
		if wake = s.wakes.waiting[hash]; wake != nil {
			s.wakes.waiting[hash] = make(chan *streams.LeaseResponse) // unbuffered, never read
		}
		return wake != nil
	}, "waiter never queued")
	return wake
}

// The waiter k places behind the head may claim a free resource after k
// reservation periods, counted from when the resource became free or a
// waiter last left the queue, whichever is later; a request that is not
// queued comes after every waiter.
func TestClaimOrderFollowsTickets(t *testing.T) {
	const res = time.Hour // no real time passes in this test
	s := newLocks(&engineDeps{tracker: newTracker(0, time.Hour, time.Minute), cfg: Config{Reservation: res}})
	enc := streams.EncodeResource("r")
	queue := func(hash string, ticket uint64) {
		s.tracker.observe(streams.WaitKeyPrefix+enc+"."+hash, entry{rev: ticket, rec: &streams.Record{RequestID: hash, TTLms: 60000}})
	}
	queue("w1", 10)
	queue("w2", 11)
	queue("w3", 12)
	claims := func(hash string, freeFor time.Duration) (bool, int) {
		c := s.tracker.claim(enc, hash, observation{seen: time.Now().Add(-freeFor)}, s.cfg.Reservation)
		return c.ok, c.ahead
	}
	for _, c := range []struct {
		hash    string
		freeFor time.Duration
		ok      bool
		ahead   int
	}{
		{"w1", 0, true, 0},
		{"w2", 0, false, 1},
		{"w2", res + time.Minute, true, 1},
		{"w3", res + time.Minute, false, 2},
		{"w3", 2*res + time.Minute, true, 2},
		{"other", 2*res + time.Minute, false, 3},
		{"other", 3*res + time.Minute, true, 3},
	} {
		if ok, ahead := claims(c.hash, c.freeFor); ok != c.ok || ahead != c.ahead {
			t.Errorf("%s free for %v: may claim %v with %d ahead, want %v with %d", c.hash, c.freeFor, ok, ahead, c.ok, c.ahead)
		}
	}
	// The head leaves: w2 is the head, and w3's wait starts again from now.
	s.tracker.observe(streams.WaitKeyPrefix+enc+".w1", entry{rev: 13})
	if ok, _ := claims("w2", 0); !ok {
		t.Error("new head may not claim")
	}
	if ok, ahead := claims("w3", 5*res); ok || ahead != 1 {
		t.Errorf("w3 right after the head left: may claim %v with %d ahead", ok, ahead)
	}
}

// A woken waiter decides on a read from the stream leader, not on its
// watcher's view: after a leader change the watcher can lag by seconds,
// and a waiter that trusted it sat out the release it was woken for
// (found by TestWaiterCancelDuringFailover in CI). The test makes the
// tracker lag on purpose: after the release it puts back the holder's
// lease, as a watcher that never saw the release would have it, and then
// wakes the waiter. Re-checks and refreshes are an hour apart, so only
// the wake can grant.
func TestWokenWaiterReadsPastALaggingWatcher(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Recheck = time.Hour
	cfg.WaiterLiveness = 3 * time.Hour
	s, req := runInternal(t, cfg)
	var holder streams.LeaseResponse
	json.Unmarshal(req(streams.OpAcquire, streams.AcquireRequest{Resource: "lag", RequestID: "h"}).Data, &holder)
	key := streams.LeaseKey("lag")
	held, ok := s.tracker.get(key)
	if !ok || !held.held() {
		t.Fatal("the holder's lease is not tracked")
	}
	got := make(chan *nats.Msg, 1)
	go func() {
		got <- req(streams.OpAcquire, streams.AcquireRequest{Resource: "lag", RequestID: "w", WaitMs: 30000})
	}()
	hash := requestHash("lag", "w", "")
	wake := dropWakes(t, s, "lag", "w") // the release's own wake is dropped
	if m := req(streams.OpRelease, streams.ReleaseRequest{Resource: "lag", LeaseID: holder.LeaseID}); !strings.Contains(string(m.Data), `"released":true`) {
		t.Fatalf("release: %s", m.Data)
	}
	time.Sleep(300 * time.Millisecond) // the watcher has delivered the release by now
	s.tracker.mu.Lock()
	s.tracker.keys[key] = observation{entry: held.entry, seen: time.Now()} // as if it never had
	s.tracker.mu.Unlock()
	s.wakes.mu.Lock()
	s.wakes.waiting[hash] = wake
	s.wakes.mu.Unlock()
	s.wakes.send(s.wakes.subject(hash), nil) // a plain wake, as after a release it learned of late
	select {
	case m := <-got:
		if m.Header.Get(streams.HeaderErrorCode) != "" {
			t.Fatalf("waiter: %s", m.Data)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the woken waiter trusted its lagging watcher and was not granted")
	}
}

// A request whose cancel was answered never takes a place in a queue: a
// waiter record's new place commits only with the check that no cancel
// tombstone of its request stands (placeWrites), so the cancel is decided
// in that commit, not by a read after it (a leader cut off by a partition
// that has just healed answers such a read from old state). Each request
// here finds its tombstone written before it asks, as a cancel that came
// between its "locked" answer and its write leaves it: it is answered
// lease_lost and its wait keys are never written, for a lock, a permit
// and a lock set.
func TestACancelledRequestNeverTakesAPlace(t *testing.T) {
	s, req := runInternal(t, DefaultConfig())
	ctx := context.Background()
	st := s.locks.store
	for _, holder := range []streams.AcquireRequest{
		{Resource: "cq-lock", RequestID: "holder"},
		{Resource: "cq-sem", Limit: 1, RequestID: "holder"},
		{Resources: []string{"cq-a", "cq-b"}, RequestID: "holder"},
	} {
		if m := req(streams.OpAcquire, holder); m.Header.Get(streams.HeaderErrorCode) != "" {
			t.Fatalf("acquire %+v: %s", holder, m.Data)
		}
	}
	for _, w := range []streams.AcquireRequest{
		{Resource: "cq-lock", RequestID: "w", WaitMs: 5000},
		{Resource: "cq-sem", Limit: 1, RequestID: "w", WaitMs: 5000},
		{Resources: []string{"cq-a", "cq-b"}, RequestID: "w", WaitMs: 5000},
	} {
		data, _ := json.Marshal(w)
		c, err := s.decodeCall(streams.OpAcquire, data, origin{})
		if err != nil {
			t.Fatal(err)
		}
		hash, key, wkeys := "", "", []string(nil)
		if c.set != nil {
			hash, key = c.set.hashes[0], c.set.keys[0]
			for i, res := range c.set.resources {
				wkeys = append(wkeys, streams.WaitKey(res, c.set.hashes[i]))
			}
		} else {
			hash, key, wkeys = c.grant.hash, c.grant.key, []string{streams.WaitKey(c.grant.resource, c.grant.hash)}
		}
		held, err := st.read(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.tombstone(ctx, hash, check{key, held.rev}, check{wkeys[0], 0}); err != nil {
			t.Fatal(err)
		}
		var e streams.ErrorResponse
		if err := json.Unmarshal(req(streams.OpAcquire, w).Data, &e); err != nil || e.Error.Code != streams.CodeLeaseLost {
			t.Fatalf("the cancelled request %+v: %+v (%v), want lease_lost", w, e, err)
		}
		for _, k := range wkeys {
			if m, err := st.get(ctx, st.lastOf(k)); err != nil || m != nil {
				t.Fatalf("%+v: its wait key %s was written (%v): a cancelled request took a place", w, k, err)
			}
		}
	}
}

// An enqueue decides its request's cancel: a fresh read that found the
// request's tombstone answers lease_lost and writes nothing, for a new
// place as for the rewrite of a record that stands. Every record is
// planned with the check of the cancel key (nothing there: revision 0),
// so that once a tombstone stands only deletes reach the waiter key.
func TestAPlaceIsDecidedWithItsCancel(t *testing.T) {
	none := observation{}
	own := observation{entry: entry{rev: 7, rec: &streams.Record{RequestID: "r", Wake: "w"}}}
	for _, c := range []struct {
		name string
		s    waitSnap
		kind verdictKind
		plan enqueuePlan
	}{
		{"first place, cancelled", waitSnap{o: none, cancelled: true}, answerNow, 0},
		{"place gone, cancelled", waitSnap{o: none, mine: 5, cancelled: true}, answerNow, 0},
		{"first place", waitSnap{o: none}, writePlan, enqueueWrite},
		{"place gone", waitSnap{o: none, mine: 5}, writePlan, enqueueAgain},
		{"own record", waitSnap{o: own, mine: 7}, writePlan, enqueueWrite},
		{"own record, cancelled", waitSnap{o: own, mine: 7, cancelled: true}, answerNow, 0},
	} {
		v := decideEnqueue(c.s, "w", true)
		if v.kind != c.kind || v.kind == writePlan && v.plan != c.plan {
			t.Errorf("%s: verdict %+v, want kind %v plan %v", c.name, v, c.kind, c.plan)
		}
		if c.kind == answerNow && !isCode(v.err, streams.CodeLeaseLost) {
			t.Errorf("%s: answered %v, want lease_lost", c.name, v.err)
		}
	}
	for _, isNew := range []bool{true, false} {
		if v := decidePlaces(setPlaces{obs: []observation{own, own}, places: []uint64{7, 7}, isNew: isNew, cancelled: true}, &setReq{}, true); v.kind != answerNow || !isCode(v.err, streams.CodeLeaseLost) {
			t.Errorf("a set's places (new: %v) after a cancel: %+v, want lease_lost", isNew, v)
		}
	}
	rec := &streams.Record{RequestID: "r", Wake: "w"}
	for _, o := range []observation{none, own} {
		if ws := placeWrites("wait.k.h", rec, o, "h"); len(ws) != 2 || ws[0].expect != o.rev || !ws[1].check || ws[1].key != cancelKey("h") || ws[1].expect != 0 {
			t.Errorf("the writes of a record over revision %d: %+v, want it and the check of cancel.h at 0", o.rev, ws)
		}
	}
}

// A cancel's tombstone commits only with its reads: the lease key and the
// request's waiter key as read, so a read of the waiter key from a leader
// that is behind (here: revision 0, "no record", while one stands) is a
// conflict and writes nothing, never a cancel answered with its request
// left in the queue. Once the tombstone stands, the record can only be
// deleted: its rewrite (placeWrites) is refused. A tombstone of a request
// granted before is refused as the grant's duplicate and names its
// revision, and the mark, written instead, checks the same keys.
func TestATombstoneProvesTheWaiterKeyItRead(t *testing.T) {
	s, req := runInternal(t, DefaultConfig())
	ctx := context.Background()
	st := s.locks.store
	if m := req(streams.OpAcquire, streams.AcquireRequest{Resource: "tw", RequestID: "holder"}); m.Header.Get(streams.HeaderErrorCode) != "" {
		t.Fatalf("acquire: %s", m.Data)
	}
	key, hash := streams.LeaseKey("tw"), requestHash("tw", "w", origin{}.tenant())
	wkey := streams.WaitKey("tw", hash)
	lease, err := st.read(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	rec := &streams.Record{Owner: "o", RequestID: "w", Wake: "_INBOX.w", TTLms: 60_000}
	placed, _, err := st.put(ctx, wkey, rec, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.tombstone(ctx, hash, check{key, lease.rev}, check{wkey, 0}); !isConflict(err) {
		t.Fatalf("a tombstone on a stale read of the waiter key: %v, want a conflict", err)
	}
	if ok, err := st.exists(ctx, cancelKey(hash)); err != nil || ok {
		t.Fatalf("the refused tombstone was written (%v, %v)", ok, err)
	}
	if _, dup, err := st.tombstone(ctx, hash, check{key, lease.rev}, check{wkey, placed}); err != nil || dup {
		t.Fatalf("the tombstone on current reads: dup %v, %v", dup, err)
	}
	if _, _, err := st.commitWrites(ctx, "enqueue", placeWrites(wkey, rec, observation{entry: entry{rev: placed, rec: rec}}, hash)); !isConflict(err) {
		t.Fatalf("a record rewritten after its request's tombstone: %v, want a conflict", err)
	}
	if _, err := st.del(ctx, wkey, placed, nil); err != nil {
		t.Fatalf("the record's delete after the tombstone: %v", err)
	}

	var granted streams.LeaseResponse
	if err := json.Unmarshal(req(streams.OpAcquire, streams.AcquireRequest{Resource: "tw2", RequestID: "g"}).Data, &granted); err != nil || granted.Token == 0 {
		t.Fatalf("acquire: %+v %v", granted, err)
	}
	key2, hash2 := streams.LeaseKey("tw2"), requestHash("tw2", "g", origin{}.tenant())
	wkey2 := streams.WaitKey("tw2", hash2)
	lease2, err := st.read(ctx, key2)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.tombstone(ctx, hash2, check{key2, lease2.rev}, check{wkey2, 99}); !isConflict(err) {
		t.Fatalf("a granted request's mark on a stale read of its waiter key: %v, want a conflict", err)
	}
	seq, dup, err := st.tombstone(ctx, hash2, check{key2, lease2.rev}, check{wkey2, 0})
	if err != nil || !dup || seq != granted.Token {
		t.Fatalf("the tombstone of a granted request: seq %d dup %v %v, want the grant's revision %d as a duplicate", seq, dup, err, granted.Token)
	}
	if ok, err := st.exists(ctx, cancelKey(hash2)); err != nil || !ok {
		t.Fatalf("the granted request's mark was not written (%v, %v)", ok, err)
	}
}
