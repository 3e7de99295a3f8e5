package service

import (
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
