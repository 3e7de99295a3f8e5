package service

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Counting semaphores. A semaphore of N permits is N leases: permit k of
// resource r is the lease of the internal resource "r#k"
// (streams.PermitResource), at a key of its own, so every permit has its
// own fencing tokens and expires, renews and ends exactly as any lease
// does. Its waiters share one FIFO queue, that of "r#"
// (streams.PermitQueue): the end of a permit hands it to the head waiter
// in the same write (handover.go), so a release wakes one waiter. A
// request for a semaphore is a grantReq whose resource and key are the
// queue's (the queue key itself is never written; it serialises the
// semaphore's decisions on this instance) and whose limit is N.
//
// Every holder and waiter must agree on N: each permit's record and each
// waiter's carries it, and a request naming another N is invalid_request.

// queueOf returns the encoded resource whose queue serves lease key key:
// its own, or for a permit, its semaphore's.
func queueOf(key string) string {
	enc := resourceOf(key)
	if !strings.Contains(enc, "=23") { // '#'
		return enc
	}
	if sem, _, ok := streams.SplitPermit(decodedResource(enc)); ok {
		return streams.EncodeResource(streams.PermitQueue(sem))
	}
	return enc
}

// queueResource returns the resource whose queue serves the (decoded)
// resource res: its own, or for a permit, its semaphore's queue.
func queueResource(res string) string {
	if sem, _, ok := streams.SplitPermit(res); ok {
		return streams.PermitQueue(sem)
	}
	return res
}

// permitKeys returns the keys of the permits of semaphore sem.
func permitKey(sem string, k int) string { return streams.LeaseKey(streams.PermitResource(sem, k)) }

// semaphoreLimit returns the limit the holders and waiters of semaphore
// sem agree on, as this instance knows them, or 0 when none is known.
func (l *locks) semaphoreLimit(sem string, hint int) int {
	if w, ok := l.tracker.head(streams.EncodeResource(streams.PermitQueue(sem))); ok && w.limit != 0 {
		return w.limit
	}
	// The permits above hint would be held only under a larger limit:
	// looking at the first hint+1 is enough to tell a mismatch.
	for k := 1; k <= min(hint+1, streams.MaxLimit); k++ {
		if o, ok := l.tracker.get(permitKey(sem, k)); ok && o.held() && o.rec.Limit != 0 {
			return o.rec.Limit
		}
	}
	return 0
}

// trySem makes one decision on the acquire of a permit of g.sem: return
// the request's permit if it holds one, grant a free permit if the
// waiters ahead leave one, or refuse. The caller holds the queue key's
// lock.
func (l *locks) trySem(ctx context.Context, g *grantReq, fresh bool) (*streams.LeaseResponse, error) {
	if n := l.semaphoreLimit(g.sem, g.limit); n != 0 && n != g.limit {
		return nil, newOpError(streams.CodeInvalidRequest, "semaphore %q has limit %d; this request says %d", g.sem, n, g.limit)
	}
	var sess observation
attempts:
	for attempt := 0; attempt < attempts(g.session); attempt++ {
		if g.session != "" {
			var err error
			if sess, err = l.session(ctx, g, fresh); err != nil {
				return nil, err
			}
		}
		now := time.Now()
		var free []int
		var frees []observation
		for k := 1; k <= g.limit; k++ {
			key := permitKey(g.sem, k)
			if l.tracker.hasEnded(key, g.requestID, g.tenant) {
				return nil, leaseEnded(g.requestID)
			}
			o, err := l.current(ctx, key, fresh)
			if err != nil {
				return nil, err
			}
			if o.held() && g.mine(o.rec) {
				resp, err := l.sameRequest(ctx, g.permit(k), o, sess.rec)
				if errors.Is(err, errConflict) {
					fresh = true
					continue attempts
				}
				return permitResponse(resp, g.sem, k), err
			}
			if (!o.held() && !o.foreign) || l.tracker.expired(o, now) {
				free, frees = append(free, k), append(frees, o)
			}
		}
		if len(free) == 0 {
			return nil, newOpError(streams.CodeLocked, "all %d permits of semaphore %q are held", g.limit, g.sem)
		}
		if ahead, _, _ := l.tracker.ahead(streams.EncodeResource(g.resource), g.hash); ahead >= len(free) {
			return nil, newOpError(streams.CodeLocked, "the %d free permits of semaphore %q are reserved for the %d waiters ahead", len(free), g.sem, ahead)
		}
		if err := l.guard.grants(); err != nil {
			return nil, err
		}
		if g.session != "" {
			if err := l.sessionRoom(g.session); err != nil {
				return nil, err
			}
		}
		k := free[0]
		resp, err := l.grant(ctx, g.permit(k), frees[0], sess)
		if errors.Is(err, errConflict) {
			l.report.conflict()
			fresh = true
			continue
		}
		return permitResponse(resp, g.sem, k), err
	}
	return nil, tooManyConflicts()
}

// permitResponse names the semaphore and permit k in resp, the grant of
// permit k's internal resource: of the permit resp names, when it names
// one of sem (an earlier attempt's grant, see grantAt, may hold another
// permit than the one this attempt picked).
func permitResponse(resp *streams.LeaseResponse, sem string, k int) *streams.LeaseResponse {
	if resp != nil {
		if s, n, ok := streams.SplitPermit(resp.Resource); ok && s == sem {
			k = n
		}
		resp.Resource, resp.Permit = sem, k
	}
	return resp
}

// permit returns g narrowed to permit k of its semaphore.
func (g *grantReq) permit(k int) *grantReq {
	pg := *g
	pg.resource, pg.key = streams.PermitResource(g.sem, k), permitKey(g.sem, k)
	return &pg
}

// permitsOf returns the permits of g's semaphore where the write at seq
// may have granted g's request: the permit that write took, found by its
// revision, or, when the stream no longer holds that write (the lease was
// renewed since) or seq is 0 (an atomic batch's duplicate does not say),
// every permit.
func (l *locks) permitsOf(ctx context.Context, g *grantReq, seq uint64) ([]*grantReq, error) {
	if seq != 0 {
		key, err := l.store.keyAt(ctx, seq)
		if err != nil {
			return nil, err
		}
		if key != "" {
			if sem, k, ok := streams.SplitPermit(decodedResource(resourceOf(key))); ok && sem == g.sem && k <= g.limit && key == permitKey(sem, k) {
				return []*grantReq{g.permit(k)}, nil
			}
			return nil, nil // a cancel's tombstone, or another key: no permit
		}
	}
	all := make([]*grantReq, 0, g.limit)
	for k := 1; k <= g.limit; k++ {
		all = append(all, g.permit(k))
	}
	return all, nil
}

// heldPermit returns the permit of semaphore sem of limit n that the
// request of hash holds, as the tracker knows it, or 0.
func (l *locks) heldPermit(sem string, limit int, requestID, tenant string) int {
	for k := 1; k <= limit; k++ {
		if o, ok := l.tracker.get(permitKey(sem, k)); ok && o.held() && o.rec.RequestID == requestID && o.rec.Tenant == tenant {
			return k
		}
	}
	return 0
}

// cancelSem makes sure the request for a permit of semaphore sem holds
// nothing and waits for nothing (see cancel).
func (l *locks) cancelSem(ctx context.Context, sem string, limit int, requestID string, who origin) (*streams.CancelResponse, error) {
	queue := streams.PermitQueue(sem)
	key, hash := streams.LeaseKey(queue), requestHash(queue, requestID, who.tenant())
	st, err := l.lock(ctx, key)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	// The tombstone carries the grant's message id: refused as a
	// duplicate, it proves the request was granted (or cancelled before),
	// and the permit is then looked for on fresh reads, not only in this
	// instance's view, which may have missed the grant.
	granted := false
	for attempt := 0; ; attempt++ {
		if attempt == maxAttempts {
			return nil, tooManyConflicts()
		}
		o, err := l.current(ctx, key, true)
		if err != nil {
			return nil, err
		}
		_, dup, err := l.store.tombstone(ctx, hash, key, o.rev)
		if errors.Is(err, errConflict) {
			continue
		}
		if err != nil {
			return nil, err
		}
		granted = dup
		break
	}
	released, err := l.cancelPermit(ctx, sem, limit, requestID, who, granted)
	if err != nil {
		return nil, err
	}
	dequeued, err := l.dequeue(ctx, queue, streams.WaitKey(queue, hash))
	if err != nil {
		return nil, err
	}
	l.report.cancelled(sem, released, dequeued, who)
	return &streams.CancelResponse{Resource: sem, Cancelled: released || dequeued}, nil
}

// cancelPermit ends the permit of semaphore sem that the request holds, if
// any: as this instance knows the permits, or on a fresh read of each when
// the request is known to have been granted. The caller has written the
// request's tombstone and holds the queue key's lock.
func (l *locks) cancelPermit(ctx context.Context, sem string, limit int, requestID string, who origin, granted bool) (bool, error) {
	k := l.heldPermit(sem, limit, requestID, who.tenant())
	for j := 1; k == 0 && granted && j <= limit; j++ {
		o, err := l.current(ctx, permitKey(sem, j), true)
		if err != nil {
			return false, err
		}
		if o.held() && o.rec.RequestID == requestID && o.rec.Tenant == who.tenant() {
			k = j
		}
	}
	if k == 0 {
		return false, nil
	}
	res, key := streams.PermitResource(sem, k), permitKey(sem, k)
	st, err := l.lock(ctx, key)
	if err != nil {
		return false, err
	}
	defer st.unlock()
	tenant := who.tenant()
	e, err := l.endIf(ctx, res, key, func(rec *streams.Record) bool { return rec.RequestID == requestID && rec.Tenant == tenant }, endCancel, who, "")
	return e != nil, err
}

// semaphoreStatus reports the permits of semaphore sem of limit n as this
// instance knows them, as who may see them.
func (l *locks) semaphoreStatus(sem string, limit int, who origin) (*streams.SemaphoreStatus, error) {
	if n := l.semaphoreLimit(sem, limit); n != 0 && n != limit {
		return nil, newOpError(streams.CodeInvalidRequest, "semaphore %q has limit %d; this request says %d", sem, n, limit)
	}
	resp := &streams.SemaphoreStatus{Resource: sem, Limit: limit, Permits: []streams.PermitInfo{}}
	resp.Waiters, _ = l.tracker.waiterCounts(streams.EncodeResource(streams.PermitQueue(sem)), "")
	now := time.Now()
	for k := 1; k <= limit; k++ {
		o, ok := l.tracker.get(permitKey(sem, k))
		if !ok || !o.held() || l.tracker.expired(o, now) {
			continue
		}
		resp.Permits = append(resp.Permits, streams.PermitInfo{Permit: k, Owner: ownerFor(o.rec, who), Token: o.rec.TokenAt(o.rev), ExpiresAt: o.rec.ExpiresAt})
	}
	resp.HeldPermits = len(resp.Permits)
	return resp, nil
}
