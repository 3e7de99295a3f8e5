package load

import (
	"testing"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// A lease counts as lost once: when a renewal is answered lease_lost, or
// when its renewals have not succeeded for longer than its TTL, whatever
// comes after.
func TestLossesCountEachLeaseOnce(t *testing.T) {
	w := NewWorkload(Config{Resources: 4, TTL: 30 * time.Second, RenewInterval: 10 * time.Second}, &Service{}, nil, nil)
	t0 := time.Now()
	for id := range int32(4) {
		w.slots[id].okAt = t0
		w.toHeld(id, t0)
	}
	// 0: renewed in time, then answered lease_lost twice.
	w.renewOutcome(0, CodeOK, t0.Add(10*time.Second), t0.Add(10*time.Second))
	w.renewOutcome(0, streams.CodeLeaseLost, t0.Add(20*time.Second), t0.Add(20*time.Second))
	w.renewOutcome(0, streams.CodeLeaseLost, t0.Add(21*time.Second), t0.Add(21*time.Second))
	// 1: unavailable until past its TTL, then renewed after all.
	w.renewOutcome(1, streams.CodeUnavailable, t0.Add(10*time.Second), t0.Add(11*time.Second))
	w.renewOutcome(1, streams.CodeUnavailable, t0.Add(25*time.Second), t0.Add(31*time.Second))
	w.renewOutcome(1, CodeOK, t0.Add(31*time.Second), t0.Add(32*time.Second))
	// 2: renewed in time, with a slow answer inside the TTL.
	w.renewOutcome(2, CodeOK, t0.Add(10*time.Second), t0.Add(29*time.Second))
	// 3: never renewed: overdue at the end.
	if l := w.Losses(); l.LeaseLost != 1 || l.Expired != 1 {
		t.Fatalf("losses %+v, want 1 lease_lost and 1 expired", l)
	}
	before := w.Losses()
	w.Overdue(t0.Add(35 * time.Second)) // 2's last success was sent at 10s: not overdue; 3's at 0
	if l := w.Losses().Sub(before); l.Expired != 1 || l.LeaseLost != 0 || l.Leases() != 1 {
		t.Fatalf("overdue %+v, want lease 3 alone", l)
	}
	w.Overdue(t0.Add(36 * time.Second))
	if l := w.Losses(); l.Leases() != 3 {
		t.Fatalf("losses %+v after a second sweep, want 3 leases", l)
	}
}

// An acquire answered unavailable with retry_after_ms counts as shed; one
// without (the store did not answer) does not.
func TestShedNeedsRetryAfter(t *testing.T) {
	w := NewWorkload(Config{Resources: 1}, &Service{}, nil, nil)
	w.shed(Result{Code: streams.CodeUnavailable, RetryAfter: 250 * time.Millisecond}, false)
	w.shed(Result{Code: streams.CodeUnavailable, RetryAfter: 250 * time.Millisecond}, true)
	w.shed(Result{Code: streams.CodeUnavailable}, false)
	w.shed(Result{Code: streams.CodeLocked}, false)
	if l := w.Losses(); l.AcquiresShed != 1 || l.RetriesShed != 1 {
		t.Fatalf("shed %+v", l)
	}
	if d := retryDelay(250*time.Millisecond, 3*time.Second); d != 1250*time.Millisecond {
		t.Fatalf("retry delay %v", d)
	}
}
