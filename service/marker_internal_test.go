package service

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// A delete marker lives in the bucket for the retry window only; once it
// has expired, an acquire of its resource is granted even while the
// tracker still knows the marker (it forgets on its own clock, a little
// after the bucket does, and may learn the marker again meanwhile from a
// late read). Without that, every compare-and-set on the key expected the
// marker's revision, and the acquire was answered unavailable after
// maxAttempts lost attempts, again on every retry until the tracker forgot.
func TestAcquireAfterTheDeleteMarkerExpired(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Bucket.RetryWindow = time.Second
	s, send := runInternal(t, cfg)
	acquire := func(requestID string) streams.LeaseResponse {
		t.Helper()
		m := send(streams.OpAcquire, streams.AcquireRequest{Resource: "expired-marker", RequestID: requestID, Owner: "o"})
		var lease streams.LeaseResponse
		if err := json.Unmarshal(m.Data, &lease); err != nil || lease.LeaseID == "" {
			t.Fatalf("acquire %s: %s", requestID, m.Data)
		}
		return lease
	}
	lease := acquire("first")
	send(streams.OpRelease, streams.ReleaseRequest{Resource: "expired-marker", LeaseID: lease.LeaseID})
	key := streams.LeaseKey("expired-marker")
	marker, err := s.store.read(t.Context(), key)
	if err != nil || marker.rev == 0 || marker.held() {
		t.Fatalf("after the release: %+v %v, want a delete marker", marker, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if e, err := s.store.read(t.Context(), key); err == nil && e.rev == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the delete marker did not expire from the bucket")
		}
	}
	s.tracker.observe(key, marker) // known to the tracker still, or again
	if o, ok := s.tracker.get(key); !ok || o.rev != marker.rev {
		t.Fatalf("tracker: %+v %v, want the marker at %d", o, ok, marker.rev)
	}
	if again := acquire("second"); again.Token <= marker.rev {
		t.Fatalf("granted at %d, want above the marker's %d", again.Token, marker.rev)
	}
}
