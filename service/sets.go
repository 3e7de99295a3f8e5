package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Lock sets. An acquire of several resources is granted on all of them
// in one atomic batch of per-key compare-and-set writes (one commit), or
// on none: half a set is never written, so never granted, never visible
// and never left behind by a crash. Every key's record carries the same
// lease id and the set's hash and size; each key's fencing token is the
// revision of its own grant. Renewals and releases write every key in one
// atomic batch too, and a set's expiry (or the end of its session) ends
// every key.
//
// Waiting: a set's places are taken on every key in one atomic batch, so
// the tickets of any two sets compare the same way on every key they share
// (their batches' commit order) and no cycle of waiters can form. Single
// waiters and set waiters share the queues. A set is granted when it may
// claim every key (it is at the head of each, and each is free); a set
// waiter at the head of a free key keeps it while the set's other keys are
// held (tracker.claim). Ending a lease whose head waiter waits for a set wakes
// it rather than handing it the one key.

// setOps decides the requests on lock sets: acquire, renew, release,
// expiry and cancel, and the waits of sets (sets_wait.go).
type setOps struct {
	*engineDeps
	// the roles it reaches (see locks)
	leases   *leaseOps
	sessions *sessionOps
	handover *handoverOps
	names    *nameOps
}

// setReq is one validated request naming a set.
type setReq struct {
	resources []string // sorted
	keys      []string // their lease keys, in the same order
	hashes    []string // per resource: the request's hash there (grant message id, waiter key, tombstone)
	set       string   // the set's hash
	hash      string   // the request's own hash: its wake subject
	requestID string
	owner     string
	tenant    string
	ttl       time.Duration
	maxHold   time.Duration
	who       origin
	session   string
	secret    string
}

// setHash names a set of sorted resources.
func setHash(resources []string) string {
	h := sha256.Sum256([]byte(strings.Join(resources, "\x00")))
	return hex.EncodeToString(h[:20])
}

// newSetReq builds the request of requestID by who for the sorted
// resources. Its per-key hashes are its own (the request id with the set),
// so a single acquire of one of the resources with the same request id is
// another request.
func newSetReq(resources []string, requestID, owner string, who origin) *setReq {
	tenant := who.tenant()
	r := &setReq{resources: resources, set: setHash(resources), requestID: requestID, owner: owner, tenant: tenant, who: who}
	r.hash = requestHash("", requestID+"\x00"+r.set, tenant)
	for _, res := range resources {
		r.keys = append(r.keys, streams.LeaseKey(res))
		r.hashes = append(r.hashes, requestHash(res, requestID+"\x00"+r.set, tenant))
	}
	return r
}

// mine reports whether rec, a lease or waiter record, is this request's.
func (r *setReq) mine(rec *streams.Record) bool {
	return rec.RequestID == r.requestID && rec.Tenant == r.tenant && rec.Set == r.set
}

// grantReq is r seen as the request for its i-th resource, for the
// decisions it shares with single acquires.
func (r *setReq) grantReq(i int) *grantReq {
	return &grantReq{resource: r.resources[i], requestID: r.requestID, owner: r.owner, key: r.keys[i], hash: r.hashes[i],
		ttl: r.ttl, maxHold: r.maxHold, who: r.who, tenant: r.tenant, session: r.session, secret: r.secret}
}

// lockAll locks keys in sorted order (every set does, and other requests
// hold one key at a time, so no two requests wait for each other in a
// cycle) and returns the function that unlocks them.
func (l *setOps) lockAll(ctx context.Context, keys []string) (func(), error) {
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	held := make([]*keyLock, 0, len(sorted))
	unlock := func() {
		for _, st := range held {
			st.unlock()
		}
	}
	for _, k := range sorted {
		st, err := l.lock(ctx, k)
		if err != nil {
			unlock()
			return nil, err
		}
		held = append(held, st)
	}
	return unlock, nil
}

// readAll returns what is known of every key of r.
func (l *setOps) readAll(ctx context.Context, keys []string, fresh bool) ([]observation, error) {
	obs := make([]observation, len(keys))
	for i, k := range keys {
		o, err := l.current(ctx, k, fresh)
		if err != nil {
			return nil, err
		}
		obs[i] = o
	}
	return obs, nil
}

// acquireSet decides an acquire of a set that does not wait.
func (l *setOps) acquireSet(ctx context.Context, r *setReq) (*streams.SetLeaseResponse, error) {
	unlock, err := l.lockAll(ctx, r.keys)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return l.trySet(ctx, r, false, nil)
}

// trySet makes one decision on the acquire of set r: grant every key,
// return the request's existing lease, or refuse. queued holds the
// revisions of r's waiter records (nil when it has none); a grant removes
// them in the same commit. The caller holds every key's lock.
func (l *setOps) trySet(ctx context.Context, r *setReq, fresh bool, queued []uint64) (*streams.SetLeaseResponse, error) {
	for _, k := range r.keys {
		if l.tracker.retry.hasEnded(k, r.requestID, r.tenant) {
			return nil, leaseEnded(r.requestID)
		}
	}
	if queued != nil && (fresh || l.following()) {
		// A waiting set woken, or re-checking while this instance follows
		// another's writes (it would read fresh before deciding).
		if err := l.stillBlocked(ctx, r); err != nil {
			return nil, err
		}
	}
	return commitLoop(ctx, l.engineDeps, r.session, fresh, engineSteps[setSnap, struct{}, *streams.SetLeaseResponse]{
		read: func(ctx context.Context, fresh bool) (setSnap, bool, error) {
			return l.readSet(ctx, r, fresh)
		},
		decide: func(s setSnap, fresh bool) verdict[*streams.SetLeaseResponse, struct{}] {
			return decideSet(r, s, fresh)
		},
		prove: func(ctx context.Context, s setSnap) (*streams.SetLeaseResponse, outcome, error) {
			return settled(l.proveSet(ctx, r, s.obs))
		},
		commit: func(ctx context.Context, s setSnap, _ struct{}) (*streams.SetLeaseResponse, outcome, error) {
			resp, err := l.grantSet(ctx, r, s.obs, queued, s.sess)
			if errors.Is(err, errDuplicate) {
				return nil, duplicated, nil
			}
			return settled(resp, err)
		},
		earlier: func(ctx context.Context, _ setSnap) (*streams.SetLeaseResponse, error) {
			return l.earlierSet(ctx, r)
		},
		// Another writer's commit on one of the keys (perhaps this
		// request's own attempt on another instance, still being
		// applied): decide again once it has committed.
		pause: true,
	})
}

// setSnap is what a decision on a set's grant rests on: the request's
// session (sess, if any), the observations of the set's keys, and what the
// instance's view adds as of the read: whether each has expired as it
// observes it, whether the request may claim each before its waiters, and
// the view's facts (room: the session's cap for the set's keys).
type setSnap struct {
	sess    observation
	obs     []observation
	expired []bool
	claims  []claim
	facts   viewFacts
}

// proveSet answers a retry of set r, whose every key (observed in obs)
// still holds its lease: renewed, or in a session answered held only once
// proven, as a single lease's is (setHeldInSession). errConflict asks to
// decide again on fresh reads.
func (l *setOps) proveSet(ctx context.Context, r *setReq, obs []observation) (*streams.SetLeaseResponse, error) {
	if r.session == "" {
		return l.renewRetried(ctx, r, obs)
	}
	return l.setHeldInSession(ctx, r, obs)
}

// readSet reads what a decision on set r's grant rests on: r's session
// (if any) and every key of the set, each under the name rule (claimName,
// whose retirement of a name record replaces the key's observation with
// its delete). again asks to decide on fresh reads.
func (l *setOps) readSet(ctx context.Context, r *setReq, fresh bool) (s setSnap, again bool, err error) {
	if r.session != "" {
		if s.sess, err = l.sessions.session(ctx, r.grantReq(0), fresh); err != nil {
			return s, false, err
		}
	}
	if s.obs, err = l.readAll(ctx, r.keys, fresh); err != nil {
		return s, false, err
	}
	for i, o := range s.obs {
		if o.sem == 0 {
			continue
		}
		if s.obs[i], again, err = l.names.claimName(ctx, r.resources[i], o, 0, fresh); again || err != nil {
			return s, again, err
		}
	}
	now := time.Now()
	s.expired, s.claims = make([]bool, len(s.obs)), make([]claim, len(s.obs))
	for i, o := range s.obs {
		s.expired[i] = l.tracker.expired(o, now)
		s.claims[i] = l.tracker.claim(resourceOf(r.keys[i]), r.hashes[i], o, l.cfg.Reservation)
	}
	s.facts = l.viewFacts()
	if r.session != "" {
		if _, n := l.tracker.sessionIx.memberCount(r.session); n+len(r.keys) > l.cfg.MaxPerSession {
			s.facts.room = newOpError(streams.CodeTooManyWaiters, "this session holds %d leases and waits, and the set needs %d more: the cap is %d", n, len(r.keys), l.cfg.MaxPerSession)
		}
	}
	return s, false, nil
}

// stillBlocked answers "locked" when a fresh read proves that set r, which
// waits in the queues, cannot be granted now: a key that this instance
// sees held by another lease still is. A waiting set is woken each time
// one of its keys frees, usually while others are still held; reading
// only the first key seen held, instead of every key of the set from the
// stream leader, makes such a wake cost one read. Only a refusal is
// decided here, and only when no key is seen held by r's own request, or
// ended as its lease, or holding a foreign value (a retry's grant, a set
// lease partly or wholly ended, a foreign value are decided on reads of
// every key): anything else falls through to the full decision on fresh
// reads.
// The caller holds every key's lock.
func (l *setOps) stillBlocked(ctx context.Context, r *setReq) error {
	obs := make([]observation, len(r.keys))
	expired := make([]bool, len(r.keys))
	probe := -1
	now := time.Now()
	for i, k := range r.keys {
		o, err := l.current(ctx, k, false) // the tracker's view; no read once synced
		if err != nil {
			return nil
		}
		if o.foreign || o.held() && r.mine(o.rec) || !o.held() && o.end.Ended(r.requestID, r.tenant, l.cfg.Clock.Now(), l.tracker.window) {
			return nil
		}
		expired[i] = l.tracker.expired(o, now)
		if probe < 0 && o.held() && !expired[i] {
			probe = i
		}
		obs[i] = o
	}
	if probe < 0 {
		return nil
	}
	o, err := l.current(ctx, r.keys[probe], true)
	if err != nil || !o.held() || r.mine(o.rec) || l.tracker.expired(o, time.Now()) {
		return nil // decided on fresh reads of every key
	}
	obs[probe] = o
	return setLocked(r, obs, expired, false)
}

// decideSet is the verdict on set r from the snapshot s of its keys:
// prove a retry (every key holds r's lease), refuse, decide on a fresh
// read first, or write the set's grant. It is a function of its arguments
// alone.
func decideSet(r *setReq, s setSnap, fresh bool) verdict[*streams.SetLeaseResponse, struct{}] {
	type v = verdict[*streams.SetLeaseResponse, struct{}]
	refuse := func(err error) v { return answer[*streams.SetLeaseResponse, struct{}](nil, err) }
	obs := s.obs
	mine := 0
	for _, o := range obs {
		if o.held() && r.mine(o.rec) {
			mine++
		}
	}
	switch {
	case mine == len(obs):
		rec := obs[0].rec
		if rec.Owner != r.owner || rec.Session != r.session {
			return refuse(setLocked(r, obs, s.expired, true))
		}
		return v{kind: proveRetry}
	case mine > 0:
		// Part of the set's lease has ended (a revoke of one key): the
		// lease is over. Unless the keys were seen apart from the grant's
		// commit (this instance's view lags, or the reads straddled it).
		if !fresh || straddles(r, obs) {
			return v{kind: readAgain}
		}
		return refuse(leaseEnded(r.requestID))
	}
	held := false
	for i, o := range obs {
		if (o.held() || o.foreign) && !s.expired[i] {
			if !fresh && (o.foreign || s.facts.following) {
				return v{kind: readAgain}
			}
			held = true
			continue
		}
		if !o.held() && !o.foreign && o.end.Ended(r.requestID, r.tenant, s.facts.now, s.facts.window) {
			return refuse(leaseEnded(r.requestID))
		}
	}
	if held {
		return refuse(setLocked(r, obs, s.expired, false))
	}
	for i, c := range s.claims {
		if !c.ok {
			return refuse(newOpError(streams.CodeLocked, "resource %q is free but reserved for the %d waiters ahead", r.resources[i], c.ahead))
		}
	}
	if s.facts.room != nil {
		return refuse(s.facts.room)
	}
	if s.facts.guard != nil {
		return refuse(s.facts.guard)
	}
	return v{kind: writePlan}
}

// setLocked is the "locked" answer to r: every resource of the set that is
// held (and, unless all, not expired as observed), and by whom as r's
// caller may see it (all of them when the set's keys hold r's own request
// for another owner or session).
func setLocked(r *setReq, obs []observation, expired []bool, all bool) *opError {
	oe := &opError{code: streams.CodeLocked, msg: "resources of the set are held by other leases"}
	for i, o := range obs {
		if !o.held() && !o.foreign || !all && expired[i] {
			continue
		}
		h := streams.Holder{Resource: r.resources[i]}
		if o.held() {
			h.Owner, h.Token, h.ExpiresAt = ownerFor(o.rec, r.who), o.rec.TokenAt(o.rev), o.rec.ExpiresAt
		}
		oe.holders = append(oe.holders, h)
	}
	if len(oe.holders) == 1 {
		oe.msg = fmt.Sprintf("resource %q of the set is held by another lease", oe.holders[0].Resource)
	}
	return oe
}

// grantSet writes the set's lease on every key over the revisions in obs
// and removes r's waiter records (revisions in queued), all in one atomic
// batch. A set of a session commits only with its session's record still
// at the revision read (observed in sess): a set is never granted after its
// session's end.
func (l *setOps) grantSet(ctx context.Context, r *setReq, obs []observation, queued []uint64, sess observation) (*streams.SetLeaseResponse, error) {
	rec := l.setRecord(r)
	var session check
	if r.session != "" {
		session = check{key: streams.SessionKey(r.session), rev: sess.rev}
	}
	ws := setGrantWrites(r, rec, obs, queued, session)
	revs, dup, err := l.sessions.commitGrant(ctx, "grant", r.session, ws)
	switch {
	case dup:
		return nil, errDuplicate
	case err != nil:
		if !isConflict(err) {
			for _, k := range r.keys {
				l.tracker.forget(k)
			}
		}
		return nil, err
	}
	out := make([]observation, len(r.keys))
	for i, k := range r.keys {
		out[i] = l.tracker.observe(k, entry{rev: revs[i], rec: rec})
	}
	for i, w := range ws[len(r.keys):] {
		if !w.check {
			l.tracker.observe(w.key, entry{rev: revs[len(r.keys)+i]})
		}
	}
	for i := range r.keys {
		l.report.granted(r.resources[i], revs[i], r.owner, r.who, "acquire")
	}
	return setResponse(r.resources, out, sess.rec), nil
}

// setHeldInSession answers a retry of set r of a session whose keys,
// observed in obs, all hold r's lease: once every key and the session are
// proven current (heldInSession), the set's lease; lease_lost when the
// session has ended. On errConflict the caller decides again on fresh
// reads.
func (l *setOps) setHeldInSession(ctx context.Context, r *setReq, obs []observation) (*streams.SetLeaseResponse, error) {
	sess, err := l.leases.heldInSession(ctx, r.grantReq(0), r.keys, obs)
	if err != nil {
		return nil, err
	}
	return setResponse(r.resources, obs, sess), nil
}

// setRecord is the lease record of set r, granted now.
func (l *setOps) setRecord(r *setReq) *streams.Record {
	now := l.cfg.Clock.Now()
	rec := newLease(now, r.requestID, r.owner, r.tenant, r.ttl, l.holdLimit(now, r.maxHold))
	rec.Set, rec.SetSize = r.set, len(r.keys)
	if r.session != "" {
		sessionLease(rec, now, r.session, l.holdLimit(now, r.maxHold))
	}
	return rec
}

// setGrantWrites are the writes of the grant of rec to set r, one atomic
// batch: rec at every key over the revision in obs, each with the message
// id of the request at that key (a second grant of the request is a
// duplicate); the delete of each of r's waiter records (revisions in
// queued, 0: none); and when session names a key, the check that the
// session's record is still at its revision (a lone instance's grant to a
// session, see leaseWrites).
func setGrantWrites(r *setReq, rec *streams.Record, obs []observation, queued []uint64, session check) []write {
	var ws []write
	for i, k := range r.keys {
		ws = append(ws, write{key: k, expect: obs[i].rev, e: entry{rec: rec}, msgID: grantMsgID(r.hashes[i])})
	}
	for i, rev := range queued {
		if rev != 0 {
			ws = append(ws, write{key: streams.WaitKey(r.resources[i], r.hashes[i]), expect: rev})
		}
	}
	if session.key != "" {
		ws = append(ws, write{key: session.key, expect: session.rev, check: true})
	}
	return ws
}

// straddles reports whether obs, one read per key of r, straddles the
// commit of r's grant: a key that does not hold r's lease was read at a
// revision below that of a key that does (a grant writes every key in one
// commit, at consecutive revisions). Keys read one at a time can see a
// commit apply between two reads; reading again tells.
func straddles(r *setReq, obs []observation) bool {
	var low uint64
	for _, o := range obs {
		if o.held() && r.mine(o.rec) && (low == 0 || o.rev < low) {
			low = o.rev
		}
	}
	for _, o := range obs {
		if !(o.held() && r.mine(o.rec)) && o.rev < low {
			return true
		}
	}
	return false
}

// earlierSet answers a set acquire whose grant JetStream refused as a
// duplicate (an earlier attempt of the request was granted, or it was
// cancelled), on fresh reads: the same lease while every key still holds
// it (proven as a retry is, proveSet), else lease_lost, never a second
// lease.
func (l *setOps) earlierSet(ctx context.Context, r *setReq) (*streams.SetLeaseResponse, error) {
	return commitLoop(ctx, l.engineDeps, "", true, engineSteps[[]observation, struct{}, *streams.SetLeaseResponse]{
		read: func(ctx context.Context, _ bool) ([]observation, bool, error) {
			obs, err := l.readAll(ctx, r.keys, true)
			return obs, false, err
		},
		decide: func(obs []observation, _ bool) verdict[*streams.SetLeaseResponse, struct{}] {
			return decideEarlierSet(r, obs)
		},
		prove: func(ctx context.Context, obs []observation) (*streams.SetLeaseResponse, outcome, error) {
			return settled(l.proveSet(ctx, r, obs))
		},
	})
}

// decideEarlierSet is the verdict on the earlier grant of set r, from
// fresh reads obs of its keys: prove it when every key holds one lease of
// r's request, read again when the reads straddle a commit, else
// lease_lost.
func decideEarlierSet(r *setReq, obs []observation) verdict[*streams.SetLeaseResponse, struct{}] {
	all := true
	for _, o := range obs {
		if !o.held() || !r.mine(o.rec) || o.rec.LeaseID != obs[0].rec.LeaseID {
			all = false
		}
	}
	switch {
	case all:
		return verdict[*streams.SetLeaseResponse, struct{}]{kind: proveRetry}
	case straddles(r, obs):
		return verdict[*streams.SetLeaseResponse, struct{}]{kind: readAgain}
	}
	return answer[*streams.SetLeaseResponse, struct{}](nil, newOpError(streams.CodeLeaseLost, "request_id %q was granted before or cancelled, and that lease is no longer current", r.requestID))
}

// renewRetried answers a retry of the acquire that holds the set lease
// observed in obs: the same lease, renewed, because the caller counts its
// deadline from this request (a set of a session is kept by its
// session's keepalives instead).
func (l *setOps) renewRetried(ctx context.Context, r *setReq, obs []observation) (*streams.SetLeaseResponse, error) {
	resp, err := l.extendSet(ctx, r.resources, r.keys, obs, r.ttl)
	if errors.Is(err, errHoldOver) {
		return nil, newOpError(streams.CodeLeaseLost, "request_id %q holds a set that has been held for its max hold", r.requestID)
	}
	return resp, err
}

// setResponse is the grant of the set lease observed in obs (one per
// resource, in order); sess, for a set of a session, gives its TTL and
// expiry.
func setResponse(resources []string, obs []observation, sess *streams.Record) *streams.SetLeaseResponse {
	rec := obs[0].rec
	resp := &streams.SetLeaseResponse{LeaseID: rec.LeaseID, TTLms: rec.TTLms, ExpiresAt: rec.ExpiresAt, HoldUntil: rec.HoldUntil,
		Resources: make([]streams.SetMember, len(obs))}
	if sess != nil {
		resp.TTLms, resp.ExpiresAt = sess.TTLms, sess.ExpiresAt
	}
	for i, o := range obs {
		resp.Resources[i] = streams.SetMember{Resource: resources[i], Token: o.rec.TokenAt(o.rev)}
	}
	return resp
}

// heldReq names a set lease to renew or release: its sorted resources,
// their keys, the set's hash and the lease id.
type heldReq struct {
	resources, keys []string
	set, leaseID    string
}

func newHeldReq(resources []string, leaseID string) *heldReq {
	return &heldReq{resources: resources, keys: setKeysOf(resources), set: setHash(resources), leaseID: leaseID}
}

// setHeld is what a decision on a named set lease rests on: the
// observations of its keys, and which of them hold the lease.
type setHeld struct {
	obs   []observation
	match []bool
}

// readHeld is the read step of a renewal or release of set r.
func (l *setOps) readHeld(r *heldReq) func(context.Context, bool) (setHeld, bool, error) {
	return func(ctx context.Context, fresh bool) (setHeld, bool, error) {
		obs, err := l.readAll(ctx, r.keys, fresh)
		if err != nil {
			return setHeld{}, false, err
		}
		match := make([]bool, len(obs))
		for i, o := range obs {
			match[i] = o.held() && o.rec.Set == r.set && sameLease(o.rec.LeaseID, r.leaseID)
		}
		return setHeld{obs: obs, match: match}, false, nil
	}
}

// heldPlan is what a renewal or release of a set writes: first, when
// refute is not -1, the conditional write that proves the fresh read of
// the key at refute (which does not hold the lease); then the request's
// own writes, over the keys that hold it.
type heldPlan struct{ refute int }

// decideHeld is the verdict shared by a set's renewal and release on s:
// refuse a request that names part of a set (or more), or write; a key
// seen not holding the lease is decided on fresh reads, and the
// negative is proven by the commit (refute).
func decideHeld[R any](r *heldReq, s setHeld, fresh bool) verdict[R, heldPlan] {
	if err := partOfSet(r.resources, s.obs, r.set, r.leaseID); err != nil {
		return answer[R, heldPlan](*new(R), err)
	}
	miss := slices.Index(s.match, false)
	switch {
	case miss < 0:
		return verdict[R, heldPlan]{kind: writePlan, plan: heldPlan{refute: -1}}
	case !fresh:
		return verdict[R, heldPlan]{kind: readAgain}
	}
	return verdict[R, heldPlan]{kind: writePlan, plan: heldPlan{refute: miss}}
}

// refuted writes plan p's proof (refute), if it has one: committed when
// there is none or it held, stale when the key moved on.
func (l *setOps) refuted(ctx context.Context, r *heldReq, s setHeld, p heldPlan) (outcome, error) {
	if p.refute < 0 {
		return committed, nil
	}
	return l.refute(ctx, r.keys[p.refute], s.obs[p.refute])
}

// partOfSet refuses a request that names the lease leaseID of a lock set
// with other resources than the set's (part of it, or more): a set is
// renewed and released whole, naming every resource.
func partOfSet(resources []string, obs []observation, set, leaseID string) error {
	for _, o := range obs {
		if o.held() && o.rec.Set != set && sameLease(o.rec.LeaseID, leaseID) {
			if o.rec.Set == "" {
				return newOpError(streams.CodeInvalidRequest, "the lease holds one resource, not a lock set: name it alone (\"resource\")")
			}
			return newOpError(streams.CodeInvalidRequest, "the lease holds a lock set of %d resources and this request names %d (part of it, or others): name exactly the set's resources", o.rec.SetSize, len(resources))
		}
	}
	return nil
}

// errSetMember answers a renewal or release of one resource of a lock set:
// a set is renewed and released whole.
func errSetMember() *opError {
	return newOpError(streams.CodeInvalidRequest, "the lease holds a lock set: renew or release it whole, naming every resource (\"resources\")")
}

// setKeysOf returns the lease keys of sorted resources.
func setKeysOf(resources []string) []string {
	keys := make([]string, len(resources))
	for i, r := range resources {
		keys[i] = streams.LeaseKey(r)
	}
	return keys
}

// renewSet extends the set lease leaseID of the sorted resources by ttl,
// every key in one atomic batch.
func (l *setOps) renewSet(ctx context.Context, resources []string, leaseID string, ttl time.Duration, who origin) (*streams.SetLeaseResponse, error) {
	r := newHeldReq(resources, leaseID)
	unlock, err := l.lockAll(ctx, r.keys)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return commitLoop(ctx, l.engineDeps, "", false, engineSteps[setHeld, heldPlan, *streams.SetLeaseResponse]{
		read: l.readHeld(r),
		decide: func(s setHeld, fresh bool) verdict[*streams.SetLeaseResponse, heldPlan] {
			v := decideHeld[*streams.SetLeaseResponse](r, s, fresh)
			if v.kind == writePlan && v.plan.refute < 0 && s.obs[0].rec.Session != "" {
				return answer[*streams.SetLeaseResponse, heldPlan](nil, newOpError(streams.CodeInvalidRequest, "the set belongs to a session and lives as long as it: keep the session alive (session.keepalive) instead of renewing the set"))
			}
			return v
		},
		commit: func(ctx context.Context, s setHeld, p heldPlan) (*streams.SetLeaseResponse, outcome, error) {
			if p.refute >= 0 {
				if out, err := l.refuted(ctx, r, s, p); out != committed || err != nil {
					return nil, out, err
				}
				l.report.renewRefused(resources[0], "not_current", who)
				return nil, committed, newOpError(streams.CodeLeaseLost, "the set's lease is no longer current")
			}
			resp, err := l.extendSet(ctx, resources, r.keys, s.obs, ttl)
			if errors.Is(err, errHoldOver) {
				l.report.renewRefused(resources[0], "max_hold", who)
				return nil, committed, newOpError(streams.CodeLeaseLost, "the set has been held for its max hold (until %s)", s.obs[0].rec.HoldUntil)
			}
			// extendSet counts its own lost race.
			return quiet(settled(resp, err))
		},
	})
}

// extendSet writes a renewal of the set lease observed in obs (at keys, of
// the sorted resources) with a new TTL, every key in one atomic batch by
// compare-and-set on the revisions observed. As extend, it never reaches
// past the lease's hold limit (errHoldOver). The caller holds every
// key's lock.
func (l *setOps) extendSet(ctx context.Context, resources, keys []string, obs []observation, ttl time.Duration) (*streams.SetLeaseResponse, error) {
	now := l.cfg.Clock.Now()
	until := holdUntil(obs[0].rec)
	if !until.IsZero() && until.Sub(now) < time.Millisecond {
		return nil, errHoldOver
	}
	recs := make([]*streams.Record, len(keys))
	msgs := make([]*batchMsg, len(keys))
	for i, o := range obs {
		rec := *o.rec
		rec.Token = o.rec.TokenAt(o.rev)
		setExpiry(&rec, now, ttl, until)
		recs[i] = &rec
		msgs[i] = l.store.putMsg(keys[i], rec.AppendJSON(nil), o.rev, "")
	}
	if _, err := l.store.batch(ctx, "put", msgs); err != nil {
		if errors.Is(err, errConflict) {
			l.report.conflict()
			return nil, err
		}
		for _, k := range keys {
			l.tracker.forget(k)
		}
		return nil, err
	}
	cur := make([]observation, len(keys))
	for i, k := range keys {
		cur[i] = l.tracker.observe(k, entry{rev: msgs[i].seq, rec: recs[i]})
	}
	return setResponse(resources, cur, nil), nil
}

// releaseSet ends the set lease leaseID of the sorted resources, every
// key in one atomic batch. A set whose lease some keys no longer hold (a
// revoke of one of them) is ended on the keys that do.
func (l *setOps) releaseSet(ctx context.Context, resources []string, leaseID string, who origin) (*streams.SetReleaseResponse, error) {
	r := newHeldReq(resources, leaseID)
	unlock, err := l.lockAll(ctx, r.keys)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return commitLoop(ctx, l.engineDeps, "", false, engineSteps[setHeld, heldPlan, *streams.SetReleaseResponse]{
		read: l.readHeld(r),
		decide: func(s setHeld, fresh bool) verdict[*streams.SetReleaseResponse, heldPlan] {
			return decideHeld[*streams.SetReleaseResponse](r, s, fresh)
		},
		commit: func(ctx context.Context, s setHeld, p heldPlan) (*streams.SetReleaseResponse, outcome, error) {
			if out, err := l.refuted(ctx, r, s, p); out != committed || err != nil {
				return nil, out, err
			}
			return l.endHeld(ctx, r, s, who)
		},
	})
}

// endHeld ends the keys of set r that hold its lease (observed in s): a
// release, or the end of a lease whose session has ended.
func (l *setOps) endHeld(ctx context.Context, r *heldReq, s setHeld, who origin) (*streams.SetReleaseResponse, outcome, error) {
	hash := setSession(s.obs, s.match)
	why, by, err := l.leases.releaseWhy(ctx, hash, who)
	if err != nil {
		return nil, committed, err
	}
	n, err := l.endSetKeys(ctx, r.keys, s.obs, s.match, why, by, "")
	if err != nil {
		return quiet(settled[*streams.SetReleaseResponse](nil, err))
	}
	released := n > 0 && why == endRelease
	if released {
		if released, err = l.leases.releaseCounts(ctx, r.keys[slices.Index(s.match, true)], hash); err != nil {
			return nil, committed, err
		}
	}
	return &streams.SetReleaseResponse{Resources: r.resources, Released: released}, committed, nil
}

// setSession returns the session that the set observed in obs (at its
// keys where match is set) is held in; "" for none.
func setSession(obs []observation, match []bool) string {
	for i, o := range obs {
		if match[i] && o.held() {
			return o.rec.Session
		}
	}
	return ""
}

// endSetKeys ends, in one atomic batch of delete markers, the keys whose
// match is set (observed in obs), and wakes each one's head waiter. It
// returns the number it ended. The caller holds every key's lock.
func (l *setOps) endSetKeys(ctx context.Context, keys []string, obs []observation, match []bool, why endReason, who origin, reason string) (int, error) {
	var idx []int
	var ends []*streams.EndMark
	var msgs []*batchMsg
	now := streams.FormatTime(l.cfg.Clock.Now())
	for i, o := range obs {
		if !match[i] {
			continue
		}
		end := &streams.EndMark{RequestID: o.rec.RequestID, Tenant: o.rec.Tenant, EndedAt: now, Why: string(why), Reason: reason}
		idx, ends = append(idx, i), append(ends, end)
		msgs = append(msgs, l.store.deleteMsg(keys[i], o.rev, end.AppendJSON(nil)))
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	if _, err := l.store.batch(ctx, "delete", msgs); err != nil {
		if !errors.Is(err, errConflict) {
			for _, i := range idx {
				l.tracker.forget(keys[i])
			}
		}
		return 0, err
	}
	for j, i := range idx {
		l.tracker.observe(keys[i], entry{rev: msgs[j].seq, end: ends[j]})
		res := decodedResource(resourceOf(keys[i]))
		l.report.ended(why, res, obs[i].rec.TokenAt(obs[i].rev), obs[i].rec.Owner, "ended", who)
		l.handover.wakeHead(resourceOf(keys[i]))
	}
	return len(msgs), nil
}

// expireSet ends the set lease observed in o at one of its keys, whose
// revision has stood for its TTL plus grace: every key that holds the same
// lease from the same write (a set's renewals write every key at once) in
// one atomic batch, so a set ends whole.
func (l *setOps) expireSet(ctx context.Context, it dueItem, o observation) {
	keys := l.tracker.setIx.setKeys(o.rec.LeaseID)
	if !slices.Contains(keys, it.key) {
		keys = append(keys, it.key)
	}
	slices.Sort(keys)
	unlock, err := l.lockAll(ctx, keys)
	if err != nil {
		l.tracker.retryAt(it, time.Now().Add(time.Second))
		return
	}
	defer unlock()
	cur, ok := l.tracker.get(it.key)
	if !ok || cur.rev != it.rev || !l.tracker.expired(cur, time.Now()) {
		return // renewed, released or forgotten meanwhile
	}
	obs, match, whole, err := l.expiredSet(ctx, keys, o)
	if err != nil {
		// What the other keys hold is not known (the reads failed, as in
		// an outage): ending the keys known here could end the set in
		// part. Look again shortly.
		l.tracker.retryAt(it, time.Now().Add(time.Second))
		return
	}
	if !whole && time.Now().Before(l.tracker.deadline(&cur).Add(setExpiryPatience)) {
		// Part of the set looks renewed, or is not known here: a view
		// that lags (a write whose outcome was unknown is forgotten until
		// read again). A set ends whole: look again shortly.
		l.tracker.retryAt(it, time.Now().Add(time.Second))
		return
	}
	why := endExpiry
	if o.rec.Session != "" && l.tracker.sessionIx.sessionLeaseEnded(o.rec) {
		why = endSessionExpiry
	}
	if _, err := l.endSetKeys(ctx, keys, obs, match, why, origin{}, ""); err != nil {
		// Someone wrote one of the keys meanwhile: learn it, and let
		// each key expire on its own item.
		if e, rerr := l.store.read(ctx, it.key); rerr == nil && e.rev != it.rev {
			l.tracker.observe(it.key, e)
			return
		}
		l.tracker.retryAt(it, time.Now().Add(time.Second))
	}
}

// expireSetKey handles the due item of a key of the set lease observed in
// o: the set ends whole, under the locks of all its keys (expireSet), once
// it has expired; a set of a session whose record is gone (an orphan the
// tracker made due, sessionIndex.orphansDue) ends as its session's end would
// have ended it (endSessionSet).
func (l *setOps) expireSetKey(ctx context.Context, it dueItem, o observation) {
	if l.tracker.expired(o, time.Now()) {
		l.expireSet(ctx, it, o)
		return
	}
	if o.rec.Session == "" {
		l.tracker.retryAt(it, l.tracker.deadline(&o)) // came due early
		return
	}
	gone, err := l.sessions.sessionGone(ctx, o.rec.Session)
	switch {
	case err != nil:
		l.tracker.retryAt(it, time.Now().Add(time.Second))
	case !gone:
		l.tracker.retryAt(it, l.tracker.deadline(&o))
	default:
		// A set ends whole: the keys known here are ended without the
		// rest only once the set has had setExpiryPatience, from when its
		// session's end was seen, to show whole.
		end, ok := l.tracker.get(streams.SessionKey(o.rec.Session))
		partial := !ok || time.Since(end.seen) >= setExpiryPatience // !ok: its end is past the retry window
		if !l.sessions.endSessionSet(ctx, o.rec.LeaseID, []string{it.key}, o.rec.Session, endSessionExpiry, partial) {
			l.tracker.retryAt(it, time.Now().Add(time.Second))
		}
	}
}

// setExpiryPatience is how long past a set's expiry an instance waits to
// see every key of it expired before it ends the keys it knows (a key
// ended apart, by a revoke, never comes back).
const setExpiryPatience = 10 * time.Second

// expiredSet returns what is known of the keys of the set lease observed
// in o, and which of them hold it expired; whole is set when every key of
// the set (its size) is among them. When some key seems to hold a later
// renewal, or fewer keys than the set's size are known, it decides on
// fresh reads of every key (err: they failed).
func (l *setOps) expiredSet(ctx context.Context, keys []string, o observation) ([]observation, []bool, bool, error) {
	obs := make([]observation, len(keys))
	match := make([]bool, len(keys))
	decide := func() (n int, later bool) {
		now := time.Now()
		for i, ob := range obs {
			holds := ob.held() && ob.rec.LeaseID == o.rec.LeaseID
			match[i] = holds && ob.rec.RenewedAt == o.rec.RenewedAt && l.tracker.expired(ob, now)
			later = later || holds && !match[i]
			if match[i] {
				n++
			}
		}
		return n, later
	}
	for i, k := range keys {
		obs[i], _ = l.tracker.get(k)
	}
	n, later := decide()
	if n == o.rec.SetSize && !later {
		return obs, match, true, nil
	}
	fresh, err := l.readAll(ctx, keys, true)
	if err != nil {
		return obs, match, false, err
	}
	copy(obs, fresh)
	n, later = decide()
	return obs, match, n == o.rec.SetSize && !later, nil
}

// cancelSet makes sure the set request holds nothing and waits for
// nothing: a tombstone per key (so no later grant of the request can
// commit), the end of its lease, and the removal of its places.
func (l *setOps) cancelSet(ctx context.Context, resources []string, requestID, owner string, who origin) (*streams.SetCancelResponse, error) {
	r := newSetReq(resources, requestID, owner, who)
	for i, res := range resources {
		if other, err := l.handover.otherWaiter(ctx, streams.WaitKey(res, r.hashes[i]), owner); other || err != nil {
			return &streams.SetCancelResponse{Resources: resources}, err
		}
	}
	unlock, err := l.lockAll(ctx, r.keys)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Every key gets its tombstone, or its mark where the tombstone is a
	// duplicate, the first resource's first: a set's places check that one
	// (commitPlaces), so each later key's waiter record, as its tombstone
	// proved it, can only be deleted after. Another owner's record found
	// at a key (placed since the look above) stops the cancel there.
	ts := make([]tombstoned, len(r.keys))
	obs := make([]observation, len(r.keys))
	for i, k := range r.keys {
		if ts[i], err = l.handover.tombstone(ctx, k, streams.WaitKey(resources[i], r.hashes[i]), r.hashes[i], owner); err != nil || ts[i].other {
			return &streams.SetCancelResponse{Resources: resources}, err
		}
		obs[i] = ts[i].lease
	}
	match := make([]bool, len(obs))
	for i, o := range obs {
		match[i] = o.held() && r.mine(o.rec) && o.rec.Owner == owner
	}
	released := 0
	if slices.Contains(match, true) {
		if released, err = l.endSetKeys(ctx, r.keys, obs, match, endCancel, who, ""); err != nil {
			return nil, err
		}
	}
	dequeued := false
	for i, res := range resources {
		d, err := l.handover.dequeue(ctx, res, streams.WaitKey(res, r.hashes[i]), owner, ts[i].waiter)
		if err != nil {
			return nil, err
		}
		dequeued = dequeued || d
	}
	return &streams.SetCancelResponse{Resources: resources, Cancelled: released > 0 || dequeued}, nil
}
