package service

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Ending a lease. Whatever ends a lease — release, revoke, expiry, the
// cancel of its request — ends it in one compare-and-set write on the
// revision it was decided on. When a waiter is queued, that same write
// grants the resource to the head waiter: an atomic batch of the new
// lease record and the removal of the waiter's record (one commit), after
// which one wake message carries the grant to the waiter's instance, which
// answers its caller without another round trip. Without waiters the
// write is a delete marker that names the request whose lease it ended.

// handoverOps ends leases — on release, revoke, cancel, expiry — and
// hands each to the head waiter of its queue in the same write; it keeps
// the single waiters' places too (waiter.go).
type handoverOps struct {
	*engineDeps
	// the roles it reaches (see locks)
	leases   *leaseOps
	sessions *sessionOps
	sets     *setOps
	sems     *semOps
	names    *nameOps
	// handing marks the waiters being handed a resource.
	handing handing
}

// endReason says why a lease ended, for the audit log and the metrics.
type endReason string

const (
	endRelease endReason = streams.EndRelease
	endRevoke  endReason = streams.EndRevoke
	endExpiry  endReason = streams.EndExpiry
	endCancel  endReason = streams.EndCancel
)

// ended describes a lease that was ended.
type ended struct {
	token   uint64 // of the lease ended
	owner   string
	session string // the session the lease was held in, if any
}

// endIf ends the lease at key if match accepts its record, and returns
// what it ended, or nil when nothing matched (a negative answer always
// confirmed by a conditional write). reason, for a revoke, is the
// operator's: the audit and the end mark carry it. The caller holds the
// key's lock.
func (l *handoverOps) endIf(ctx context.Context, resource, key string, match func(*streams.Record) bool, why endReason, who origin, reason string) (*ended, error) {
	var attrs []slog.Attr
	if reason != "" {
		attrs = append(attrs, slog.String("reason", reason))
	}
	return onRecord(ctx, l.engineDeps, key, "", false, func(ctx context.Context, o observation) (outcome, error) {
		return l.refute(ctx, key, o)
	}, recordSteps[*ended]{
		live: func(s recordSnap) bool { return s.held() && match(s.rec) },
		act: func(ctx context.Context, o observation) (*ended, outcome, error) {
			if err := l.end(ctx, resource, key, o, why, reason); err != nil {
				return settled[*ended](nil, err)
			}
			l.report.ended(why, resource, o.rec.TokenAt(o.rev), o.rec.Owner, "ended", who, attrs...)
			return &ended{token: o.rec.TokenAt(o.rev), owner: o.rec.Owner, session: o.rec.Session}, committed, nil
		},
		negative: func(observation) (*ended, error) {
			l.report.ended(why, resource, 0, "", "not_held", who, attrs...)
			return nil, nil
		},
	})
}

// end ends the lease observed in o at key: it hands the resource over to
// the head waiter, or deletes the record when none is queued (or none can
// take it). errConflict means the lease moved on: decide again. On the
// commit loop, whose snapshot is the waiter picked next (handing.next):
// a waiter that can never be granted (cancelled, or granted before) is
// dropped and the next one picked; one whose record or session moved on
// is picked again on fresh reads. When every attempt went so, the lease
// is deleted.
func (l *handoverOps) end(ctx context.Context, resource, key string, o observation, why endReason, reason string) error {
	start := time.Now()
	enc := queueOf(key)
	// The holder's own waiter record, if one is left, and the waiters
	// that turned out cancelled or granted are not handed the resource.
	gone := []string{requestHash(queueResource(resource), o.rec.RequestID, o.rec.Tenant)}
	decided := false
	_, err := commitLoop(ctx, l.engineDeps, "", false, engineSteps[handSnap, handPlan, struct{}]{
		read: func(context.Context, bool) (handSnap, bool, error) {
			w, ok := l.handing.next(l.tracker, enc, gone)
			return handSnap{w: w, ok: ok, guard: l.guardRefusal()}, false, nil
		},
		decide: func(s handSnap, _ bool) verdict[struct{}, handPlan] {
			return verdict[struct{}, handPlan]{kind: writePlan, plan: decideHandover(s, o)}
		},
		commit: func(ctx context.Context, s handSnap, p handPlan) (struct{}, outcome, error) {
			if s.ok {
				defer l.handing.done(enc, s.w.hash)
			}
			if p == handRemove {
				decided = true
				return struct{}{}, committed, l.remove(ctx, key, o, why, reason)
			}
			out, err := l.commitHandover(ctx, resource, key, o, s.w, &gone)
			if out == committed && err == nil {
				l.report.handedOver(resource, time.Since(start))
			}
			decided = out == committed
			return struct{}{}, out, err
		},
	})
	if !decided {
		return l.remove(ctx, key, o, why, reason)
	}
	return err
}

// handSnap is what the hand-over of a lease decides on: the waiter picked
// next (ok: one was), and the fleet's guard.
type handSnap struct {
	w     waiterInfo
	ok    bool
	guard error
}

// handPlan is what ending a lease writes.
type handPlan uint8

const (
	handTo     handPlan = iota // the lease to the waiter picked
	handRemove                 // the lease's delete
)

// decideHandover decides whether the lease o goes to the waiter in s. A
// waiter for a lock set claims all of its resources at once (sets.go): it
// is woken to, rather than handed this one. So is a waiter for a permit
// that names another limit than the one the permit was granted under,
// which is its semaphore's while any permit is held (the name rule, engine.go): it
// decides again and is refused.
func decideHandover(s handSnap, o observation) handPlan {
	if !s.ok || s.guard != nil || s.w.set != "" || s.w.limit != o.rec.Limit {
		return handRemove
	}
	return handTo
}

// commitHandover hands the lease o at key to waiter w (handOver) and
// reports, as an outcome, what the next step is: committed (handed over,
// or a failure, or the lease moved on: errConflict), or stale, when the
// waiter can never be granted (it is dropped, and added to gone) or its
// record or session moved on (the view learns them again): pick again.
func (l *handoverOps) commitHandover(ctx context.Context, resource, key string, o observation, w waiterInfo, gone *[]string) (outcome, error) {
	wkey := streams.WaitKey(queueResource(resource), w.hash)
	err := l.handOver(ctx, resource, key, o, w)
	switch {
	case err == nil:
		return committed, nil
	case errors.Is(err, errDuplicate):
		*gone = append(*gone, w.hash)
		l.dropWaiter(ctx, wkey, w.rev)
		return stale, nil
	case errors.Is(err, errConflict):
		// The lease, the waiter's record or its session moved on: see
		// which.
		if cur, rerr := l.current(ctx, key, true); rerr != nil || cur.rev != o.rev {
			return committed, errConflict
		}
		if _, rerr := l.current(ctx, wkey, true); rerr != nil {
			return committed, rerr
		}
		if w.session != "" {
			if _, rerr := l.current(ctx, streams.SessionKey(w.session), true); rerr != nil {
				return committed, rerr
			}
		}
		return stale, nil
	}
	l.tracker.forget(key)
	l.tracker.forget(wkey)
	return committed, err
}

// handing is, per queue, the waiters this instance is handing a resource
// to right now. The permits of a semaphore end under locks of their own,
// so several of them can be handed over at once; each to another waiter,
// rather than all to the head, where all but one commit would fail and be
// decided again. (The compare-and-set of each hand-over is what keeps a
// waiter from being granted twice; this only keeps them from colliding.)
type handing struct {
	mu      sync.Mutex
	byQueue map[string]map[string]struct{}
}

// next returns the head waiter of the encoded queue enc, but for those in
// gone and those being handed a resource already, and marks it so.
func (h *handing) next(t *tracker, enc string, gone []string) (waiterInfo, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	busy := h.byQueue[enc]
	skip := gone
	if len(busy) > 0 {
		skip = append(slices.Clip(gone), slices.Collect(maps.Keys(busy))...)
	}
	w, ok := t.head(enc, skip...)
	if !ok {
		return w, false
	}
	if busy == nil {
		if h.byQueue == nil {
			h.byQueue = map[string]map[string]struct{}{}
		}
		busy = map[string]struct{}{}
		h.byQueue[enc] = busy
	}
	busy[w.hash] = struct{}{}
	return w, true
}

// done ends the hand-over to waiter hash of queue enc.
func (h *handing) done(enc, hash string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if busy := h.byQueue[enc]; busy != nil {
		delete(busy, hash)
		if len(busy) == 0 {
			delete(h.byQueue, enc)
		}
	}
}

// remove deletes the lease observed in o by compare-and-set; the marker
// names the request whose lease it ended, and why. If a waiter is queued
// (one that could not be handed the resource), it is woken to claim.
func (l *handoverOps) remove(ctx context.Context, key string, o observation, why endReason, reason string) error {
	end := &streams.EndMark{RequestID: o.rec.RequestID, Tenant: o.rec.Tenant, EndedAt: streams.FormatTime(l.cfg.Clock.Now()),
		Why: string(why), Reason: reason}
	seq, err := l.store.del(ctx, key, o.rev, end)
	if err != nil {
		if !errors.Is(err, errConflict) {
			l.tracker.forget(key)
		}
		return err
	}
	l.tracker.observe(key, entry{rev: seq, end: end})
	l.wakeHead(queueOf(key))
	return nil
}

// handOver grants the resource whose lease is observed in o to waiter w,
// in one atomic batch with the removal of w's record, and sends w the
// grant on its wake subject. The grant carries the waiter's grant message
// id, so a cancelled waiter is never granted (errDuplicate). A grant to a
// waiter of a session commits only with its session's record still at the
// revision read (sessionCheck, leaseWrites), together with the session's
// other grants (commitGrant).
func (l *handoverOps) handOver(ctx context.Context, resource, key string, o observation, w waiterInfo) error {
	now := l.cfg.Clock.Now()
	ttl := w.leaseTTL
	if ttl == 0 {
		ttl = l.cfg.DefaultTTL
	}
	// The waiter's caller may have gone meanwhile: a short TTL frees the
	// resource soon then, and the holder's first renewal extends it.
	rec := newLease(now, w.requestID, w.owner, w.tenant, min(ttl, l.cfg.HandoverTTL), l.holdLimit(now, w.maxHold))
	rec.Limit, rec.Value = w.limit, w.value
	var sess check
	if w.session != "" {
		// A waiter of a session is granted only while its session lives,
		// and its caller's liveness is its session's.
		var err error
		if sess, err = l.sessions.sessionCheck(ctx, w.session); err != nil {
			return err
		}
		sessionLease(rec, now, w.session, l.holdLimit(now, w.maxHold))
	}
	wkey := streams.WaitKey(queueResource(resource), w.hash)
	ws := append(leaseWrites(key, rec, o.rev, grantMsgID(w.hash), sess), write{key: wkey, expect: w.rev})
	revs, dup, err := l.sessions.commitGrant(ctx, "handover", w.session, ws)
	switch {
	case dup:
		return errDuplicate
	case err != nil:
		return err
	}
	token, removed := revs[0], revs[len(revs)-1]
	l.tracker.observe(key, entry{rev: token, rec: rec})
	l.tracker.observe(wkey, entry{rev: removed})
	l.report.granted(resource, token, w.owner, origin{}, "handover")
	l.wakes.send(w.wake, l.handedOverResponse(resource, token, rec, w.session))
	return nil
}

// handedOverResponse is the grant rec at token of resource, as its waiter
// is told it: a lease of a session carries its session's expiry, a permit
// names its semaphore.
func (l *handoverOps) handedOverResponse(resource string, token uint64, rec *streams.Record, session string) *streams.LeaseResponse {
	resp := leaseResponse(resource, token, rec)
	if session != "" {
		if so, ok := l.tracker.get(streams.SessionKey(session)); ok && so.held() {
			resp = sessionLeaseResponse(resource, token, rec, so.rec)
		}
	}
	if sem, k, ok := streams.SplitPermit(resource); ok {
		resp = permitResponse(resp, sem, k)
	}
	return resp
}

// dropWaiter removes the record of a waiter that can never be granted
// (its request was cancelled, or granted before), best effort: if it
// stays, its liveness window ends it.
func (l *handoverOps) dropWaiter(ctx context.Context, wkey string, rev uint64) {
	seq, err := l.store.del(ctx, wkey, rev, nil)
	if err != nil {
		l.log.Debug("remove a waiter that cannot be granted", "key", wkey, "err", err)
		return
	}
	l.tracker.observe(wkey, entry{rev: seq})
}

// wakeHead sends a plain wake message to the head waiter of the encoded
// resource, if there is one, so that it claims the free resource.
func (l *handoverOps) wakeHead(enc string) {
	w, ok := l.tracker.head(enc)
	if !ok || w.wake == "" {
		return
	}
	l.log.Debug("wake head", "resource", enc, "request_id", w.requestID, "ticket", w.ticket)
	l.wakes.send(w.wake, nil)
}

// expire ends a lease (or foreign value) whose revision has stood for its
// TTL plus grace since this instance first saw it, by compare-and-set on
// that revision, so a renewal that landed meanwhile always wins; a queued
// waiter gets the resource in the same write. Every instance sweeps; the
// compare-and-set lets exactly one succeed.
func (l *handoverOps) expire(ctx context.Context, it dueItem) {
	if o, ok := l.tracker.get(it.key); ok && o.rev == it.rev && o.held() && o.rec.Set != "" && strings.HasPrefix(it.key, streams.LeaseKeyPrefix) {
		l.sets.expireSetKey(ctx, it, o) // a set ends whole, never one key alone
		return
	}
	st, err := l.lock(ctx, it.key)
	if err != nil {
		l.tracker.retryAt(it, time.Now().Add(time.Second))
		return
	}
	defer st.unlock()
	o, ok := l.tracker.get(it.key)
	if !ok || o.rev != it.rev {
		return // renewed, released or forgotten meanwhile
	}

	if !l.tracker.expired(o, time.Now()) {
		if !o.held() || o.rec.Session == "" {
			return
		}
		// A session's lease made due (sessionIndex.orphansDue) while the
		// tracker does not know its session: end it if the session's
		// record is gone.
		gone, err := l.sessions.sessionGone(ctx, o.rec.Session)
		if err != nil {
			l.tracker.retryAt(it, time.Now().Add(time.Second))
			return
		}
		if !gone {
			l.tracker.retryAt(it, l.tracker.deadline(&o))
			return
		}
	}
	l.expireSettled(ctx, it, l.endDue(ctx, it, o))
}

// endDue ends the due key it, last observed as o: a session, a lease, or
// a stale waiter or foreign value.
func (l *handoverOps) endDue(ctx context.Context, it dueItem, o observation) error {
	var err error
	enc := resourceOf(it.key)
	res := decodedResource(enc)
	switch {
	case o.held() && isSessionKey(it.key):
		err = l.sessions.expireSession(ctx, it.key, o)
	case o.held() && it.key == streams.LeaseKeyPrefix+enc:
		why := endExpiry
		if o.rec.Session != "" && l.tracker.sessionIx.sessionLeaseEnded(o.rec) {
			why = endSessionExpiry // left by whoever ended its session
		}
		err = l.end(ctx, res, it.key, o, why, "")
		if err == nil {
			l.report.ended(why, res, o.rec.TokenAt(o.rev), o.rec.Owner, "ended", origin{})
		}
	default:
		// A waiter whose instance stopped refreshing it, or a foreign
		// value: remove it; the next waiter may now be the head.
		var seq uint64
		if seq, err = l.store.del(ctx, it.key, it.rev, nil); err == nil {
			l.tracker.observe(it.key, entry{rev: seq})
			if lo, ok := l.tracker.get(streams.LeaseKeyPrefix + enc); !ok || !lo.held() {
				l.wakeHead(enc)
			}
			l.log.Info("stale record removed", "key", it.key, "foreign", o.foreign)
		}
	}
	return err
}

// expireSettled follows up the outcome err of ending the due key it: on a
// conflict it learns the new revision or retries shortly, on a failure it
// logs and retries shortly.
func (l *handoverOps) expireSettled(ctx context.Context, it dueItem, err error) {
	switch {
	case err == nil:
	case errors.Is(err, errConflict):
		// Someone wrote meanwhile; learn the new revision (which schedules
		// its own expiry) or retry shortly if the write is still in flight.
		if e, rerr := l.store.read(ctx, it.key); rerr == nil && e.rev != it.rev {
			l.tracker.observe(it.key, e)
			return
		}
		l.tracker.retryAt(it, time.Now().Add(time.Second))
	default:
		l.log.Warn("expire", "key", it.key, "err", err)
		l.tracker.retryAt(it, time.Now().Add(time.Second))
	}
}
