package load

import (
	"sync/atomic"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Losses counts, from the answers, the leases the workload lost and the
// acquires the service shed. A lease counts once however many of its
// renewals failed. Subtract two readings (Sub) for one phase's counts.
type Losses struct {
	// LeaseLost counts leases whose renewal was answered lease_lost: the
	// service ended a lease its holder was renewing.
	LeaseLost int64 `json:"lease_lost"`
	// Expired counts leases whose renewals did not succeed until their TTL
	// had passed, counted from the send of the last request that
	// succeeded (the grant's first try, or a renewal): the holder can no
	// longer prove it holds the lease, which is when a client (the Go
	// client's Lost()) gives it up, whatever the service answers later.
	Expired int64 `json:"expired"`
	// AcquiresShed counts acquires (first tries) answered unavailable
	// with retry_after_ms: shed by an overloaded service, or over a
	// fair-use rate. RetriesShed counts their retries answered so.
	AcquiresShed int64 `json:"acquires_shed"`
	RetriesShed  int64 `json:"retries_shed"`
}

// Leases returns the leases lost in either way.
func (l Losses) Leases() int64 { return l.LeaseLost + l.Expired }

// Sub returns l less earlier.
func (l Losses) Sub(earlier Losses) Losses {
	return Losses{LeaseLost: l.LeaseLost - earlier.LeaseLost, Expired: l.Expired - earlier.Expired,
		AcquiresShed: l.AcquiresShed - earlier.AcquiresShed, RetriesShed: l.RetriesShed - earlier.RetriesShed}
}

// losses holds the workload's counts.
type losses struct {
	leaseLost, expired, acquiresShed, retriesShed atomic.Int64
}

// Losses returns the workload's counts so far. Call Overdue first to count
// the leases whose renewals are still failing past their TTL.
func (w *Workload) Losses() Losses {
	return Losses{LeaseLost: w.lost.leaseLost.Load(), Expired: w.lost.expired.Load(),
		AcquiresShed: w.lost.acquiresShed.Load(), RetriesShed: w.lost.retriesShed.Load()}
}

// shed counts an acquire answered unavailable with retry_after_ms.
func (w *Workload) shed(res Result, retry bool) {
	if res.Code != streams.CodeUnavailable || res.RetryAfter <= 0 {
		return
	}
	if retry {
		w.lost.retriesShed.Add(1)
	} else {
		w.lost.acquiresShed.Add(1)
	}
}

// renewOutcome counts the loss a renewal's answer at shows, once per lease;
// sent is when the renewal went out. The caller holds w.mu.
func (w *Workload) renewOutcome(id int32, code string, sent, at time.Time) {
	s := &w.slots[id]
	if !s.lost {
		switch {
		case code == streams.CodeLeaseLost:
			s.lost = true
			w.lost.leaseLost.Add(1)
		case !s.okAt.IsZero() && at.Sub(s.okAt) > w.cfg.TTL:
			s.lost = true
			w.lost.expired.Add(1)
		}
	}
	if code == CodeOK {
		s.okAt = sent
	}
}

// Overdue counts as lost the leases held or being renewed whose last
// successful write was sent more than a TTL before now: their renewals
// kept failing (or were never sent) until the TTL passed. Call it at the
// end of a phase, after Drain.
func (w *Workload) Overdue(now time.Time) {
	if w.raw() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.slots {
		s := &w.slots[i]
		if (s.state == stHeld || s.state == stRenewing) && !s.lost && !s.okAt.IsZero() && now.Sub(s.okAt) > w.cfg.TTL {
			s.lost = true
			w.lost.expired.Add(1)
		}
	}
}
