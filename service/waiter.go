package service

import (
	"context"
	"errors"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Waiting. A waiting acquire that finds the resource held queues a waiter
// record in the bucket at key streams.WaitKey(resource, hash); its ticket
// is the revision that created it, so FIFO order is ticket order, and a
// retry of the same request id finds the same record and keeps its place.
// The record names the wake subject of the serving instance and request,
// and what the acquire asked for. Whoever ends the lease hands the
// resource to the head waiter in the same write (handover.go) and sends it
// the grant on that subject. Wake messages are at-most-once, so every
// waiter also re-checks on a timer; a free resource is then claimed in
// ticket order (tracker.claim). The record is written once: it lives while
// its instance does (instances.go), so a waiter costs no write while
// nothing changes, and a waiter whose instance died frees its place within
// seconds. While the lock stays held, a waiter checks it on the tracker
// alone, without the key's lock (idle); one read from the stream leader a
// queue every third of the liveness window (wakes.recheckDue), whatever
// the number of waiters, covers a watcher that lags.

// waiter is one waiting acquire: its request, its place in the queue, and
// the decisions of each of its steps. Its methods run in the request's own
// goroutine, one at a time.
type waiter struct {
	l    *handoverOps
	g    *grantReq
	wkey string
	wake string // its wake subject
	// queued is its record once queued (revision 0 before); until is when
	// the wait ends (zero: unknown, the longest wait).
	queued observation
	until  time.Time
	// ttl is the TTL of a lease it claims itself: after its first attempt,
	// the hand-over TTL (its caller may have gone while it waited).
	ttl time.Duration
}

func (l *handoverOps) newWaiter(g *grantReq) *waiter {
	return &waiter{l: l, g: g, wkey: streams.WaitKey(g.resource, g.hash), wake: l.wakes.subject(g.hash), ttl: g.ttl}
}

// step makes one attempt: claim the resource if allowed, otherwise queue
// the waiter record. done reports a final answer in resp or err; otherwise
// err is the "locked" answer to give if the wait ends now.
//
// A woken waiter, and one waiter of a queue every third of the liveness
// window, that finds the lock held in the tracker decides on a read from
// the stream leader: after a leader change the watcher behind the tracker
// can lag by seconds, and a waiter that trusted it would sit out the
// release it was woken for. When the tracker already shows the lock free,
// no read is needed.
func (w *waiter) step(ctx context.Context, woken bool) (resp *streams.LeaseResponse, done bool, err error) {
	if err := w.l.guardRefusal(); err != nil && w.queued.rev != 0 {
		// No grant can come while the stream is below its high-water
		// mark: the wait ends with that answer (unavailable), its record
		// removed, and its caller retries.
		return nil, true, err
	}
	// due: this step is the queue's check on the stream leader (asked
	// once a step: asking marks the queue's check as taken).
	due := false
	if !woken {
		if locked := w.idle(); locked != nil {
			if due = w.l.wakes.recheckDue(w.g.key); !due {
				return nil, false, locked
			}
		}
	}
	g := *w.g
	g.ttl = w.ttl
	// Not yet queued, it may be granted or queued with another acquire's
	// commit while it waits for the lock (sem_bulk.go).
	st, granted, queued, err := w.l.sems.lockToGrant(ctx, &g, w, w.queued.rev == 0)
	if granted != nil {
		w.ttl = min(w.g.ttl, w.l.cfg.HandoverTTL)
		return granted, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer st.unlock()
	if queued != nil {
		w.queued = *queued // with the check of its cancel (placeWrites)
	}
	wasQueued := w.queued.rev != 0
	if err := w.checkPlace(ctx); err != nil {
		return nil, true, err
	}
	fresh := false
	if wasQueued {
		// Skip the store while the tracker says the lock is held, unless
		// woken or due to check: then read it from the stream leader.
		if o, ok := w.l.tracker.get(w.g.key); ok && o.held() && !w.g.mine(o.rec) && !w.l.tracker.expired(o, time.Now()) {
			if !woken && !due && !w.l.wakes.recheckDue(w.g.key) {
				return nil, false, lockedError(o, w.g.who)
			}
			fresh = true
		}
	}
	resp, err = w.l.leases.tryGrant(ctx, &g, fresh)
	w.ttl = min(w.g.ttl, w.l.cfg.HandoverTTL)
	return w.afterTry(ctx, resp, err)
}

// afterTry ends the step with tryGrant's answer (resp, err): done if it
// granted or failed otherwise than locked, else queued (if not yet) to
// wait on.
func (w *waiter) afterTry(ctx context.Context, resp *streams.LeaseResponse, err error) (*streams.LeaseResponse, bool, error) {
	var oe *opError
	// Every attempt lost a race with other writers (another instance's
	// grants of the same semaphore): wait on, as when it is held.
	contended := errors.Is(err, errConflict)
	if !contended && (err == nil || !errors.As(err, &oe) || oe.code != streams.CodeLocked) {
		if err == nil && w.queued.rev != 0 {
			w.removeRecord(ctx)
		}
		return resp, true, err
	}
	if w.queued.rev == 0 {
		enqueue := w.enqueue
		if w.queued.rev == 0 && w.g.session == "" {
			enqueue = w.enqueueBulk // with the key's pending waits
		}
		if qerr := enqueue(ctx); qerr != nil {
			if errors.As(qerr, &oe) {
				return nil, true, qerr
			}
			w.l.log.Warn("queue waiter", "resource", w.g.resource, "err", qerr)
		}
	}
	return nil, false, err
}

// idle returns the "locked" answer of a step that needs neither the key's
// lock nor the store, unless the queue's check on the stream leader is
// due: the waiter's record is as it wrote it, and the lock (or every
// permit) is held by others and not expired as the tracker knows it.
// Otherwise it returns nil and the step decides under the lock. A wait in
// a session always decides there (its session may have ended).
func (w *waiter) idle() error {
	t := w.l.tracker
	if w.queued.rev == 0 || w.g.session != "" {
		return nil
	}
	if o, ok := t.get(w.wkey); !ok || o.rev != w.queued.rev {
		return nil
	}
	now := time.Now()
	var locked error
	if w.g.limit == 0 {
		o, ok := t.get(w.g.key)
		if !ok || !o.held() || w.g.mine(o.rec) || t.expired(o, now) {
			return nil
		}
		locked = lockedError(o, w.g.who)
	} else {
		for k := 1; k <= w.g.limit; k++ {
			o, ok := t.get(permitKey(w.g.sem, k))
			if !ok || !o.held() || w.g.mine(o.rec) || t.expired(o, now) {
				return nil
			}
		}
		locked = newOpError(streams.CodeLocked, "all %d permits of semaphore %q are held", w.g.limit, w.g.sem)
	}
	return locked
}

// checkPlace checks that the waiter's record is still its own. A record
// gone means: cancelled (stop: lease_lost), taken over by a retry of the
// request on another instance (stop: that one serves the caller), handed
// the resource (the caller's lease is found by the next decision), or
// removed because another instance took this one for dead (queue again,
// at the end).
func (w *waiter) checkPlace(ctx context.Context) error {
	if w.queued.rev == 0 {
		return nil
	}
	o, ok := w.l.tracker.get(w.wkey)
	if !ok || o.rev <= w.queued.rev || o.held() && o.rec.Wake == w.wake {
		return nil
	}
	if o.held() {
		return newOpError(streams.CodeLeaseLost, "the waiting acquire was taken over by a retry")
	}
	if cancelled, err := w.cancelled(ctx); err != nil || cancelled {
		return err
	}
	w.queued = observation{}
	return nil
}

// cancelled reports whether the request was cancelled within the retry
// window: its cancel tombstone exists (read from the stream leader). A
// cancelled request answers lease_lost. Only the positive answer proves
// anything (see store.exists): after a negative one the request queues
// again, and its new place commits only if no tombstone stands
// (placeWrites).
func (w *waiter) cancelled(ctx context.Context) (bool, error) {
	ok, err := w.l.store.exists(ctx, cancelKey(w.g.hash))
	if err != nil {
		return false, err
	}
	if ok {
		return true, newOpError(streams.CodeLeaseLost, "the waiting acquire was cancelled")
	}
	return false, nil
}

// waitSnap is what an enqueue decides on: the record at the waiter's key,
// the revision its own record was written at (0: none), and, on a fresh
// read, whether the request's cancel tombstone stands.
type waitSnap struct {
	o         observation
	mine      uint64
	cancelled bool
}

// enqueuePlan is what an enqueue writes.
type enqueuePlan uint8

const (
	enqueueWrite enqueuePlan = iota // a new record, or its own rewritten
	enqueueAgain                    // its record was removed: a new one, unless cancelled
)

// enqueue creates the waiter record, or rewrites it (same ticket) to point
// it at this instance, when a retry takes over its place; on the commit
// loop. The caller holds the lease key's lock; waiter keys are written
// only under it.
func (w *waiter) enqueue(ctx context.Context) error {
	defer w.l.tracker.caps.unreserveWaits(w.wkey)
	_, err := commitLoop(ctx, w.l.engineDeps, "", false, engineSteps[waitSnap, enqueuePlan, struct{}]{
		read: func(ctx context.Context, fresh bool) (waitSnap, bool, error) {
			o, err := w.l.current(ctx, w.wkey, fresh)
			s := waitSnap{o: o, mine: w.queued.rev}
			if err == nil && fresh {
				s.cancelled, err = w.l.store.exists(ctx, cancelKey(w.g.hash))
			}
			return s, false, err
		},
		decide: func(s waitSnap, fresh bool) verdict[struct{}, enqueuePlan] {
			return decideEnqueue(s, w.wake, fresh)
		},
		commit: w.commitEnqueue,
	})
	return err
}

// decideEnqueue is the verdict on an enqueue whose wake subject is wake:
// write when it has no record yet or the key holds its own (its revision,
// or its wake subject: a retry's rewrite), else, on a fresh read, lost to
// a retry that took the place over, or queue again if the record is gone.
// A record commits only while the request has no cancel tombstone
// (placeWrites); when a fresh read finds one (after such a commit was
// refused), the request was cancelled: lease_lost, nothing written.
func decideEnqueue(s waitSnap, wake string, fresh bool) verdict[struct{}, enqueuePlan] {
	o := s.o
	switch {
	case s.cancelled:
		return answer[struct{}, enqueuePlan](struct{}{}, newOpError(streams.CodeLeaseLost, "the waiting acquire was cancelled"))
	case s.mine == 0 || o.held() && (o.rev == s.mine || o.rec.Wake == wake):
		return verdict[struct{}, enqueuePlan]{kind: writePlan, plan: enqueueWrite}
	case !fresh:
		return verdict[struct{}, enqueuePlan]{kind: readAgain}
	case o.held():
		return answer[struct{}, enqueuePlan](struct{}{}, newOpError(streams.CodeLeaseLost, "the waiting acquire was taken over by a retry"))
	}
	return verdict[struct{}, enqueuePlan]{kind: writePlan, plan: enqueueAgain}
}

// commitEnqueue writes the waiter's record over s (a lost race, or a
// cancel found by the check of a new place, is decided again on fresh
// reads, unreported: stale).
func (w *waiter) commitEnqueue(ctx context.Context, s waitSnap, p enqueuePlan) (struct{}, outcome, error) {
	if p == enqueueAgain {
		w.queued = observation{} // removed meanwhile (its instance taken for dead): queue again
	}
	rec, err := w.record(s.o)
	if err != nil {
		return struct{}{}, committed, err
	}
	revs, _, err := w.l.store.commitWrites(ctx, "enqueue", placeWrites(w.wkey, rec, s.o, w.g.hash))
	if err != nil {
		if !isConflict(err) {
			w.l.tracker.forget(w.wkey)
		}
		return quiet(settled(struct{}{}, err))
	}
	w.queued = w.l.tracker.observe(w.wkey, entry{rev: revs[0], rec: rec})
	return struct{}{}, committed, nil
}

// placeWrites are the writes of the waiter record rec of request hash at
// wkey, over o, the key's entry as read: the record, and the check that
// the request has no cancel tombstone. A cancel that came between the
// request's "locked" answer and a new place's write found no record to
// remove, and without the check the request would wait in the queue after
// its cancel was answered; a rewrite of a record that stands (a retry
// taking its place over) checks too, so that once a tombstone stands only
// deletes reach the key, and the record the tombstone's commit proved is
// the one its cancel removes (handoverOps.dequeue).
func placeWrites(wkey string, rec *streams.Record, o observation, hash string) []write {
	return []write{{key: wkey, expect: o.rev, e: entry{rec: rec}}, cancelCheck(hash)}
}

// cancelCheck is the condition that request hash has no cancel tombstone:
// its key never written, or its tombstone gone with the retry window (the
// bucket then holds nothing at the key).
func cancelCheck(hash string) write { return write{key: cancelKey(hash), check: true} }

// record returns the waiter record to write over o, the key's current
// entry: the same ticket if o is this request's record, else a new place
// if the caps allow one; that place stays reserved until the tracker
// takes in its record or the caller ends the reservation
// (waitCaps.unreserveWaits).
func (w *waiter) record(o observation) (*streams.Record, error) {
	cfg := w.l.cfg
	now := cfg.Clock.Now()
	window := recordWindow(cfg, w.until)
	rec := &streams.Record{
		Owner: w.g.owner, Tenant: w.g.tenant, RequestID: w.g.requestID, TTLms: window.Milliseconds(),
		GrantedAt: streams.FormatTime(now), Wake: w.wake,
		LeaseTTLms: w.g.ttl.Milliseconds(), MaxHoldMs: w.g.maxHold.Milliseconds(), Session: w.g.session,
		Limit: w.g.limit, Value: w.g.value,
	}
	if o.held() {
		rec.Token = o.rec.TokenAt(o.rev) // keep the ticket
		rec.GrantedAt = o.rec.GrantedAt
	} else {
		if w.g.session != "" {
			if err := w.l.sessions.sessionRoom(w.g.session); err != nil {
				return nil, err
			}
		}
		if err := w.l.names.reserveOrRefuse(w.wkey, w.g.resource, w.g.tenant, 1); err != nil {
			return nil, err
		}
	}
	rec.RenewedAt = streams.FormatTime(now)
	rec.ExpiresAt = streams.FormatTime(now.Add(window))
	return rec, nil
}

// recordWindow is the liveness_ms of a waiter record written now for a
// wait that ends at until (zero: the longest wait): what is left of the
// wait plus the liveness window. Its instance removes the record when the
// wait ends; this bounds a record it failed to remove, and is all that an
// older release, which expects records to be rewritten, goes by.
func recordWindow(cfg Config, until time.Time) time.Duration {
	left := cfg.MaxWait
	if !until.IsZero() {
		left = max(0, time.Until(until))
	}
	return min(left+cfg.WaiterLiveness, streams.MaxRecordTTL)
}

// removeRecord deletes the waiter's own record, best effort: if it stays,
// its liveness_ms ends it.
func (w *waiter) removeRecord(ctx context.Context) {
	if w.queued.rev == 0 {
		return
	}
	if _, err := w.l.deleteRecord(ctx, w.wkey); err != nil {
		w.l.log.Warn("remove waiter record", "resource", w.g.resource, "err", err)
	}
	w.queued = observation{}
}

// leave ends a wait, because it ran out (last is the "locked" answer) or
// failed (last is the error): it removes the waiter record and, if the
// resource is free, wakes the next waiter (this one may have been the
// head). If the record was already gone because the resource was handed
// to this request meanwhile, the request holds the lease: leave answers
// with it.
func (w *waiter) leave(ctx context.Context, last error) (*streams.LeaseResponse, error) {
	st, err := w.l.lock(ctx, w.g.key)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	if w.queued.rev != 0 {
		removed, err := w.l.deleteRecord(ctx, w.wkey)
		if err != nil {
			w.l.log.Warn("remove waiter", "resource", w.g.resource, "err", err)
		}
		if !removed && err == nil {
			key, k := w.g.key, 0
			if w.g.limit != 0 {
				k = w.l.sems.heldPermit(w.g.sem, w.g.limit, w.g.requestID, w.g.tenant)
				key = permitKey(w.g.sem, k)
			}
			if o, err := w.l.current(ctx, key, true); err == nil && o.held() && w.g.mine(o.rec) && o.rec.Owner == w.g.owner {
				if k != 0 {
					return permitResponse(leaseResponse(w.g.sem, o.rec.TokenAt(o.rev), o.rec), w.g.sem, k), nil
				}
				return leaseResponse(w.g.resource, o.rec.TokenAt(o.rev), o.rec), nil
			}
		}
		if o, ok := w.l.tracker.get(w.g.key); ok && !o.held() {
			w.l.wakeHead(streams.EncodeResource(w.g.resource))
		}
	}
	if last == nil {
		last = newOpError(streams.CodeLocked, "wait ended")
	}
	return nil, last
}

// deleteRecord deletes whatever record is at key (a waiter record) by
// compare-and-set, and reports whether there was one (none is decided on
// a fresh read). The caller holds the lease key's lock.
func (l *handoverOps) deleteRecord(ctx context.Context, key string) (bool, error) {
	return commitLoop(ctx, l.engineDeps, "", false, engineSteps[observation, struct{}, bool]{
		read: l.readKey(key),
		decide: func(o observation, fresh bool) verdict[bool, struct{}] {
			switch {
			case o.held():
				return verdict[bool, struct{}]{kind: writePlan}
			case !fresh:
				return verdict[bool, struct{}]{kind: readAgain}
			}
			return answer[bool, struct{}](false, nil)
		},
		commit: func(ctx context.Context, o observation, _ struct{}) (bool, outcome, error) {
			seq, err := l.store.del(ctx, key, o.rev, nil)
			if err != nil && !isConflict(err) {
				l.tracker.forget(key)
			}
			if err == nil {
				l.tracker.observe(key, entry{rev: seq})
			}
			return quiet(settled(err == nil, err))
		},
	})
}

// cancel makes sure the request holds nothing and waits for nothing. Its
// tombstone carries the grant's message id, so an acquire of the request
// arriving later (delayed, or retried) within the retry window is a
// duplicate and never granted; the tombstone commits only if the lease key
// and the request's waiter key are still as read, which proves both reads.
// So a cancel of a request the service never saw costs two reads (the
// lease key and the waiter key, under the lock) and that one commit, which
// leaves the bucket after the retry window.
//
// A cancel belongs to the same caller as an acquire exactly when a
// retried acquire would: the same tenant, owner and request id. Another
// tenant's request of the same id has another hash, so another tombstone
// and waiter key; another owner's lease or wait of the same id is left
// alone (see tombstone).
func (l *handoverOps) cancel(ctx context.Context, resource, requestID, owner string, who origin) (*streams.CancelResponse, error) {
	key := streams.LeaseKey(resource)
	tenant := who.tenant()
	hash := requestHash(resource, requestID, tenant)
	wkey := streams.WaitKey(resource, hash)
	st, err := l.lock(ctx, key)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	t, err := l.tombstone(ctx, key, wkey, hash, owner)
	if err != nil || t.other {
		return &streams.CancelResponse{Resource: resource}, err
	}
	var released bool
	mine := func(rec *streams.Record) bool {
		return rec.RequestID == requestID && rec.Tenant == tenant && rec.Owner == owner
	}
	if t.lease.held() && mine(t.lease.rec) {
		e, err := l.endIf(ctx, resource, key, mine, endCancel, who, "")
		if err != nil {
			return nil, err
		}
		released = e != nil
	}
	dequeued, err := l.dequeue(ctx, resource, wkey, owner, t.waiter)
	if err != nil {
		return nil, err
	}
	l.report.cancelled(resource, released, dequeued, who)
	return &streams.CancelResponse{Resource: resource, Cancelled: released || dequeued}, nil
}

// otherWaiter reports whether the waiter record at wkey (the request's:
// its tenant and request id) is another owner's, on a fresh read: a lock
// set's cancel looks at every key so before it writes any tombstone
// (tombstone decides it again, proven, at each key).
func (l *handoverOps) otherWaiter(ctx context.Context, wkey, owner string) (bool, error) {
	o, err := l.current(ctx, wkey, true)
	if err != nil {
		return false, err
	}
	return o.held() && o.rec.Owner != owner, nil
}

// cancelSnap is what a cancel's tombstone commits on: the request's lease
// key and its waiter key, read fresh.
type cancelSnap struct {
	lease, waiter observation
}

// tombstoned is the outcome of a cancel's tombstone: the keys as its
// commit proved them, and whether a write with the request's grant id
// existed already (granted: the request was granted, or cancelled
// before), at revision seq (0 when the duplicate did not say); or, with
// other, that the waiter key holds another owner's record, and nothing
// was written but the proof of that read.
type tombstoned struct {
	cancelSnap
	seq     uint64
	granted bool
	other   bool
}

// tombstone writes the cancel tombstone of request hash (or its mark) on
// fresh reads of the lease key and of the request's waiter key wkey,
// conditioned on both (store.tombstone), and returns the reads it proved.
// Since every write of a waiter record checks that its request has no
// tombstone (placeWrites), the waiter key can only be deleted after it:
// the record read is the request's last place.
//
// A waiter record of another owner than the cancel's (the tenant's
// request id reused by another caller) is left alone: a tombstone would
// end that owner's wait. The read that found it is proven by the confirm
// write instead (other). A lease of that other owner needs no such care:
// its grant's message id is the tombstone's, so the tombstone is not
// written, and a lease is ended only when its owner is the cancel's.
func (l *handoverOps) tombstone(ctx context.Context, key, wkey, hash, owner string) (tombstoned, error) {
	return commitLoop(ctx, l.engineDeps, "", true, engineSteps[cancelSnap, bool, tombstoned]{
		read: func(ctx context.Context, fresh bool) (cancelSnap, bool, error) {
			var s cancelSnap
			var err error
			if s.lease, err = l.current(ctx, key, fresh); err == nil {
				s.waiter, err = l.current(ctx, wkey, fresh)
			}
			return s, false, err
		},
		decide: func(s cancelSnap, _ bool) verdict[tombstoned, bool] {
			other := s.waiter.held() && s.waiter.rec.Owner != owner
			return verdict[tombstoned, bool]{kind: writePlan, plan: other}
		},
		commit: func(ctx context.Context, s cancelSnap, other bool) (tombstoned, outcome, error) {
			if other {
				err := l.store.confirm(ctx, wkey, s.waiter.rev)
				return quiet(settled(tombstoned{cancelSnap: s, other: true}, err))
			}
			seq, dup, err := l.store.tombstone(ctx, hash, check{key, s.lease.rev}, check{wkey, s.waiter.rev})
			return quiet(settled(tombstoned{cancelSnap: s, seq: seq, granted: dup}, err))
		},
	})
}

// dequeue removes the waiter record at wkey, if it is owner's, and tells
// its waiting request at once; if the resource is free, the next waiter is
// woken. It decides first on w, the record as the cancel's tombstone
// proved it (or, for an ended session's wait, as the view shows it), and
// on fresh reads after a lost compare-and-set. After a tombstone only
// deletes reach the key (placeWrites), so a record a fresh read misses was
// removed by another (its hand-over, which the tombstone refuses, or the
// end of its wait).
func (l *handoverOps) dequeue(ctx context.Context, resource, wkey, owner string, w observation) (bool, error) {
	return commitLoop(ctx, l.engineDeps, "", false, engineSteps[observation, struct{}, bool]{
		read: func(ctx context.Context, fresh bool) (observation, bool, error) {
			if !fresh {
				return w, false, nil
			}
			o, err := l.current(ctx, wkey, true)
			return o, false, err
		},
		decide: func(o observation, _ bool) verdict[bool, struct{}] {
			if !o.held() || o.rec.Owner != owner {
				return answer[bool, struct{}](false, nil)
			}
			return verdict[bool, struct{}]{kind: writePlan}
		},
		commit: func(ctx context.Context, o observation, _ struct{}) (bool, outcome, error) {
			seq, err := l.store.del(ctx, wkey, o.rev, nil)
			if err != nil {
				if !isConflict(err) {
					l.tracker.forget(wkey)
				}
				return quiet(settled(false, err))
			}
			l.tracker.observe(wkey, entry{rev: seq})
			l.wakes.send(o.rec.Wake, nil) // the waiting request stops at once
			if o, ok := l.tracker.get(streams.LeaseKey(resource)); !ok || !o.held() {
				l.wakeHead(streams.EncodeResource(resource))
			}
			return true, committed, nil
		},
	})
}
