package service

import (
	"encoding/json"
	"testing"

	"github.com/jetlock/jetlock/streams"
)

// A retry of a semaphore acquire, decided on a view that lags (it still
// shows the request's permit held by its previous holder, as an instance
// whose watcher has not caught up does), picks another free permit. Its
// write carries the request's grant message id and is refused as a
// duplicate of the first attempt's grant: the answer is the permit the
// request holds, not lease_lost. Once that lease has been renewed, the
// first grant's write is no longer in the stream, and the permit is found
// among all of the semaphore's.
func TestSemaphoreRetryFindsItsPermit(t *testing.T) {
	s, _ := runInternal(t, DefaultConfig())
	const sem = "pool"
	acquire := func(requestID string) (streams.LeaseResponse, string) {
		t.Helper()
		code, body, err := ask(s.nc, streams.OpAcquire, streams.AcquireRequest{Resource: sem, RequestID: requestID, Limit: 2, TTLms: 30000})
		if err != nil {
			t.Fatal(err)
		}
		var resp streams.LeaseResponse
		if code == "" {
			if err := json.Unmarshal(body, &resp); err != nil {
				t.Fatal(err)
			}
		}
		return resp, code
	}
	key := permitKey(sem, 1)
	x, code := acquire("x")
	if code != "" || x.Permit != 1 {
		t.Fatalf("x: %q %+v", code, x)
	}
	stale, ok := s.tracker.get(key)
	if !ok || !stale.held() {
		t.Fatal("x's permit unknown")
	}
	if code, body, err := ask(s.nc, streams.OpRelease, streams.ReleaseRequest{Resource: sem, LeaseID: x.LeaseID, Permit: 1}); err != nil || code != "" {
		t.Fatalf("release x: %q %s %v", code, body, err)
	}
	first, code := acquire("a")
	if code != "" || first.Permit != 1 {
		t.Fatalf("a: %q %+v", code, first)
	}
	lag := func() {
		s.tracker.forget(key)
		s.tracker.observe(key, stale.entry)
		if o, _ := s.tracker.get(key); o.rev != stale.rev {
			t.Fatal("the lagging view did not take")
		}
	}

	lag()
	retry, code := acquire("a")
	if code != "" || retry.Permit != 1 || retry.LeaseID != first.LeaseID || retry.Token != first.Token {
		t.Fatalf("retry on a lagging view: %q %+v, want permit 1 of %+v", code, retry, first)
	}

	// Renewed, the first grant's write is replaced in the stream.
	if code, body, err := ask(s.nc, streams.OpRenew, streams.RenewRequest{Resource: sem, LeaseID: first.LeaseID, Permit: 1, TTLms: 30000}); err != nil || code != "" {
		t.Fatalf("renew: %q %s %v", code, body, err)
	}
	lag()
	retry, code = acquire("a")
	if code != "" || retry.Permit != 1 || retry.LeaseID != first.LeaseID || retry.Token != first.Token {
		t.Fatalf("retry of a renewed lease on a lagging view: %q %+v, want permit 1 of %+v", code, retry, first)
	}
	if o, ok := s.tracker.get(permitKey(sem, 2)); ok && o.held() {
		t.Fatalf("permit 2 was granted: %+v", o.rec)
	}
}
