package service

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jetlock/jetlock/streams"
)

// commitCount returns how many writes of kind op s has committed.
func commitCount(s *Service, op string) uint64 {
	var m dto.Metric
	if err := s.metrics.commitTime.WithLabelValues(op).(prometheus.Metric).Write(&m); err != nil {
		panic(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// Acquires of a semaphore that wait for its lock while another holds it
// are granted in one commit: the holder's grant takes them in, oldest
// first, as many as there are free permits, each a permit of its own, and
// each answers without a write of its own. The semaphore is never over
// its limit: of six acquires of five permits, the sixth, which the batch
// cannot serve, is refused (it does not wait) once the five are held.
func TestPermitsAreGrantedInBulk(t *testing.T) {
	s, _ := runInternal(t, DefaultConfig())
	grantsBefore, putsBefore := commitCount(s, "grant"), commitCount(s, "put")
	const sem, limit, callers = "bulk", 5, 6
	queue := streams.LeaseKey(streams.PermitQueue(sem))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Hold the semaphore's lock, as a request committing a grant does.
	st, err := s.locks.lock(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code string
		resp streams.LeaseResponse
	}
	answers := make(chan answer, callers)
	for i := range callers {
		go func() {
			code, body, err := ask(s.nc, streams.OpAcquire, streams.AcquireRequest{Resource: sem, Limit: limit, RequestID: fmt.Sprintf("c%d", i), TTLms: 30000})
			if err != nil {
				t.Error(err)
			}
			var a answer
			a.code = code
			json.Unmarshal(body, &a.resp)
			answers <- a
		}()
	}
	waitFor(t, 20*time.Second, func() bool {
		s.locks.sems.joins.mu.Lock()
		defer s.locks.sems.joins.mu.Unlock()
		return len(s.locks.sems.joins.byKey[queue]) == callers
	}, "every acquire waits for the semaphore's lock")
	st.unlock()
	permits := map[int]bool{}
	refused := 0
	for range callers {
		a := <-answers
		switch {
		case a.code == "" && !permits[a.resp.Permit] && a.resp.Permit >= 1 && a.resp.Permit <= limit:
			permits[a.resp.Permit] = true
		case a.code == streams.CodeLocked:
			refused++
		default:
			t.Errorf("answer %q %+v (permits so far %v)", a.code, a.resp, permits)
		}
	}
	if len(permits) != limit || refused != 1 {
		t.Fatalf("%d permits granted, %d refused; want %d and 1", len(permits), refused, limit)
	}
	// The first to get the lock granted itself and the four others: one
	// batch, no single grant.
	if grants, puts := commitCount(s, "grant")-grantsBefore, commitCount(s, "put")-putsBefore; grants != 1 || puts != 0 {
		t.Fatalf("%d batches of grants and %d single writes; want the five grants in one batch", grants, puts)
	}
	s.locks.sems.joins.mu.Lock()
	defer s.locks.sems.joins.mu.Unlock()
	if left := len(s.locks.sems.joins.byKey[queue]); left != 0 {
		t.Fatalf("pending acquires left: %d", left)
	}
}

// Waiting acquires of a full semaphore that wait for its lock while
// another holds it are queued in one commit: the holder that finds no
// free permit writes its waiter record and theirs in one batch, in the
// order they came (their tickets). Released, the permits go to them in
// that order, one hand-over each, never more holders than the limit.
func TestWaitsAreQueuedInBulk(t *testing.T) {
	s, _ := runInternal(t, DefaultConfig())
	const sem, limit, waiting = "bulkq", 2, 5
	queue := streams.LeaseKey(streams.PermitQueue(sem))
	var held []streams.LeaseResponse
	for i := range limit {
		code, body, err := ask(s.nc, streams.OpAcquire, streams.AcquireRequest{Resource: sem, Limit: limit, RequestID: fmt.Sprintf("h%d", i), TTLms: 30000})
		var l streams.LeaseResponse
		if err != nil || code != "" || json.Unmarshal(body, &l) != nil {
			t.Fatalf("holder %d: %q %s %v", i, code, body, err)
		}
		held = append(held, l)
	}
	enqueuesBefore, putsBefore := commitCount(s, "enqueue"), commitCount(s, "put")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := s.locks.lock(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan streams.LeaseResponse, waiting)
	for i := range waiting {
		go func() {
			code, body, err := ask(s.nc, streams.OpAcquire, streams.AcquireRequest{Resource: sem, Limit: limit, RequestID: fmt.Sprintf("w%d", i), TTLms: 30000, WaitMs: 50000})
			var l streams.LeaseResponse
			if err != nil || code != "" || json.Unmarshal(body, &l) != nil {
				t.Errorf("waiter %d: %q %s %v", i, code, body, err)
			}
			granted <- l
		}()
	}
	waitFor(t, 20*time.Second, func() bool {
		s.locks.sems.joins.mu.Lock()
		defer s.locks.sems.joins.mu.Unlock()
		return len(s.locks.sems.joins.byKey[queue]) == waiting
	}, "every waiting acquire waits for the semaphore's lock")
	st.unlock()
	waitFor(t, 20*time.Second, func() bool {
		n, _ := s.tracker.waiterCounts(streams.EncodeResource(streams.PermitQueue(sem)), "")
		return n == waiting
	}, "every waiting acquire queued")
	if enq, puts := commitCount(s, "enqueue")-enqueuesBefore, commitCount(s, "put")-putsBefore; enq != 1 || puts != 0 {
		t.Fatalf("%d batches of waiter records and %d single writes; want the %d records in one batch", enq, puts, waiting)
	}
	// Release the permits as they are granted: each goes to the next
	// waiter; at most limit are held at once.
	for _, l := range held {
		if code, body, err := ask(s.nc, streams.OpRelease, streams.ReleaseRequest{Resource: sem, Permit: l.Permit, LeaseID: l.LeaseID}); err != nil || code != "" {
			t.Fatalf("release: %q %s %v", code, body, err)
		}
	}
	for range waiting {
		l := <-granted
		if l.Permit < 1 || l.Permit > limit {
			t.Fatalf("granted %+v", l)
		}
		if code, body, err := ask(s.nc, streams.OpRelease, streams.ReleaseRequest{Resource: sem, Permit: l.Permit, LeaseID: l.LeaseID}); err != nil || code != "" {
			t.Fatalf("release: %q %s %v", code, body, err)
		}
	}
}

// Hand-overs that run at once on one queue (the ends of several permits
// of a semaphore, each under its own permit's lock) go to distinct
// waiters, oldest first, instead of all to the head; a waiter whose
// hand-over has ended is the head again for the next one.
func TestConcurrentHandOversPickDistinctWaiters(t *testing.T) {
	tr := newTracker(time.Second, time.Minute, time.Minute)
	enc := streams.EncodeResource(streams.PermitQueue("hq"))
	for i, h := range []string{"w1", "w2", "w3"} {
		tr.observe(streams.WaitKeyPrefix+enc+"."+h, entry{rev: uint64(10 + i), rec: &streams.Record{RequestID: h, Wake: "wake." + h}})
	}
	var hd handing
	var got []string
	for range 3 {
		w, ok := hd.next(tr, enc, nil)
		if !ok {
			t.Fatalf("no waiter after %v", got)
		}
		got = append(got, w.hash)
	}
	if fmt.Sprint(got) != "[w1 w2 w3]" {
		t.Fatalf("hand-overs at once went to %v; want [w1 w2 w3]", got)
	}
	if w, ok := hd.next(tr, enc, nil); ok {
		t.Fatalf("a fourth hand-over at once picked %s, whose hand-over runs", w.hash)
	}
	hd.done(enc, "w2")
	if w, ok := hd.next(tr, enc, []string{"w1"}); !ok || w.hash != "w2" {
		t.Fatalf("after w2's hand-over ended: %v %v; want w2", w.hash, ok)
	}
	for _, h := range []string{"w1", "w2", "w3"} {
		hd.done(enc, h)
	}
	if len(hd.byQueue) != 0 {
		t.Fatalf("marks left: %v", hd.byQueue)
	}
}
