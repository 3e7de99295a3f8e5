package service

import "github.com/jetlock/jetlock/streams"

// The waiter caps (MaxWaitersPerResource, MaxWaitersPerTenant) count the
// records the tracker knows and the places this instance is writing right
// now: a place is reserved before its record's write and counted until
// the tracker takes the record in (or the write fails). So waits that
// arrive at once on one instance never pass a cap between their checks
// and their writes. Across instances each counts what it has seen: see
// docs/waiting.md for how far over that can go.

// pendingWait is a place being written: its queue and tenant.
type pendingWait struct {
	enc, tenant string
}

// reserveWait reserves a new place at waiter key wkey for tenant, if the
// queue of its resource has fewer than perResource waiters and tenant,
// counting need places (this one and those the request takes with it
// after this one, for a set), at most perTenant. It returns the counts
// that refused it, with ok false.
func (t *tracker) reserveWait(wkey, tenant string, need, perResource, perTenant int) (onResource, ofTenant int, ok bool) {
	enc := resourceOf(wkey)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, had := t.pending[wkey]; had {
		return 0, 0, true
	}
	onResource = len(t.waiters[enc]) + t.pendingRes[enc]
	ofTenant = t.tenantWaits[tenant] + t.pendingTenant[tenant]
	if onResource >= perResource || ofTenant+need > perTenant {
		return onResource, ofTenant, false
	}
	t.pending[wkey] = pendingWait{enc: enc, tenant: tenant}
	t.pendingRes[enc]++
	t.pendingTenant[tenant]++
	return onResource, ofTenant, true
}

// unreserveWaits ends the reservations of wkeys, if they still stand.
func (t *tracker) unreserveWaits(wkeys ...string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range wkeys {
		t.unpendLocked(k)
	}
}

// unpendLocked ends the reservation of wkey; the caller holds t.mu.
func (t *tracker) unpendLocked(wkey string) {
	p, ok := t.pending[wkey]
	if !ok {
		return
	}
	delete(t.pending, wkey)
	if t.pendingRes[p.enc]--; t.pendingRes[p.enc] <= 0 {
		delete(t.pendingRes, p.enc)
	}
	if t.pendingTenant[p.tenant]--; t.pendingTenant[p.tenant] <= 0 {
		delete(t.pendingTenant, p.tenant)
	}
}

// reserveOrRefuse is reserveWait answering too_many_waiters when a cap
// refuses the place; resource names the queue in the answer.
func (l *nameOps) reserveOrRefuse(wkey, resource, tenant string, need int) error {
	cfg := l.cfg
	n, owned, ok := l.tracker.reserveWait(wkey, tenant, need, cfg.MaxWaitersPerResource, cfg.MaxWaitersPerTenant)
	switch {
	case ok:
		return nil
	case n >= cfg.MaxWaitersPerResource:
		return newOpError(streams.CodeTooManyWaiters, "resource %q has %d waiters, the cap", resource, n)
	case need > 1:
		return newOpError(streams.CodeTooManyWaiters, "this NATS user has %d waiting acquires and the set needs %d more: the cap is %d", owned, need, cfg.MaxWaitersPerTenant)
	default:
		return newOpError(streams.CodeTooManyWaiters, "this NATS user has %d waiting acquires, the cap", owned)
	}
}
