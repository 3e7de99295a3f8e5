package service

import "github.com/jetlock/jetlock/streams"

// The waiter caps (MaxWaitersPerResource, MaxWaitersPerTenant) count the
// records the tracker knows and the places this instance is writing right
// now: a place is reserved before its record's write and counted until
// the tracker takes the record in (or the write fails). So waits that
// arrive at once on one instance never pass a cap between their checks
// and their writes. Across instances each counts what it has seen: see
// docs/waiting.md for how far over that can go.

// waitCaps counts the places this instance is writing, for the waiter
// caps.
type waitCaps struct {
	// t is the tracker whose mu guards the index.
	t *tracker
	// pending holds the places this instance is writing, by waiter key,
	// and counts them by queue and tenant, for the caps.
	pending       map[string]pendingWait
	pendingRes    map[string]int
	pendingTenant map[string]int
}

// pendingWait is a place being written: its queue and tenant.
type pendingWait struct {
	enc, tenant string
}

// reserveWait reserves a new place at waiter key wkey for tenant, if the
// queue of its resource has fewer than perResource waiters and tenant,
// counting need places (this one and those the request takes with it
// after this one, for a set), at most perTenant. It returns the counts
// that refused it, with ok false.
func (c *waitCaps) reserveWait(wkey, tenant string, need, perResource, perTenant int) (onResource, ofTenant int, ok bool) {
	enc := resourceOf(wkey)
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	if _, had := c.pending[wkey]; had {
		return 0, 0, true
	}
	onResource = len(c.t.waiters[enc]) + c.pendingRes[enc]
	ofTenant = c.t.tenantWaits[tenant] + c.pendingTenant[tenant]
	if onResource >= perResource || ofTenant+need > perTenant {
		return onResource, ofTenant, false
	}
	c.pending[wkey] = pendingWait{enc: enc, tenant: tenant}
	c.pendingRes[enc]++
	c.pendingTenant[tenant]++
	return onResource, ofTenant, true
}

// unreserveWaits ends the reservations of wkeys, if they still stand.
func (c *waitCaps) unreserveWaits(wkeys ...string) {
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	for _, k := range wkeys {
		c.unpendLocked(k)
	}
}

// unpendLocked ends the reservation of wkey; the caller holds t.mu.
func (c *waitCaps) unpendLocked(wkey string) {
	p, ok := c.pending[wkey]
	if !ok {
		return
	}
	delete(c.pending, wkey)
	if c.pendingRes[p.enc]--; c.pendingRes[p.enc] <= 0 {
		delete(c.pendingRes, p.enc)
	}
	if c.pendingTenant[p.tenant]--; c.pendingTenant[p.tenant] <= 0 {
		delete(c.pendingTenant, p.tenant)
	}
}

// reserveOrRefuse is reserveWait answering too_many_waiters when a cap
// refuses the place; resource names the queue in the answer.
func (l *nameOps) reserveOrRefuse(wkey, resource, tenant string, need int) error {
	cfg := l.cfg
	n, owned, ok := l.tracker.caps.reserveWait(wkey, tenant, need, cfg.MaxWaitersPerResource, cfg.MaxWaitersPerTenant)
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
