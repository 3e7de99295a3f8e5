package service

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/jetlock/jetlock/streams"
)

// Waiters in the simulation: an acquire of a lock that waits, the
// hand-over of a released lock to the head of its queue, and the cancel of
// a waiting acquire. The waiter's grants run the lock's engine (decideGrant,
// its claim on the waiters ahead as tracker.claim counts them), its record is
// written as the service decides it (decideEnqueue), and a release hands
// the lock over as handoverOps.end does: on the commit loop, the waiter
// picked next as the snapshot, decideHandover, and the writes leaseWrites
// plans with the waiter's grant message id beside the removal of its
// record, in one commit. A cancel writes the request's tombstone (the same
// message id, checked against the lease key as read), ends a lease the
// request was granted meanwhile and removes its record, as
// handoverOps.cancel does. Checked beside the other invariants: a request
// is never granted once a cancel of it was answered, nor holds anything
// then, nor takes a place in a queue (its record's new place checks that
// no tombstone stands: placeWrites); a waiter answered granted holds its
// key.

// simWaiter is a waiter record the simulation has written: its key, its
// request's hash and id.
type simWaiter struct {
	key, hash, id string
}

// simWaitRounds bounds the attempts of a waiting acquire before its
// client gives up and cancels it.
const simWaitRounds = 6

// claimFor is the claim of op's grant on name over the waiters queued
// there, as tracker.claim counts them on the instance's view: it may claim when
// none is ahead of its own record (a request not queued is behind every
// waiter).
func (s *sim) claimFor(op *simOp, name string) claim {
	ahead := 0
	for _, w := range s.queue(name) {
		e := s.readAt(op.inst, w.key, false)
		if e.held() && w.id != op.id && (op.waitRev == 0 || e.rev < op.waitRev) {
			ahead++
		}
	}
	return claim{ok: ahead == 0, ahead: ahead}
}

// queue returns the waiter records written for name, in the order written,
// dropping those that every view and the bucket show removed.
func (s *sim) queue(name string) []simWaiter {
	ws := s.waiters[name][:0]
	for _, w := range s.waiters[name] {
		live := s.b.last[w.key].held()
		for i := range s.views {
			live = live || s.views[i].get(&s.b, w.key).held()
		}
		if live {
			ws = append(ws, w)
		}
	}
	s.waiters[name] = ws
	return ws
}

// queued returns the keys of held whose name waiters wait for.
func (s *sim) queued(held []string) []string {
	var q []string
	for _, k := range held {
		name, ok := strings.CutPrefix(k, streams.LeaseKeyPrefix)
		if !ok {
			continue
		}
		for _, w := range s.queue(decodedResource(name)) {
			if s.b.last[w.key].held() {
				q = append(q, k)
				break
			}
		}
	}
	return q
}

// head is the waiter a hand-over of name picks on instance inst's view
// (tracker.head): the live record of the lowest revision, but for those
// in gone.
func (s *sim) head(inst int, name string, gone []string) (waiterInfo, bool) {
	var best waiterInfo
	for _, w := range s.queue(name) {
		e := s.readAt(inst, w.key, false)
		if !e.held() || slices.Contains(gone, w.hash) || best.hash != "" && e.rev >= best.rev {
			continue
		}
		best = waiterInfo{hash: w.hash, ticket: e.rev, rev: e.rev, requestID: w.id, owner: "o"}
	}
	return best, best.hash != ""
}

// runWaitOp runs a waiting acquire of a lock: attempts on the engine; when
// locked, its record queued; after simWaitRounds its client cancels it.
func (s *sim) runWaitOp(op *simOp) {
	g := op.grantOf()
	for round := 0; round < simWaitRounds; round++ {
		_, err := s.lockGrant(op, g)
		switch {
		case op.dead:
			return
		case err == nil:
			s.answeredGranted(op)
			s.removeWaiter(op)
			return
		case errors.Is(err, errSimLost):
			// Its next attempt finds the outcome: its own lease, or a
			// duplicate of its grant.
		case !isCode(err, streams.CodeLocked):
			s.removeWaiter(op) // refused otherwise (a semaphore's name, lease_lost): the wait ends
			return
		case op.waitRev == 0:
			if err := s.enqueue(op, g); err != nil {
				return
			}
		}
		for range 3 {
			if !op.await() {
				return
			}
		}
	}
	s.cancel(op, op)
}

// lockGrant is one decision on a lock's grant, on the engine (as the lock
// ops of runEngineOp).
func (s *sim) lockGrant(op *simOp, g *grantReq) (*streams.LeaseResponse, error) {
	return commitLoop(context.Background(), simRaces{op}, "", false, engineSteps[grantSnap, struct{}, *streams.LeaseResponse]{
		read: func(_ context.Context, fresh bool) (grantSnap, bool, error) { return s.readToGrant(op, g, fresh) },
		decide: func(sn grantSnap, fresh bool) verdict[*streams.LeaseResponse, struct{}] {
			return decideGrant(g, sn, fresh)
		},
		prove: func(_ context.Context, sn grantSnap) (*streams.LeaseResponse, outcome, error) {
			return s.renew(op, g.key, sn.o)
		},
		commit: func(_ context.Context, sn grantSnap, _ struct{}) (*streams.LeaseResponse, outcome, error) {
			return s.grant(op, g, sn.o)
		},
	})
}

// enqueue writes op's waiter record, as waiter.enqueue decides it
// (decideEnqueue) and writes it (placeWrites: a new place checks that the
// request has no cancel tombstone). Without the cancel rule it writes the
// record alone and looks for the tombstone afterwards, as the service did
// before: a cancel answered before the write then finds its request in
// the queue.
func (s *sim) enqueue(op *simOp, g *grantReq) error {
	key := streams.WaitKey(g.resource, g.hash)
	_, err := commitLoop(context.Background(), simRaces{op}, "", false, engineSteps[waitSnap, enqueuePlan, struct{}]{
		read: func(_ context.Context, fresh bool) (waitSnap, bool, error) {
			if !op.await() {
				return waitSnap{}, false, errSimDead
			}
			sn := waitSnap{o: observation{entry: s.readAt(op.inst, key, fresh)}, mine: op.waitRev}
			sn.cancelled = fresh && s.rules.cancelCheck && s.b.last[cancelKey(g.hash)].held()
			return sn, false, nil
		},
		decide: func(sn waitSnap, fresh bool) verdict[struct{}, enqueuePlan] { return decideEnqueue(sn, op.id, fresh) },
		commit: func(_ context.Context, sn waitSnap, p enqueuePlan) (struct{}, outcome, error) {
			if !s.rules.cancelCheck && p == enqueueAgain && s.b.last[cancelKey(g.hash)].held() {
				return struct{}{}, committed, leaseEnded(op.id)
			}
			if !op.await() {
				return struct{}{}, committed, errSimDead
			}
			rec := &streams.Record{RequestID: op.id, Owner: "o", Wake: op.id}
			ws := placeWrites(key, rec, sn.o, g.hash)
			if !s.rules.cancelCheck {
				ws = ws[:1]
			}
			if ok, _ := s.b.commit(ws, ""); !ok {
				return struct{}{}, stale, nil
			}
			if op.waitRev == 0 {
				s.waiters[g.resource] = append(s.waiters[g.resource], simWaiter{key: key, hash: g.hash, id: op.id})
			}
			op.waitRev = s.b.rev
			if !s.rules.cancelCheck && !sn.o.held() && s.b.last[cancelKey(g.hash)].held() {
				s.deleteRecord(op) // the read after the write, as newPlace did
				return struct{}{}, committed, leaseEnded(op.id)
			}
			return struct{}{}, committed, nil
		},
	})
	return err
}

// removeWaiter removes op's own record once it was granted (as
// removeRecord does), if it still stands.
func (s *sim) removeWaiter(op *simOp) {
	if op.waitRev == 0 || !op.await() {
		return
	}
	s.deleteRecord(op)
}

// deleteRecord deletes op's waiter record, if it stands, by
// compare-and-set.
func (s *sim) deleteRecord(op *simOp) {
	key := streams.WaitKey(op.names[0], op.grantOf().hash)
	if e := s.b.last[key]; e.held() && e.rec.RequestID == op.id {
		s.b.commit([]write{{key: key, expect: e.rev}}, "")
	}
}

// cancel cancels op's waiting acquire, as handoverOps.cancel does, in
// the steps of by (op's own client giving up, or a cancel request): the
// tombstone with the request's grant message id, checked against the
// lease key and the waiter key as read (a duplicate: the request was
// granted, or cancelled, before, and the mark is written instead); the
// request's lease ended if it holds one; its record removed (dequeue).
// The waiter key is read from the stream leader, which may be behind
// (leaderRead): only the tombstone's check of it proves the read.
// From its answer on, the request must never be granted, nor hold, nor
// wait in a queue.
func (s *sim) cancel(by, op *simOp) {
	g := op.grantOf()
	wkey := streams.WaitKey(op.names[0], g.hash)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if !by.await() {
			return
		}
		o, w := s.b.last[g.key], s.leaderRead(wkey)
		tomb := write{key: cancelKey(g.hash), expect: s.b.last[cancelKey(g.hash)].rev, e: entry{rec: &streams.Record{RequestID: "cancel"}}, msgID: grantMsgID(g.hash)}
		conds := []write{{key: g.key, expect: o.rev, check: true}}
		if s.rules.waiterCheck {
			conds = append(conds, write{key: wkey, expect: w.rev, check: true})
		}
		ok, dup := s.b.commit(s.ruled(append([]write{tomb}, conds...)), "")
		if !ok && !dup {
			continue // a key moved on: read again
		}
		if dup {
			// Granted (or cancelled) before: the mark, the tombstone
			// without the message id, on the same conditions
			// (store.tombstone).
			tomb.msgID, tomb.expect = "", s.b.last[cancelKey(g.hash)].rev
			if ok, _ := s.b.commit(append([]write{tomb}, conds...), ""); !ok {
				continue
			}
		}
		if o.held() && o.rec.RequestID == op.id {
			if ok, _ := s.b.commit(s.ends([]string{g.key}), ""); !ok {
				continue
			}
		}
		if !s.dequeue(by, op, wkey, w) {
			return
		}
		s.b.cancelled[op.id] = true
		s.granted["cancel"]++
		if s.holds(op) {
			s.fail("wait %s answered cancelled, but it holds %s", op.id, g.key)
		}
		if e := s.b.last[wkey]; e.held() && e.rec.RequestID == op.id {
			s.fail("request %s still waits in its queue after its cancel was answered", op.id)
		}
		return
	}
}

// dequeue removes op's waiter record at wkey as handoverOps.dequeue does:
// on w, the record as the cancel's tombstone proved it, then on leader
// reads after a lost compare-and-set. It reports false if by died.
func (s *sim) dequeue(by, op *simOp, wkey string, w entry) bool {
	for attempt := 0; attempt < maxAttempts && w.held() && w.rec.RequestID == op.id; attempt++ {
		if !by.await() {
			return false
		}
		if ok, _ := s.b.commit([]write{{key: wkey, expect: w.rev}}, ""); ok {
			return true
		}
		w = s.leaderRead(wkey)
	}
	return true
}

// leaderRead is key as a read from the stream leader finds it: as it
// stands, or, one time in four, as a leader that is behind (cut off by a
// partition that has just healed) answers: as it stood up to 63 writes
// ago.
func (s *sim) leaderRead(key string) entry {
	if s.rnd.IntN(4) != 0 {
		return s.b.last[key]
	}
	return s.b.before(key, s.b.rev+1-uint64(s.rnd.IntN(int(min(s.b.rev, 63))+1)))
}

// runCancel runs a cancel request for the waiting acquire op.target.
func (s *sim) runCancel(op *simOp) {
	s.cancel(op, op.target)
}

// dropWaiters removes the records of the waiting acquires of instance
// inst, which died: the other instances remove a record whose instance
// is gone (instances.go).
func (s *sim) dropWaiters(dead []*simOp) {
	for _, op := range dead {
		if op.kind == "wait" && op.waitRev != 0 {
			s.deleteRecord(op)
		}
	}
}

// handOver ends the lease o at key of name as handoverOps.end does: the
// waiter picked next on the instance's view is the snapshot; decideHandover
// decides; the grant to it and its record's removal commit together; a
// waiter whose grant is a duplicate (cancelled, or granted before) is
// dropped and the next one picked; when none can be handed the lease, the
// lease is deleted.
func (s *sim) handOver(op *simOp, name, key string, o observation) {
	var gone []string
	decided := false
	end := []write{{key: key, expect: o.rev, e: s.endOf(o.entry)}} // the lease's delete, when no waiter takes it
	_, err := commitLoop(context.Background(), simRaces{op}, "", false, engineSteps[handSnap, handPlan, struct{}]{
		read: func(context.Context, bool) (handSnap, bool, error) {
			if !op.await() {
				return handSnap{}, false, errSimDead
			}
			w, ok := s.head(op.inst, name, gone)
			return handSnap{w: w, ok: ok}, false, nil
		},
		decide: func(sn handSnap, _ bool) verdict[struct{}, handPlan] {
			return verdict[struct{}, handPlan]{kind: writePlan, plan: decideHandover(sn, o)}
		},
		commit: func(_ context.Context, sn handSnap, p handPlan) (struct{}, outcome, error) {
			if p == handRemove {
				decided = true
				s.b.commit(end, "")
				return struct{}{}, committed, nil
			}
			out, err := s.commitHandover(op, name, key, o, sn.w, &gone)
			decided = out == committed
			return struct{}{}, out, err
		},
	})
	if !decided && err == nil && !op.dead {
		s.b.commit(end, "")
	}
}

// commitHandover commits the hand-over of the lease o at key to waiter w,
// and reports as commitHandover does: a duplicate drops the waiter (stale:
// pick again); a conflict is the lease's (the release is decided again by
// its caller: over) or the waiter record's (stale, the record read fresh
// into op's view, as the service's fresh reads feed its tracker).
func (s *sim) commitHandover(op *simOp, name, key string, o observation, w waiterInfo, gone *[]string) (outcome, error) {
	wkey := streams.WaitKey(name, w.hash)
	rec := &streams.Record{LeaseID: w.requestID + "-h", RequestID: w.requestID, Owner: w.owner}
	msgID := grantMsgID(w.hash)
	if !s.rules.handoverID {
		msgID = ""
	}
	ws := append(s.ruled(leaseWrites(key, rec, o.rev, msgID, check{})), write{key: wkey, expect: w.rev})
	ok, dup := s.b.commitOver(ws, w.requestID)
	switch {
	case dup:
		*gone = append(*gone, w.hash)
		if e := s.b.last[wkey]; e.held() && e.rev == w.rev {
			s.b.commit([]write{{key: wkey, expect: w.rev}}, "")
		}
		return stale, nil
	case ok:
		s.granted["handover"]++
		return committed, nil
	case s.b.last[key].rev != o.rev:
		return committed, nil
	}
	s.views[op.inst].learn(&s.b, wkey, s.b.last[wkey])
	return stale, nil
}
