package service

import (
	"context"
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

// semOps decides the requests on a semaphore's permits, and grants the
// acquires that joined one in bulk (sem_bulk.go).
type semOps struct {
	*engineDeps
	// the roles it reaches (see locks)
	leases   *leaseOps
	sessions *sessionOps
	handover *handoverOps
	names    *nameOps
	// joins are the acquires of permits waiting for their semaphore's
	// lock, which its holder may grant in its commit (sem_bulk.go).
	joins semJoins
}

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

// trySem makes one decision on the acquire of a permit of g.sem: return
// the request's permit if it holds one, grant a free permit if the
// waiters ahead leave one, or refuse. The caller holds the queue key's
// lock.
func (l *semOps) trySem(ctx context.Context, g *grantReq, fresh bool) (*streams.LeaseResponse, error) {
	if err := l.names.sameKind(g.sem, kindSemaphore, g.limit, ""); err != nil {
		return nil, err
	}
	return commitLoop(ctx, l.engineDeps, g.session, fresh, engineSteps[permitsRead, struct{}, *streams.LeaseResponse]{
		read: func(ctx context.Context, fresh bool) (permitsRead, bool, error) {
			return l.readPermits(ctx, g, fresh)
		},
		decide: func(p permitsRead, _ bool) verdict[*streams.LeaseResponse, struct{}] {
			return decidePermit(g, p)
		},
		prove: func(ctx context.Context, p permitsRead) (*streams.LeaseResponse, outcome, error) {
			resp, out, err := settled(l.leases.sameRequest(ctx, g.permit(p.mine), p.held))
			if out == conflicted {
				return nil, out, nil
			}
			return permitResponse(resp, g.sem, p.mine), out, err
		},
		commit: func(ctx context.Context, p permitsRead, _ struct{}) (*streams.LeaseResponse, outcome, error) {
			return l.commitPermit(ctx, g, p)
		},
	})
}

// decidePermit is the verdict on g's grant of a permit from the permits
// read in p: prove a retry of g (it holds a permit), refuse, or write. It
// is a function of its arguments alone.
func decidePermit(g *grantReq, p permitsRead) verdict[*streams.LeaseResponse, struct{}] {
	if p.mine != 0 {
		return verdict[*streams.LeaseResponse, struct{}]{kind: proveRetry}
	}
	if err := mayGrantPermit(g, p); err != nil {
		return answer[*streams.LeaseResponse, struct{}](nil, err)
	}
	return verdict[*streams.LeaseResponse, struct{}]{kind: writePlan}
}

// commitPermit grants g the first free permit read in p, with the
// pending acquires of the semaphore that its other free permits can
// serve taken into the same write (sem_bulk.go).
func (l *semOps) commitPermit(ctx context.Context, g *grantReq, p permitsRead) (*streams.LeaseResponse, outcome, error) {
	k := p.free[0]
	var resp *streams.LeaseResponse
	var err error
	if joins, ks, obs := l.joinPermits(g, p.free, p.frees, 0); len(joins) > 0 {
		resp, err = l.grantBulk(ctx, g, k, p.frees[0], joins, ks, obs)
	} else {
		resp, err = l.leases.grant(ctx, g.permit(k), p.frees[0], p.sess)
	}
	if isConflict(err) {
		return nil, conflicted, nil
	}
	return permitResponse(resp, g.sem, k), committed, err
}

// permitsRead is what a decision on a permit's grant read of its
// semaphore's permits: the free ones (or expired, to take over), or the
// one the request holds already (mine, 0 if none; held is its lease),
// the request's session (sess, if any), the waiters queued ahead of it
// and the view's facts.
type permitsRead struct {
	sess  observation
	free  []int
	frees []observation
	mine  int
	held  observation
	ahead int
	facts viewFacts
}

// readPermits reads what a decision on g's grant of a permit rests on:
// g's session (if any), its semaphore's name under the name rule
// (claimName, which sets g.nameRev) and its permits. again asks to
// decide on fresh reads.
func (l *semOps) readPermits(ctx context.Context, g *grantReq, fresh bool) (p permitsRead, again bool, err error) {
	if g.session != "" {
		if p.sess, err = l.sessions.session(ctx, g, fresh); err != nil {
			return p, false, err
		}
	}
	name, err := l.current(ctx, streams.LeaseKey(g.sem), fresh)
	if err != nil {
		return p, false, err
	}
	if name, again, err = l.names.claimName(ctx, g.sem, name, g.limit, fresh); again || err != nil {
		return p, again, err
	}
	g.nameRev = name.rev
	now := time.Now()
	for k := 1; k <= g.limit; k++ {
		key := permitKey(g.sem, k)
		if l.tracker.retry.hasEnded(key, g.requestID, g.tenant) {
			return p, false, leaseEnded(g.requestID)
		}
		o, err := l.current(ctx, key, fresh)
		if err != nil {
			return p, false, err
		}
		if o.held() && g.mine(o.rec) {
			return permitsRead{sess: p.sess, mine: k, held: o}, false, nil
		}
		if (!o.held() && !o.foreign) || l.tracker.expired(o, now) {
			p.free, p.frees = append(p.free, k), append(p.frees, o)
		}
	}
	p.ahead, _, _ = l.tracker.ahead(streams.EncodeResource(g.resource), g.hash)
	p.facts = l.leases.factsFor(g)
	return p, false, nil
}

// mayGrantPermit refuses g's grant when no permit is free for it in p
// after the waiters ahead, or the fleet's guard or g's session's cap
// forbids it.
func mayGrantPermit(g *grantReq, p permitsRead) error {
	switch free := len(p.free); {
	case free == 0:
		return newOpError(streams.CodeLocked, "all %d permits of semaphore %q are held", g.limit, g.sem)
	case p.ahead >= free:
		return newOpError(streams.CodeLocked, "the %d free permits of semaphore %q are reserved for the %d waiters ahead", free, g.sem, p.ahead)
	case p.facts.guard != nil:
		return p.facts.guard
	}
	return p.facts.room
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
func (l *semOps) permitsOf(ctx context.Context, g *grantReq, seq uint64) ([]*grantReq, error) {
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
// request of tenant holds, as the tracker knows it, or 0.
func (l *semOps) heldPermit(sem string, limit int, requestID, tenant string) int {
	for k := 1; k <= limit; k++ {
		if o, ok := l.tracker.get(permitKey(sem, k)); ok && o.held() && o.rec.RequestID == requestID && o.rec.Tenant == tenant {
			return k
		}
	}
	return 0
}

// cancelSem makes sure the request for a permit of semaphore sem holds
// nothing and waits for nothing (see cancel). Its work is bounded by the
// semaphore's own limit: a cancel naming another limit than the
// semaphore's is refused before any, and the permits are looked for in
// this instance's view, or at the one permit the request's grant wrote.
func (l *semOps) cancelSem(ctx context.Context, sem string, limit int, requestID, owner string, who origin) (*streams.CancelResponse, error) {
	if n := l.names.semaphoreLimit(sem); n != 0 && n != limit {
		return nil, newOpError(streams.CodeInvalidRequest, "%s is a semaphore of limit %d; this request says %d", quoteName(sem), n, limit)
	}
	queue := streams.PermitQueue(sem)
	key := streams.LeaseKey(queue)
	g := &grantReq{resource: queue, key: key, requestID: requestID, owner: owner, who: who, tenant: who.tenant(),
		hash: requestHash(queue, requestID, who.tenant()), sem: sem, limit: limit}
	wkey := streams.WaitKey(queue, g.hash)
	st, err := l.lock(ctx, key)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	// The tombstone carries the grant's message id: refused as a
	// duplicate, it proves the request was granted (or cancelled before),
	// and the duplicate's revision names the permit that grant took.
	t, err := l.handover.tombstone(ctx, key, wkey, g.hash, owner)
	if err != nil || t.other {
		return &streams.CancelResponse{Resource: sem}, err
	}
	released, err := l.endCancelledPermit(ctx, g, t.granted, t.seq)
	if err != nil {
		return nil, err
	}
	dequeued, err := l.handover.dequeue(ctx, queue, wkey, owner, t.waiter)
	if err != nil {
		return nil, err
	}
	l.report.cancelled(sem, released, dequeued, who)
	return &streams.CancelResponse{Resource: sem, Cancelled: released || dequeued}, nil
}

// endCancelledPermit ends the permit that the cancelled request g holds,
// if any: as this instance knows the permits, or, when the request is
// known to have been granted (by the write at seq, 0 when the duplicate
// did not say), on a fresh read of the permit that write took. The
// caller has written the request's tombstone and holds the queue key's
// lock.
func (l *semOps) endCancelledPermit(ctx context.Context, g *grantReq, granted bool, seq uint64) (bool, error) {
	k := l.heldPermit(g.sem, g.limit, g.requestID, g.tenant)
	if k == 0 && granted {
		var err error
		if k, err = l.grantedPermit(ctx, g, seq); err != nil {
			return false, err
		}
	}
	if k == 0 {
		return false, nil
	}
	res, key := streams.PermitResource(g.sem, k), permitKey(g.sem, k)
	st, err := l.lock(ctx, key)
	if err != nil {
		return false, err
	}
	defer st.unlock()
	e, err := l.handover.endIf(ctx, res, key, func(rec *streams.Record) bool {
		return rec.RequestID == g.requestID && rec.Tenant == g.tenant && rec.Owner == g.owner
	}, endCancel, g.who, "")
	return e != nil, err
}

// grantedPermit returns the permit that request g's grant at seq took
// and still holds, on fresh reads, or 0. The write at seq names it; when
// the stream no longer holds that write (the permit was renewed or ended
// since) every permit is read, but only of a semaphore this instance
// knows, of the limit g names: a cancel of a name never acquired reads
// nothing more.
func (l *semOps) grantedPermit(ctx context.Context, g *grantReq, seq uint64) (int, error) {
	candidates, err := l.permitsOf(ctx, g, seq)
	if err != nil {
		return 0, err
	}
	if len(candidates) > 1 && l.names.semaphoreLimit(g.sem) != g.limit {
		return 0, nil
	}
	for _, c := range candidates {
		o, err := l.current(ctx, c.key, true)
		if err != nil {
			return 0, err
		}
		if o.held() && g.mine(o.rec) && (seq == 0 || o.rec.TokenAt(o.rev) == seq) {
			_, k, _ := streams.SplitPermit(c.resource)
			return k, nil
		}
	}
	return 0, nil
}

// semaphoreStatus reports the permits of semaphore sem of limit n as this
// instance knows them, as who may see them.
func (l *semOps) semaphoreStatus(sem string, limit int, who origin) (*streams.SemaphoreStatus, error) {
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
