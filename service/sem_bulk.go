package service

import (
	"context"
	"errors"
	"sync"

	"github.com/jetlock/jetlock/streams"
)

// Bulk grants of a semaphore's permits. An instance decides one
// semaphore's acquires one at a time, under its queue's lock, and holds
// the lock across each grant's commit; so while a commit is in flight the
// other acquires of the semaphore wait for the lock, and a semaphore
// granted at most one permit per commit round trip. Instead, an acquire
// that may be granted in bulk joins the semaphore's pending acquires
// before it waits for the lock (semJoins), and the request that holds the
// lock grants, with its own permit, as many of them as the semaphore has
// free permits, oldest first, in one atomic batch: one commit for them all.
// Each joined acquire then finds its grant when it gets the lock, and
// answers without deciding or writing anything.
//
// Only plain acquires join (not in a session, not queued as a waiter),
// and only while no waiter is queued for the semaphore: the queue's FIFO
// order and its hand-overs stay as they are. Every grant of the batch is
// a compare-and-set of a free permit's key with the request's grant
// message id, as a single grant is, so the semaphore is never over its
// limit and no request is granted twice; if any of them fails, the batch
// fails whole and each request decides on its own.

// semJoins is, per semaphore queue key, the acquires waiting for the
// queue's lock that its holder may grant in its commit, oldest first.
// There are at most as many as may wait for a key's lock (MaxPerKey).
type semJoins struct {
	mu    sync.Mutex
	byKey map[string][]*semJoin
}

// semJoin is one acquire waiting for its semaphore's lock.
type semJoin struct {
	g     *grantReq
	w     *waiter                // a waiting acquire's waiter, nil for one that does not wait
	taken bool                   // a holder of the lock took it into its commit
	resp  *streams.LeaseResponse // its grant, once that commit succeeded
	// queued is its waiter record, once the holder's commit wrote it.
	queued *observation
}

// add makes g (of waiter w, or nil), which is about to wait for key's
// lock, a pending acquire.
func (j *semJoins) add(key string, g *grantReq, w *waiter) *semJoin {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.byKey == nil {
		j.byKey = map[string][]*semJoin{}
	}
	sj := &semJoin{g: g, w: w}
	j.byKey[key] = append(j.byKey[key], sj)
	return sj
}

// leave ends sj's wait for key's lock: it returns the grant another
// request's commit made for it, or the waiter record that commit wrote
// for it, or neither (it then decides on its own).
func (j *semJoins) leave(key string, sj *semJoin) (*streams.LeaseResponse, *observation) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if sj.taken {
		return sj.resp, sj.queued
	}
	list := j.byKey[key]
	for i, x := range list {
		if x == sj {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(j.byKey, key)
	} else {
		j.byKey[key] = list
	}
	return nil, nil
}

// take removes and returns up to n of key's pending acquires that ok
// accepts, oldest first, marked as taken into a commit.
func (j *semJoins) take(key string, n int, ok func(*semJoin) bool) []*semJoin {
	j.mu.Lock()
	defer j.mu.Unlock()
	var taken []*semJoin
	list := j.byKey[key]
	rest := list[:0]
	for _, sj := range list {
		if len(taken) < n && ok(sj) {
			sj.taken = true
			taken = append(taken, sj)
			continue
		}
		rest = append(rest, sj)
	}
	if len(rest) == 0 {
		delete(j.byKey, key)
	} else {
		j.byKey[key] = rest
	}
	return taken
}

// settle records the outcome of the commit that took joins: grants[i] is
// joins[i]'s, or nil when the commit failed.
func (j *semJoins) settle(joins []*semJoin, grants []*streams.LeaseResponse) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i, sj := range joins {
		sj.resp = grants[i]
	}
}

// settleQueued records the waiter records that the commit which took
// joins wrote: queued[i] is joins[i]'s, or nil when the commit failed.
func (j *semJoins) settleQueued(joins []*semJoin, queued []*observation) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i, sj := range joins {
		sj.queued = queued[i]
	}
}

// acquire decides the acquire of a permit that does not wait: joined to
// the pending acquires of its semaphore (lockToGrant), else decided on its
// own.
func (l *semOps) acquire(ctx context.Context, g *grantReq) (*streams.LeaseResponse, error) {
	st, granted, _, err := l.lockToGrant(ctx, g, nil, true)
	if granted != nil || err != nil {
		return granted, err
	}
	defer st.unlock()
	return l.trySem(ctx, g, false)
}

// lockToGrant locks g's key. A plain acquire of a permit that may be
// granted in bulk (joinable; w is its waiter, nil for one that does not
// wait) first joins its semaphore's pending acquires, and so does a
// waiting acquire of a lock not yet queued, whose waiter record the
// holder may write with its own (enqueueBulk). When the holder of
// the lock granted it meanwhile, lockToGrant returns that grant and no
// lock; when the holder queued it, the key locked and its waiter record.
func (l *semOps) lockToGrant(ctx context.Context, g *grantReq, w *waiter, joinable bool) (*keyLock, *streams.LeaseResponse, *observation, error) {
	if !joinable || g.limit == 0 && w == nil || g.session != "" {
		st, err := l.lock(ctx, g.key)
		return st, nil, nil, err
	}
	sj := l.joins.add(g.key, g, w)
	st, err := l.lock(ctx, g.key)
	resp, queued := l.joins.leave(g.key, sj)
	if resp != nil {
		if st != nil {
			st.unlock()
		}
		return nil, resp, nil, nil
	}
	return st, nil, queued, err
}

// joinPermits takes into the grant of permit free[mine] to g the pending
// acquires of g's semaphore that its other free permits can serve: none
// while a waiter is queued for the semaphore (the queue goes first), and
// only requests that may be granted at once (plain acquires of the same
// limit, holding no permit of the semaphore as this instance knows it,
// not ended). It returns them and the permits (and their observations)
// they are to get.
func (l *semOps) joinPermits(g *grantReq, free []int, frees []observation, mine int) ([]*semJoin, []int, []observation) {
	if len(free) < 2 || g.session != "" {
		return nil, nil, nil
	}
	if n, _ := l.tracker.waiterCounts(streams.EncodeResource(g.resource), ""); n > 0 {
		return nil, nil, nil
	}
	ok := func(sj *semJoin) bool {
		o := sj.g
		if o.limit != g.limit || o.session != "" || o.sem != g.sem || l.heldPermit(o.sem, o.limit, o.requestID, o.tenant) != 0 {
			return false
		}
		for k := 1; k <= o.limit; k++ {
			if l.tracker.retry.hasEnded(permitKey(o.sem, k), o.requestID, o.tenant) {
				return false
			}
		}
		return true
	}
	joins := l.joins.take(g.key, len(free)-1, ok)
	var ks []int
	var obs []observation
	for i := range free {
		if i != mine && len(ks) < len(joins) {
			ks, obs = append(ks, free[i]), append(obs, frees[i])
		}
	}
	return joins, ks, obs
}

// grantBulk grants permit k (observed free in o) to g and permits ks
// (observed in obs) to joins, in one atomic batch, and tells each joined
// acquire its grant. If the batch fails, the joined acquires decide on
// their own, and g is granted on its own (grant).
func (l *semOps) grantBulk(ctx context.Context, g *grantReq, k int, o observation, joins []*semJoin, ks []int, obs []observation) (*streams.LeaseResponse, error) {
	reqs := []*grantReq{g.permit(k)}
	seen := []observation{o}
	for i, sj := range joins {
		reqs, seen = append(reqs, sj.g.permit(ks[i])), append(seen, obs[i])
	}
	now := l.cfg.Clock.Now()
	recs := make([]*streams.Record, len(reqs))
	msgs := make([]*batchMsg, len(reqs))
	for i, r := range reqs {
		recs[i] = newLease(now, r.requestID, r.owner, r.tenant, r.ttl, l.holdLimit(now, r.maxHold))
		recs[i].Limit = r.limit
		msgs[i] = l.store.putMsg(r.key, recs[i].AppendJSON(nil), seen[i].rev, grantMsgID(r.hash))
	}
	name := l.store.nameMsg(g.sem, g.limit, g.nameRev)
	msgs = append(msgs, name)
	grants := make([]*streams.LeaseResponse, len(joins))
	if _, err := l.store.batch(ctx, "grant", msgs); err != nil {
		l.joins.settle(joins, grants)
		if errors.Is(err, errConflict) || errors.Is(err, errDuplicate) {
			return l.leases.grant(ctx, g.permit(k), o, observation{})
		}
		for _, r := range reqs {
			l.tracker.forget(r.key)
		}
		return nil, err
	}
	var mine *streams.LeaseResponse
	for i, r := range reqs {
		l.tracker.observe(r.key, entry{rev: msgs[i].seq, rec: recs[i]})
		l.report.granted(r.resource, msgs[i].seq, r.owner, r.who, "acquire")
		resp := leaseResponse(r.resource, msgs[i].seq, recs[i])
		if i == 0 {
			mine = resp // trySem names the semaphore and permit
			continue
		}
		_, pk, _ := streams.SplitPermit(r.resource)
		grants[i-1] = permitResponse(resp, r.sem, pk)
	}
	l.tracker.observe(streams.LeaseKey(g.sem), entry{rev: name.seq, sem: g.limit})
	l.joins.settle(joins, grants)
	return mine, nil
}

// maxJoinedRecords bounds the waiter records one commit writes (each with
// the check of its cancel, so twice as many messages): well under
// JetStream's largest atomic batch.
const maxJoinedRecords = 64

// enqueueBulk queues w, a waiting acquire of a permit that found none it
// may take (or of a held lock) and has no record yet, and with it the
// pending waiting acquires of its key that have none either: their waiter records
// in one atomic batch, in the order they came (one commit instead of one
// each, while the semaphore's lock is held), each with the check of its
// cancel. A cancel of any of them fails the batch. A joined acquire that the
// caps or a record of its own keep out decides on its own. If the batch
// fails, w queues on its own (enqueue). The caller holds the lock.
func (w *waiter) enqueueBulk(ctx context.Context) error {
	l := w.l
	if o, ok := l.tracker.get(w.wkey); ok && o.held() {
		return w.enqueue(ctx)
	}
	joins := l.sems.joins.take(w.g.key, maxJoinedRecords-1, func(sj *semJoin) bool {
		o, ok := l.tracker.get(streams.WaitKey(sj.g.resource, sj.g.hash))
		return sj.w != nil && sj.g.limit == w.g.limit && sj.g.sem == w.g.sem && sj.g.session == "" &&
			(!ok || !o.held()) && l.sems.heldPermit(sj.g.sem, sj.g.limit, sj.g.requestID, sj.g.tenant) == 0
	})
	if len(joins) == 0 {
		return w.enqueue(ctx)
	}
	ws, recs, seen, joins := w.joinedRecords(joins)
	for _, x := range ws {
		defer l.tracker.caps.unreserveWaits(x.wkey)
	}
	if len(ws) < 2 {
		return w.enqueue(ctx) // the caps: w's own answer, or none joined
	}
	// The records first (msgs[i] is ws[i]'s), then the checks of their
	// cancels that their new places commit with (placeWrites).
	msgs := make([]*batchMsg, len(ws), 2*len(ws))
	for i, x := range ws {
		place := placeWrites(x.wkey, recs[i], seen[i], x.g.hash)
		msgs[i] = l.store.msgOf(place[0])
		for _, c := range place[1:] {
			msgs = append(msgs, l.store.msgOf(c))
		}
	}
	queued := make([]*observation, len(joins))
	if _, err := l.store.batch(ctx, "enqueue", msgs); err != nil {
		l.sems.joins.settleQueued(joins, queued)
		if errors.Is(err, errConflict) {
			return w.enqueue(ctx)
		}
		for _, x := range ws {
			l.tracker.forget(x.wkey)
		}
		return err
	}
	for i, x := range ws {
		o := l.tracker.observe(x.wkey, entry{rev: msgs[i].seq, rec: recs[i]})
		if i == 0 {
			w.queued = o
			continue
		}
		queued[i-1] = &o
	}
	l.sems.joins.settleQueued(joins, queued)
	return nil
}

// joinedRecords returns the waiters to queue in one batch (w first, then
// those of joins that the caps let in), their records, what their keys
// held, and the joins among them (the others are settled: they decide on
// their own).
func (w *waiter) joinedRecords(joins []*semJoin) ([]*waiter, []*streams.Record, []observation, []*semJoin) {
	ws := []*waiter{w}
	recs := make([]*streams.Record, 0, len(joins)+1)
	seen := make([]observation, 0, len(joins)+1)
	o, _ := w.l.tracker.get(w.wkey)
	rec, err := w.record(o)
	if err != nil {
		w.l.sems.joins.settleQueued(joins, make([]*observation, len(joins)))
		return nil, nil, nil, nil
	}
	recs, seen = append(recs, rec), append(seen, o)
	var in, out []*semJoin
	for _, sj := range joins {
		o, _ := w.l.tracker.get(sj.w.wkey)
		rec, err := sj.w.record(o)
		if err != nil {
			out = append(out, sj)
			continue
		}
		ws, recs, seen, in = append(ws, sj.w), append(recs, rec), append(seen, o), append(in, sj)
	}
	w.l.sems.joins.settleQueued(out, make([]*observation, len(out)))
	return ws, recs, seen, in
}
