package service

import (
	"context"
	"errors"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// setWaiter is a waiting acquire of a lock set: its places on every key of
// the set (taken, refreshed and left in one atomic batch each), and the
// decisions of its steps. Its methods run in the request's own goroutine,
// one at a time.
type setWaiter struct {
	l     *setOps
	r     *setReq
	wkeys []string
	wake  string
	// places holds the revision of its record on each key (all zero
	// before it queued); until is when the wait ends.
	places []uint64
	until  time.Time
	// ttl is the TTL of the lease it claims: after its first attempt,
	// the hand-over TTL (its caller may have gone while it waited).
	ttl time.Duration
}

func (l *setOps) newSetWaiter(r *setReq) *setWaiter {
	w := &setWaiter{l: l, r: r, wake: l.wakes.subject(r.hash), places: make([]uint64, len(r.keys)), ttl: r.ttl}
	for i, res := range r.resources {
		w.wkeys = append(w.wkeys, streams.WaitKey(res, r.hashes[i]))
	}
	return w
}

func (w *setWaiter) queued() bool { return w.places[0] != 0 }

func (w *setWaiter) endsAt(t time.Time) { w.until = t }

// step claims the set if every key may be claimed, and otherwise queues
// the set's places (see waiter.step).
func (w *setWaiter) step(ctx context.Context, woken bool) (any, bool, error) {
	if err := w.l.guardRefusal(); err != nil && w.queued() {
		return nil, true, err // see waiter.step
	}
	unlock, err := w.l.lockAll(ctx, w.r.keys)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	if err := w.checkPlaces(ctx); err != nil {
		return nil, true, err
	}
	r := *w.r
	r.ttl = w.ttl
	var places []uint64
	if w.queued() {
		places = w.places
	}
	resp, err := w.l.trySet(ctx, &r, woken, places)
	w.ttl = min(w.r.ttl, w.l.cfg.HandoverTTL)
	var oe *opError
	if err == nil || !errors.As(err, &oe) || oe.code != streams.CodeLocked {
		if err == nil {
			clear(w.places) // removed by the grant's own batch
			return resp, true, nil
		}
		return nil, true, err
	}
	if !w.queued() {
		if qerr := w.enqueue(ctx); qerr != nil {
			if errors.As(qerr, &oe) {
				return nil, true, qerr
			}
			w.l.log.Warn("queue set waiter", "resources", len(w.r.keys), "err", qerr)
		}
	}
	return nil, false, err
}

// checkPlaces checks that the set's places are still its own. A place
// gone means: cancelled (stop: lease_lost), or removed because another
// instance took this one for dead: the set then queues again, at the
// end (its other places are given up, so that its places keep one order
// with every other set's).
func (w *setWaiter) checkPlaces(ctx context.Context) error {
	if !w.queued() {
		return nil
	}
	lost := false
	for i, k := range w.wkeys {
		o, ok := w.l.tracker.get(k)
		if ok && o.held() && o.rec.Wake != w.wake && o.rev > w.places[i] {
			// A retry of the request, served by another instance, has
			// taken over the places: it serves the caller now.
			clear(w.places)
			return newOpError(streams.CodeLeaseLost, "the waiting acquire was taken over by a retry")
		}
		if !ok || !o.held() || o.rev != w.places[i] && o.rec.Wake != w.wake {
			lost = true
		}
	}
	if !lost {
		return nil
	}
	// Only a tombstone found proves a cancel (see store.exists); after
	// none, the set queues again, and its new places commit only if none
	// stands (decidePlaces).
	if gone, err := w.l.store.exists(ctx, cancelKey(w.r.hashes[0])); err != nil {
		return err
	} else if gone {
		w.removePlaces(ctx)
		return newOpError(streams.CodeLeaseLost, "the waiting acquire was cancelled")
	}
	w.removePlaces(ctx)
	return nil
}

// setPlaces is what a set waiter's enqueue decides on: the records at its
// waiter keys, the revisions of its places (none when isNew), and, on a
// fresh read, whether the request's cancel tombstone stands.
type setPlaces struct {
	obs       []observation
	places    []uint64
	isNew     bool
	cancelled bool
}

// enqueue takes the set's places on every key in one atomic batch (a
// retry of the request keeps its tickets), on the commit loop. The caller
// holds every key's lock.
func (w *setWaiter) enqueue(ctx context.Context) error {
	defer w.l.tracker.caps.unreserveWaits(w.wkeys...)
	gone, err := commitLoop(ctx, w.l.engineDeps, "", false, engineSteps[setPlaces, struct{}, bool]{
		read: func(ctx context.Context, fresh bool) (setPlaces, bool, error) {
			obs, err := w.l.readAll(ctx, w.wkeys, fresh)
			s := setPlaces{obs: obs, places: w.places, isNew: !w.queued()}
			if err == nil && fresh {
				s.cancelled, err = w.l.store.exists(ctx, cancelKey(w.r.hashes[0]))
			}
			return s, false, err
		},
		decide: func(s setPlaces, fresh bool) verdict[bool, struct{}] { return decidePlaces(s, w.r, fresh) },
		commit: w.commitPlaces,
	})
	if gone {
		clear(w.places) // a place gone since checkPlaces: queue again next step
	}
	return err
}

// decidePlaces is the verdict on the set r's enqueue over s: keep its
// places, take over a retry's (r's own records), or take new ones; a
// place gone (on a fresh read) answers gone, and a place held by another
// request lease_lost. Places commit only while the request has no cancel
// tombstone (commitPlaces); when a fresh read finds one (after such a
// commit was refused), the request was cancelled: lease_lost.
func decidePlaces(s setPlaces, r *setReq, fresh bool) verdict[bool, struct{}] {
	if s.cancelled {
		return answer[bool, struct{}](false, newOpError(streams.CodeLeaseLost, "the waiting acquire was cancelled"))
	}
	for i, o := range s.obs {
		switch {
		case !s.isNew && o.held() && o.rev == s.places[i]:
		case !s.isNew && !fresh:
			return verdict[bool, struct{}]{kind: readAgain}
		case !s.isNew:
			return answer[bool, struct{}](true, nil)
		case o.held() && !r.mine(o.rec):
			return answer[bool, struct{}](false, newOpError(streams.CodeLeaseLost, "the waiting acquire's place is held by another request"))
		}
	}
	return verdict[bool, struct{}]{kind: writePlan}
}

// commitPlaces writes the places decided on s in one atomic batch: a held
// key (its own place, or its retry's, which the instance that queued it
// first stops serving) keeps its ticket; a new place needs room (w.room).
// The places commit with the check that the request has no cancel
// tombstone (of its first resource, which its cancel writes first), as a
// lock's waiter's do (placeWrites). A lost race, or a cancel found by the
// check, is decided again, unreported (stale).
func (w *setWaiter) commitPlaces(ctx context.Context, s setPlaces, _ struct{}) (bool, outcome, error) {
	l := w.l
	now := l.cfg.Clock.Now()
	window := recordWindow(l.cfg, w.until)
	recs := make([]*streams.Record, len(s.obs))
	msgs := make([]*batchMsg, len(s.obs))
	for i, o := range s.obs {
		rec := w.placeRecord(now, window)
		if o.held() {
			rec.Token, rec.GrantedAt = o.rec.TokenAt(o.rev), o.rec.GrantedAt // keep the ticket
		} else if err := w.room(i); err != nil {
			return false, committed, err
		}
		rec.RenewedAt = streams.FormatTime(now)
		rec.ExpiresAt = streams.FormatTime(now.Add(window))
		recs[i] = rec
		msgs[i] = l.store.putMsg(w.wkeys[i], streams.WaiterOf(rec).AppendJSON(nil), o.rev, "")
	}
	msgs = append(msgs, l.store.msgOf(cancelCheck(w.r.hashes[0])))
	if _, err := l.store.batch(ctx, "put", msgs); err != nil {
		if !isConflict(err) {
			for _, k := range w.wkeys {
				l.tracker.forget(k)
			}
		}
		return quiet(settled(false, err))
	}
	w.placed(recs, msgs)
	return false, committed, nil
}

// placeRecord is the waiter record of this set's acquire, written now for
// window.
func (w *setWaiter) placeRecord(now time.Time, window time.Duration) *streams.Record {
	r := w.r
	return &streams.Record{Owner: r.owner, Tenant: r.tenant, RequestID: r.requestID, TTLms: window.Milliseconds(),
		GrantedAt: streams.FormatTime(now), Wake: w.wake, LeaseTTLms: r.ttl.Milliseconds(), MaxHoldMs: r.maxHold.Milliseconds(),
		Session: r.session, Set: r.set, SetSize: len(r.keys)}
}

// placed records the places just written (recs as msgs[:len(recs)]).
func (w *setWaiter) placed(recs []*streams.Record, msgs []*batchMsg) {
	for i, k := range w.wkeys {
		w.l.tracker.observe(k, entry{rev: msgs[i].seq, rec: recs[i]})
		w.places[i] = msgs[i].seq
	}
}

// room reserves a new place in the queue of the set's i-th resource, or
// refuses it when that queue, or the tenant's waits with the set's places
// from the i-th on, would pass their caps. Places reserved stay so until
// enqueue ends.
func (w *setWaiter) room(i int) error {
	return w.l.names.reserveOrRefuse(w.wkeys[i], w.r.resources[i], w.r.tenant, len(w.wkeys)-i)
}

// removePlaces deletes the set's own places, best effort, in one atomic
// batch: if they stay, their liveness_ms ends them. The caller holds
// every key's lock.
func (w *setWaiter) removePlaces(ctx context.Context) {
	var idx []int
	var msgs []*batchMsg
	for i, k := range w.wkeys {
		if o, ok := w.l.tracker.get(k); ok && o.held() && o.rec.Wake == w.wake {
			idx = append(idx, i)
			msgs = append(msgs, w.l.store.deleteMsg(k, o.rev, nil))
		}
	}
	clear(w.places)
	if len(msgs) == 0 {
		return
	}
	if _, err := w.l.store.batch(ctx, "delete", msgs); err != nil {
		w.l.log.Warn("remove set waiter places", "resources", len(w.r.keys), "err", err)
		return
	}
	for j, i := range idx {
		w.l.tracker.observe(w.wkeys[i], entry{rev: msgs[j].seq})
	}
}

// leave ends the wait: it removes the set's places and wakes the next
// waiter of every resource that is free (this set may have been a head).
func (w *setWaiter) leave(ctx context.Context, last error) (any, error) {
	unlock, err := w.l.lockAll(ctx, w.r.keys)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if w.queued() {
		w.removePlaces(ctx)
		for _, k := range w.r.keys {
			if o, ok := w.l.tracker.get(k); ok && !o.held() {
				w.l.handover.wakeHead(resourceOf(k))
			}
		}
	}
	if last == nil {
		last = newOpError(streams.CodeLocked, "wait ended")
	}
	return nil, last
}
