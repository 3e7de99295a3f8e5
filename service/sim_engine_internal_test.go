package service

import (
	"context"
	"errors"
	"iter"
	"os"
	"runtime/debug"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// The simulation's grants of locks, elections, permits and lock sets, and
// the retries of sets, run the service's own engine: commitLoop, with the
// deciders decideGrant, decidePermit and decideSet, the name rule
// (decideName, mayRetire) and the writes a grant plans (grantWrites,
// setGrantWrites). Only the read, prove and commit steps are the
// simulation's: they read an instance's view or the model bucket, and
// apply the planned writes to the model, where a reply can be lost. Each
// request is a coroutine (iter.Pull) that hands control back to the
// seeded scheduler at every read and every commit, so requests of several
// instances interleave at exactly those points, the same way for a seed.

// errSimDead ends a request whose instance died.
var errSimDead = errors.New("instance died")

// errSimLost is a commit whose reply was lost: its outcome is unknown to
// the request, which answers unavailable; its client retries it.
var errSimLost = newOpError(streams.CodeUnavailable, "the reply was lost")

// simNow is the clock of the simulation's decisions: no lease expires.
var simNow = time.Unix(1_700_000_000, 0)

// engineOp starts op, a lock, election or permit request, as a coroutine
// that runs the engine.
func (s *sim) engineOp(op *simOp) {
	op.next, op.stop = iterPull(op, func() { s.runEngineOp(op) })
}

// iterPull makes run op's coroutine. A panic in it is passed on by
// iter.Pull without the coroutine's stack, so the stack is printed first.
func iterPull(op *simOp, run func()) (func() (struct{}, bool), func()) {
	return iter.Pull(func(yield func(struct{}) bool) {
		op.yield = yield
		defer func() {
			if r := recover(); r != nil {
				os.Stderr.Write(debug.Stack())
				panic(r)
			}
		}()
		run()
	})
}

// await hands control back to the scheduler; it reports false once op's
// instance has died (op then ends without another step).
func (op *simOp) await() bool {
	if op.dead || !op.yield(struct{}{}) {
		op.dead = true
		return false
	}
	return true
}

// simRaces is the commit loop's report of a lost race: a pause is one
// step of the scheduler.
type simRaces struct{ op *simOp }

func (r simRaces) lostRace(_ context.Context, pause bool) {
	if pause {
		r.op.await()
	}
}

// grantOf is op's request as the service makes it.
func (op *simOp) grantOf() *grantReq {
	n := op.names[0]
	g := &grantReq{resource: n, requestID: op.id, owner: "o", value: op.value}
	if op.limit != 0 {
		g.resource, g.sem, g.limit = streams.PermitQueue(n), n, op.limit
	}
	g.key, g.hash = streams.LeaseKey(g.resource), requestHash(g.resource, op.id, "")
	return g
}

// runEngineOp runs op's grant on the engine and checks its answer.
func (s *sim) runEngineOp(op *simOp) {
	switch op.kind {
	case "wait":
		s.runWaitOp(op)
		return
	case "cancel":
		s.runCancel(op)
		return
	}
	g := op.grantOf()
	var err error
	switch {
	case op.session != "":
		err = s.runSetOp(op)
	case op.limit == 0:
		_, err = s.lockGrant(op, g)
	default:
		_, err = commitLoop(context.Background(), simRaces{op}, "", false, engineSteps[permitsRead, struct{}, *streams.LeaseResponse]{
			read:   func(_ context.Context, fresh bool) (permitsRead, bool, error) { return s.readPermits(op, g, fresh) },
			decide: func(p permitsRead, _ bool) verdict[*streams.LeaseResponse, struct{}] { return decidePermit(g, p) },
			prove: func(_ context.Context, p permitsRead) (*streams.LeaseResponse, outcome, error) {
				return s.renew(op, permitKey(g.sem, p.mine), p.held)
			},
			commit: func(_ context.Context, p permitsRead, _ struct{}) (*streams.LeaseResponse, outcome, error) {
				return s.grant(op, g.permit(p.free[0]), p.frees[0])
			},
		})
	}
	switch {
	case op.dead:
	case err == nil && op.session != "":
		s.answeredHeld(op)
	case err == nil:
		s.answeredGranted(op)
	case errors.Is(err, errSimLost) && s.rnd.IntN(4) != 0:
		s.retryLater(op) // its client retries with the same request id
	}
}

// readToGrant is the read step of a lock's grant: the lease key under the
// name rule, on op's instance's view or fresh.
func (s *sim) readToGrant(op *simOp, g *grantReq, fresh bool) (sn grantSnap, again bool, err error) {
	if !op.await() {
		return sn, false, errSimDead
	}
	sn.o = observation{entry: s.readAt(op.inst, g.key, fresh)}
	if sn.o, again, err = s.claimName(op, g.resource, sn.o, 0, fresh); again || err != nil {
		return sn, again, err
	}
	sn.claim = s.claimFor(op, g.resource)
	sn.facts = s.facts()
	return sn, false, nil
}

// readPermits is the read step of a permit's grant: the name's lease key
// under the name rule, then every permit.
func (s *sim) readPermits(op *simOp, g *grantReq, fresh bool) (p permitsRead, again bool, err error) {
	if !op.await() {
		return p, false, errSimDead
	}
	name := observation{entry: s.readAt(op.inst, streams.LeaseKey(g.sem), fresh)}
	if name, again, err = s.claimName(op, g.sem, name, g.limit, fresh); again || err != nil {
		return p, again, err
	}
	g.nameRev = name.rev
	for k := 1; k <= g.limit; k++ {
		o := observation{entry: s.readAt(op.inst, permitKey(g.sem, k), fresh)}
		if o.held() && g.mine(o.rec) {
			return permitsRead{mine: k, held: o}, false, nil
		}
		if !o.held() {
			if o.end.Ended(g.requestID, g.tenant, simNow, time.Hour) {
				return p, false, leaseEnded(g.requestID)
			}
			p.free, p.frees = append(p.free, k), append(p.frees, o)
		}
	}
	p.facts = s.facts()
	return p, false, nil
}

// facts are the view's facts of every decision: instances follow the
// bucket (their views lag), no guard, no session caps.
func (s *sim) facts() viewFacts {
	return viewFacts{now: simNow, window: time.Hour, following: true}
}

// readAt reads key on instance inst's view (which may first catch up a
// little), or fresh from the model bucket.
func (s *sim) readAt(inst int, key string, fresh bool) entry {
	if fresh {
		return s.b.last[key]
	}
	v := &s.views[inst]
	if s.rnd.IntN(4) == 0 {
		v.catchUp(&s.b, s.rnd.IntN(3))
	}
	return v.get(&s.b, key)
}

// claimName is the name rule of the read step, as nameOps.claimName
// applies it (decideName; a retirement proves every permit free with
// mayRetire and deletes the record in one commit), with the limit rule
// taken out when the simulation's rules say so.
func (s *sim) claimName(op *simOp, name string, o observation, limit int, fresh bool) (observation, bool, error) {
	action := decideName(o.entry, limit)
	if !s.rules.limit && action == nameRetire && o.sem != 0 && limit != 0 {
		action = nameGrant
	}
	switch action {
	case nameGrant:
		return o, false, nil
	case nameRetire:
		return o, true, s.retire(op, name, o, fresh)
	}
	if !fresh {
		return o, true, nil // the view may lag the lease's end
	}
	return o, false, errKind(name, nameUse{election: o.rec.Value != "", lock: o.rec.Value == ""}, limit)
}

// retire retires the name record o of name, if every permit of its limit
// is free: checks of them all and the record's delete, in one commit. It
// returns a refusal when a permit is held.
func (s *sim) retire(op *simOp, name string, o observation, fresh bool) error {
	var ws []write
	permits := make([]entry, o.sem)
	for k := range o.sem {
		permits[k] = s.readAt(op.inst, permitKey(name, k+1), fresh)
		ws = append(ws, write{key: permitKey(name, k+1), expect: permits[k].rev, check: true})
	}
	if !mayRetire(permits) {
		if !fresh {
			return nil // decided again on reads
		}
		return errKind(name, nameUse{limit: o.sem}, op.limit)
	}
	if !op.await() {
		return errSimDead
	}
	s.b.commit(append(ws, write{key: streams.LeaseKey(name), expect: o.rev}), "")
	return nil
}

// grant is the commit step of a grant to g over o: the writes grantWrites
// plans for it, with the simulation's rules applied, committed to the
// model; a reply may be lost.
func (s *sim) grant(op *simOp, g *grantReq, o observation) (*streams.LeaseResponse, outcome, error) {
	if !op.await() {
		return nil, committed, errSimDead
	}
	rec := &streams.Record{LeaseID: op.id, RequestID: op.id, Owner: g.owner, Limit: g.limit, Value: g.value}
	ok, dup := s.b.commit(s.ruled(grantWrites(g, rec, o.rev, check{})), op.id)
	switch {
	case dup:
		return s.earlierGrant(op)
	case !ok:
		return nil, conflicted, nil
	case s.rnd.IntN(20) == 0:
		return nil, committed, errSimLost
	}
	return &streams.LeaseResponse{Resource: g.resource, Token: s.b.rev}, committed, nil
}

// earlierGrant answers a grant that found an earlier write of its request
// (a duplicate), as leaseOps.earlierGrant does: on fresh reads, the
// request's lease if a key holds it, else lease_lost.
func (s *sim) earlierGrant(op *simOp) (*streams.LeaseResponse, outcome, error) {
	if !s.holds(op) {
		return nil, committed, leaseEnded(op.id)
	}
	return &streams.LeaseResponse{Resource: op.names[0]}, committed, nil
}

// holds reports whether op's lease is in the bucket: at a key of its name
// (its lease key, or a permit of its limit), or for a set at every key.
func (s *sim) holds(op *simOp) bool {
	if op.session != "" {
		for _, n := range op.names {
			if e := s.b.last[streams.LeaseKey(n)]; !e.held() || e.rec.RequestID != op.id {
				return false
			}
		}
		return true
	}
	g := op.grantOf()
	keys := []string{g.key}
	if op.limit != 0 {
		keys = keys[:0]
		for k := 1; k <= op.limit; k++ {
			keys = append(keys, permitKey(g.sem, k))
		}
	}
	for _, k := range keys {
		if e := s.b.last[k]; e.held() && g.mine(e.rec) {
			return true
		}
	}
	return false
}

// renew is the proof of a retry that found its own lease o at key: the
// lease renewed by compare-and-set on its revision, as extend does.
func (s *sim) renew(op *simOp, key string, o observation) (*streams.LeaseResponse, outcome, error) {
	if !op.await() {
		return nil, committed, errSimDead
	}
	if ok, _ := s.b.commit([]write{{key: key, expect: o.rev, e: entry{rec: o.rec}}}, ""); !ok {
		return nil, conflicted, nil
	}
	return &streams.LeaseResponse{Resource: op.names[0]}, committed, nil
}

// ruled applies the simulation's rules to a grant's writes: without once,
// no message id; without nameRecord, no name record.
func (s *sim) ruled(ws []write) []write {
	out := ws[:0:0]
	for _, w := range ws {
		if !s.rules.once {
			w.msgID = ""
		}
		if !s.rules.nameRecord && w.e.sem != 0 {
			continue
		}
		out = append(out, w)
	}
	return out
}

// answeredGranted checks a grant's answer against the bucket: the request
// holds a key of its name now.
func (s *sim) answeredGranted(op *simOp) {
	s.granted[op.kind]++
	if !s.holds(op) {
		s.fail("%s %s on %s answered granted, but it holds no key there", op.kind, op.id, op.names[0])
	}
}

// retryLater starts a retry of op (the same request id) later.
func (s *sim) retryLater(op *simOp) {
	r := &simOp{kind: op.kind, id: op.id, inst: s.rnd.IntN(len(s.views)), names: op.names, limit: op.limit, value: op.value, session: op.session}
	s.retries = append(s.retries, r)
}

// setOf is op's lock set as the service makes it, in op's session (the
// simulation names a session by its key).
func (op *simOp) setOf() *setReq {
	r := newSetReq(op.names, op.id, "o", origin{})
	r.session = op.session
	return r
}

// runSetOp runs op's grant of a lock set in its session on the engine:
// decideSet, with the set's writes (setGrantWrites) checking the session's
// record, as a lone instance commits them; a retry found held is proven
// (every key and the session checked in one commit) before it is answered.
func (s *sim) runSetOp(op *simOp) error {
	r := op.setOf()
	_, err := commitLoop(context.Background(), simRaces{op}, r.session, false, engineSteps[setSnap, struct{}, *streams.SetLeaseResponse]{
		read: func(_ context.Context, fresh bool) (setSnap, bool, error) { return s.readSet(op, r, fresh) },
		decide: func(sn setSnap, fresh bool) verdict[*streams.SetLeaseResponse, struct{}] {
			return decideSet(r, sn, fresh)
		},
		prove: func(_ context.Context, sn setSnap) (*streams.SetLeaseResponse, outcome, error) {
			return s.proveSet(op, r, sn)
		},
		commit: func(_ context.Context, sn setSnap, _ struct{}) (*streams.SetLeaseResponse, outcome, error) {
			return s.grantSet(op, r, sn)
		},
		earlier: func(context.Context, setSnap) (*streams.SetLeaseResponse, error) {
			return s.earlierSet(op, r)
		},
	})
	return err
}

// readSet is the read step of a set's grant: its session's record (not
// live: decided on a fresh read, then lease_lost), and every key under the
// name rule.
func (s *sim) readSet(op *simOp, r *setReq, fresh bool) (sn setSnap, again bool, err error) {
	if !op.await() {
		return sn, false, errSimDead
	}
	sn.sess = observation{entry: s.readAt(op.inst, r.session, fresh)}
	if !sn.sess.held() || sn.sess.rec.LeaseID != op.secret {
		if !fresh {
			return sn, true, nil
		}
		return sn, false, errNoSession()
	}
	for i, k := range r.keys {
		o := observation{entry: s.readAt(op.inst, k, fresh)}
		if o.sem != 0 {
			if o, again, err = s.claimName(op, r.resources[i], o, 0, fresh); again || err != nil {
				return sn, again, err
			}
		}
		sn.obs = append(sn.obs, o)
	}
	sn.expired, sn.claims = make([]bool, len(sn.obs)), make([]claim, len(sn.obs))
	for i := range sn.claims {
		sn.claims[i].ok = true
	}
	sn.facts = s.facts()
	return sn, false, nil
}

// grantSet is the commit step of a set's grant: the writes setGrantWrites
// plans, with the session's check, and the simulation's rules applied.
func (s *sim) grantSet(op *simOp, r *setReq, sn setSnap) (*streams.SetLeaseResponse, outcome, error) {
	if !op.await() {
		return nil, committed, errSimDead
	}
	rec := &streams.Record{LeaseID: op.id, RequestID: op.id, Owner: r.owner, Set: r.set, SetSize: len(r.keys), Session: r.session}
	session := check{key: r.session, rev: sn.sess.rev}
	if !s.rules.sessionCheck {
		session = check{}
	}
	ok, dup := s.b.commit(s.ruled(setGrantWrites(r, rec, sn.obs, nil, session)), op.id)
	switch {
	case dup:
		return nil, duplicated, nil
	case !ok:
		return nil, conflicted, nil
	}
	s.sets = append(s.sets, op)
	s.setByID[op.id] = op
	if s.rnd.IntN(20) == 0 {
		return nil, committed, errSimLost
	}
	return &streams.SetLeaseResponse{}, committed, nil
}

// endSet ends the set lease id wherever the bucket holds it, in one
// commit (as endSetKeys does).
func (s *sim) endSet(id string) {
	if ws := s.ends(s.keysOf(id)); len(ws) > 0 {
		s.b.commit(ws, "")
	}
}

// sweep ends, as the instances do once a session has ended
// (tracker.expired, the session's end), every set whose session ended
// since its grant or was not live at it.
func (s *sim) sweep() {
	for _, k := range s.leaseKeys() {
		e := s.b.last[k]
		if !e.held() || e.rec.Session == "" {
			continue
		}
		at := s.b.sessionAt(e.rec.Session, e.rev)
		if last := s.b.last[e.rec.Session]; !at.held() || last.rev != at.rev {
			s.endSet(e.rec.LeaseID)
		}
	}
}

// earlierSet answers a set's grant that found an earlier write of its
// request, as setOps.earlierSet does: on fresh reads, decideEarlierSet,
// and a lease found proven (proveSet).
func (s *sim) earlierSet(op *simOp, r *setReq) (*streams.SetLeaseResponse, error) {
	return commitLoop(context.Background(), simRaces{op}, "", true, engineSteps[setSnap, struct{}, *streams.SetLeaseResponse]{
		read: func(context.Context, bool) (sn setSnap, _ bool, _ error) {
			if !op.await() {
				return sn, false, errSimDead
			}
			sn.sess = observation{entry: s.b.last[r.session]}
			for _, k := range r.keys {
				sn.obs = append(sn.obs, observation{entry: s.b.last[k]})
			}
			return sn, false, nil
		},
		decide: func(sn setSnap, _ bool) verdict[*streams.SetLeaseResponse, struct{}] {
			return decideEarlierSet(r, sn.obs)
		},
		prove: func(_ context.Context, sn setSnap) (*streams.SetLeaseResponse, outcome, error) {
			return s.proveSet(op, r, sn)
		},
	})
}

// proveSet is the proof of a set's retry found held: every key and the
// session checked in one commit (without the retryProof rule, none); a
// session that has ended is lease_lost.
func (s *sim) proveSet(op *simOp, r *setReq, sn setSnap) (*streams.SetLeaseResponse, outcome, error) {
	if !s.rules.retryProof {
		return &streams.SetLeaseResponse{}, committed, nil
	}
	if !sn.sess.held() || sn.sess.rec.LeaseID != op.secret {
		return nil, committed, errNoSession()
	}
	if !op.await() {
		return nil, committed, errSimDead
	}
	ws := []write{{key: r.session, expect: sn.sess.rev, check: true}}
	for i, k := range r.keys {
		ws = append(ws, write{key: k, expect: sn.obs[i].rev, check: true})
	}
	if ok, _ := s.b.commit(ws, ""); !ok {
		return nil, conflicted, nil
	}
	return &streams.SetLeaseResponse{}, committed, nil
}

// answeredHeld checks a set's grant, or its retry, answered held against
// the bucket: every key holds it and its session lives.
func (s *sim) answeredHeld(op *simOp) {
	if op.kind == "retry" {
		s.granted["retry held"]++
	} else {
		s.granted[op.kind]++
	}
	if sess := s.b.last[op.session]; !sess.held() || sess.rec.LeaseID != op.secret {
		s.fail("%s %s answered held after its session %s ended", op.kind, op.id, op.session)
	}
	if !s.holds(op) {
		s.fail("%s %s answered held, but does not hold every key of %v", op.kind, op.id, op.names)
	}
}
