package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// maxAttempts bounds the re-read-and-decide loop of one request; each lost
// compare-and-set means another writer made progress.
const maxAttempts = 8

// sessionAttempts bounds that loop instead for the writes that check or
// rewrite a session's record (grants to it, its keepalives, its end).
// JetStream refuses such a write while another that checks the same
// record is being proposed, and the grants of one session served by two
// instances can keep each other out for a while: each loses to the
// other's commit, pauses for about a commit (conflictPause) and tries
// again, within the request's deadline.
const sessionAttempts = 64

// attempts is the bound of the decision loop of a request made in
// session (empty: none).
func attempts(session string) int {
	if session != "" {
		return sessionAttempts
	}
	return maxAttempts
}

// locks makes every lock decision — grant, renew, release, cancel,
// revoke, expire, hand over — and commits each by compare-and-set on the
// bucket. It knows nothing of how requests arrive or how replies leave;
// the request path (request.go) calls its roles with validated requests.
// Each role is a type of its own, and reaches the others through fields
// set in newLocks:
//
//   - leases (leaseOps, locks.go): acquire, renew, release, revoke and
//     status of one lease;
//   - sessions (sessionOps, sessions.go): open, keepalive and end of a
//     session, and whether a grant in one counts;
//   - sets (setOps, sets.go, sets_wait.go): lock sets, and their waits;
//   - sems (semOps, semaphores.go, sem_bulk.go): the permits of a
//     semaphore, and their bulk grants;
//   - handover (handoverOps, handover.go, waiter.go): the end of a lease,
//     its hand-over to the head waiter, expiry, and single waits;
//   - names (nameOps, engine.go, caps.go): what a name
//     is (the name rule) and the waiter caps.
//
// What they share is engineDeps: the dependencies, and the reads, key
// locks and rewrites of one key that every role makes (locks.go).
//
// A "locked" answer may rest on the tracker's view of a lone instance (see
// follow.go; an instance that follows others refuses only on a read); the
// other negative answers (lease_lost, released:false, cancelled:false,
// revoked:false) rest on a fresh read proven by a conditional write.
type locks struct {
	*engineDeps
	leases   *leaseOps
	sessions *sessionOps
	sets     *setOps
	sems     *semOps
	handover *handoverOps
	names    *nameOps
}

// engineDeps is what every role of locks holds: the instance's
// configuration, its bucket, its view and its key locks.
type engineDeps struct {
	cfg     Config
	log     *slog.Logger
	store   *store
	tracker *tracker
	keys    *keyLocks
	report  *reporter
	wakes   *wakes
	guard   *streamGuard
	// following reports whether the instance follows every write (another
	// instance serves too); synced whether its watcher has delivered
	// every existing record once.
	following func() bool
	synced    *atomic.Bool
	// delivered is the revision the watcher last delivered (see
	// follower.delivered).
	delivered func() uint64
	// seen is what the watcher has delivered (see deliveries); nil when
	// the instance runs none.
	seen *deliveries
}

// newLocks builds the roles of locks on d and links them.
func newLocks(d *engineDeps) *locks {
	l := &locks{engineDeps: d, leases: &leaseOps{engineDeps: d}, sessions: &sessionOps{engineDeps: d},
		sets: &setOps{engineDeps: d}, sems: &semOps{engineDeps: d}, handover: &handoverOps{engineDeps: d},
		names: &nameOps{engineDeps: d}}
	l.leases.sessions, l.leases.sems, l.leases.handover, l.leases.names = l.sessions, l.sems, l.handover, l.names
	l.sessions.sets, l.sessions.handover = l.sets, l.handover
	l.sessions.commits = newSessionCommits(d.cfg.MaxPerKey, d.store, l.sessions.sessionGate, d.report)
	l.sets.leases, l.sets.sessions, l.sets.handover, l.sets.names = l.leases, l.sessions, l.handover, l.names
	l.sems.leases, l.sems.sessions, l.sems.handover, l.sems.names = l.leases, l.sessions, l.handover, l.names
	l.handover.leases, l.handover.sessions, l.handover.sets, l.handover.sems, l.handover.names = l.leases, l.sessions, l.sets, l.sems, l.names
	return l
}

// grantReq is one validated acquire.
type grantReq struct {
	resource, requestID, owner string
	key, hash                  string
	ttl                        time.Duration
	maxHold                    time.Duration // zero: the deployment's cap
	who                        origin
	tenant                     string // who.tenant()
	// session and secret name the session the lease (or wait) is made
	// in: its key hash and the secret of its id; empty for a lease of its
	// own (see sessions.go).
	session, secret string
	// sem and limit name the semaphore a permit is asked of (resource and
	// key are then its queue's; see semaphores.go); value is the lease's
	// value (elections).
	sem   string
	limit int
	value string
	// nameRev is, for a permit, the revision of its semaphore's name key
	// that the grant's commit must find (claimName), set on each attempt.
	nameRev uint64
}

// mine reports whether rec, a lease or waiter record, is this request's:
// the same request id from the same tenant. Knowing another tenant's
// request id gives no power over its leases.
func (g *grantReq) mine(rec *streams.Record) bool {
	return rec.RequestID == g.requestID && rec.Tenant == g.tenant
}

// lock locks key within ctx.
func (l *engineDeps) lock(ctx context.Context, key string) (*keyLock, error) {
	return l.keys.lock(ctx, key)
}

// readKey is the read step of a commit loop whose snapshot is key's
// observation alone (current).
func (l *engineDeps) readKey(key string) func(ctx context.Context, fresh bool) (observation, bool, error) {
	return func(ctx context.Context, fresh bool) (observation, bool, error) {
		o, err := l.current(ctx, key, fresh)
		return o, false, err
	}
}

// current returns what is known of key. With fresh it reads from the
// stream leader; otherwise it may answer from the tracker, whose view can
// be stale. Callers commit only by compare-and-set on the revision they
// got.
func (l *engineDeps) current(ctx context.Context, key string, fresh bool) (observation, error) {
	if !fresh {
		if o, ok := l.tracker.get(key); ok {
			return o, nil
		}
		if l.synced.Load() {
			// Never written as far as the watcher knows: try the
			// compare-and-set on revision 0 without a read.
			return observation{}, nil
		}
	}
	e, err := l.store.read(ctx, key)
	if err != nil {
		return observation{}, err
	}
	if e.rev == 0 {
		// Nothing stored: a delete marker the tracker may still know of
		// has expired from the bucket (it lives for the retry window).
		return l.tracker.vanished(key), nil
	}
	return l.tracker.observe(key, e), nil
}

// lockedError is the "locked" answer to who about the lease observed in o;
// the holder's owner is shown only to its own tenant and to operators.
func lockedError(o observation, who origin) *opError {
	if o.foreign {
		return newOpError(streams.CodeLocked, "resource holds a value jetlock did not write (revision %d); it is taken over once it has stood for the longest TTL", o.rev)
	}
	return &opError{code: streams.CodeLocked, msg: "resource is held by another lease", holder: &streams.Holder{
		Owner: ownerFor(o.rec, who), Token: o.rec.TokenAt(o.rev), ExpiresAt: o.rec.ExpiresAt,
	}}
}

// leaseEnded is the answer to a retry of an acquire whose lease has ended.
func leaseEnded(requestID string) *opError {
	return newOpError(streams.CodeLeaseLost, "request_id %q was granted before, and that lease has ended", requestID)
}

func tooManyConflicts() error {
	return fmt.Errorf("%w: every attempt lost to concurrent writers", errConflict)
}

// holdLimit returns the hold limit of a lease granted at now for maxHold
// (zero: the deployment's cap), or the zero time when neither applies.
func (l *engineDeps) holdLimit(now time.Time, maxHold time.Duration) time.Time {
	if maxHold == 0 {
		maxHold = l.cfg.MaxHold
	}
	if maxHold == 0 {
		return time.Time{}
	}
	return now.Add(maxHold)
}

// extend writes a renewal of the lease observed in o with a new TTL, by
// compare-and-set on o's revision. The token stays the grant revision; the
// TTL never reaches past the lease's hold limit, and a lease at its limit
// is not renewed (errHoldOver).
func (l *engineDeps) extend(ctx context.Context, resource, key string, o observation, ttl time.Duration) (*streams.LeaseResponse, error) {
	now := l.cfg.Clock.Now()
	until := holdUntil(o.rec)
	if !until.IsZero() && until.Sub(now) < time.Millisecond {
		return nil, errHoldOver
	}
	rec := *o.rec
	rec.Token = o.rec.TokenAt(o.rev)
	setExpiry(&rec, now, ttl, until)
	seq, _, err := l.store.put(ctx, key, &rec, o.rev, "")
	if err != nil {
		if !errors.Is(err, errConflict) {
			l.tracker.forget(key)
		}
		return nil, err
	}
	l.tracker.observe(key, entry{rev: seq, rec: &rec})
	return leaseResponse(resource, rec.Token, &rec), nil
}

// confirmNegative proves, before a negative answer (or a retry's answer
// from an earlier grant, see heldInSession), that the read o is current:
// a stream leader cut off by a partition that has just healed can still
// answer reads from old state. On errConflict the caller reads again.
func (l *engineDeps) confirmNegative(ctx context.Context, key string, o observation) error {
	err := l.store.confirm(ctx, key, o.rev)
	if errors.Is(err, errConflict) {
		l.tracker.forget(key)
	}
	return err
}

// refute is the commit of a refusal that rests on a fresh read o of key:
// the conditional write that proves key still as read (committed), or
// finds it moved on (stale, not counted as a lost race: decide again).
func (l *engineDeps) refute(ctx context.Context, key string, o observation) (outcome, error) {
	_, out, err := quiet(settled(struct{}{}, l.confirmNegative(ctx, key, o)))
	return out, err
}

// conflictPause waits a moment before a request whose write lost a race
// is decided again: about the time a commit takes now (half to twice the
// recent mean, at least half a millisecond), so that the retries of
// contending instances spread out. (A write that met another still being
// proposed is not a lost race: the store sends it again until that one
// is decided.)
func (l *engineDeps) conflictPause(ctx context.Context) {
	base := max(l.store.commitMean(), time.Millisecond)
	t := time.NewTimer(base/2 + time.Duration(rand.Int64N(int64(3*base/2))))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// leaseOps decides the requests on one lease: acquire (and the retry of
// one), renew, release, revoke, status and list.
type leaseOps struct {
	*engineDeps
	// the roles it reaches (see locks)
	sessions *sessionOps
	sems     *semOps
	handover *handoverOps
	names    *nameOps
}

// proclaim writes the lease observed in o (its value already replaced)
// by compare-and-set on its revision, its times unchanged.
func (l *leaseOps) proclaim(ctx context.Context, resource, key string, o observation) (*streams.LeaseResponse, error) {
	rec := *o.rec
	rec.Token = o.rec.TokenAt(o.rev)
	seq, _, err := l.store.put(ctx, key, &rec, o.rev, "")
	if err != nil {
		if !errors.Is(err, errConflict) {
			l.tracker.forget(key)
		}
		return nil, err
	}
	l.tracker.observe(key, entry{rev: seq, rec: &rec})
	resp := leaseResponse(resource, rec.Token, &rec)
	if so, ok := l.tracker.get(streams.SessionKey(rec.Session)); ok && so.held() {
		resp = sessionLeaseResponse(resource, rec.Token, &rec, so.rec)
	}
	return resp, nil
}

// confirmAll proves the reads obs of keys current, as confirmNegative
// does for one: in one atomic batch of checks (more keys than a batch
// holds, in several). On errConflict the caller reads again.
func (l *leaseOps) confirmAll(ctx context.Context, keys []string, obs []observation) error {
	if len(keys) == 1 {
		return l.confirmNegative(ctx, keys[0], obs[0])
	}
	revs := make([]uint64, len(obs))
	for i, o := range obs {
		revs[i] = o.rev
	}
	_, err := l.store.prove(ctx, keys, revs, nil)
	if errors.Is(err, errConflict) {
		for _, k := range keys {
			l.tracker.forget(k)
		}
	}
	return err
}

// acquire decides an acquire that does not wait (a permit's: semOps).
func (l *leaseOps) acquire(ctx context.Context, g *grantReq) (*streams.LeaseResponse, error) {
	if g.limit != 0 {
		return l.sems.acquire(ctx, g)
	}
	st, err := l.lock(ctx, g.key)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	return l.tryGrant(ctx, g, false)
}

// tryGrant makes one decision on an acquire: grant, return the request's
// existing lease, or refuse. With fresh, it decides on a read from the
// stream leader rather than on what the watcher last saw. The caller holds
// the key's lock.
func (l *leaseOps) tryGrant(ctx context.Context, g *grantReq, fresh bool) (*streams.LeaseResponse, error) {
	if g.limit != 0 {
		return l.sems.trySem(ctx, g, fresh)
	}
	return commitLoop(ctx, l.engineDeps, g.session, fresh, engineSteps[grantSnap, struct{}, *streams.LeaseResponse]{
		read: func(ctx context.Context, fresh bool) (grantSnap, bool, error) {
			return l.readToGrant(ctx, g, fresh)
		},
		decide: func(s grantSnap, fresh bool) verdict[*streams.LeaseResponse, struct{}] {
			return decideGrant(g, s, fresh)
		},
		prove: func(ctx context.Context, s grantSnap) (*streams.LeaseResponse, outcome, error) {
			return settled(l.sameRequest(ctx, g, s.o))
		},
		commit: func(ctx context.Context, s grantSnap, _ struct{}) (*streams.LeaseResponse, outcome, error) {
			return settled(l.grant(ctx, g, s.o, s.sess))
		},
	})
}

// grantSnap is what a decision on a lock's grant rests on: the key's
// observation o, the session's sess (if any), whether o is a lease of a
// session that a fresh read does not find (orphan, see sessionGone), and
// what the instance's view adds as of the read.
type grantSnap struct {
	o, sess observation
	orphan  bool
	expired bool // o has expired as this instance observes it
	ended   bool // the retry memory has g's lease ended (retryMemory)
	claim   claim
	facts   viewFacts
}

// viewFacts is what an instance's view adds to a decision's snapshot, as
// of its read step: a decider reads nothing else.
type viewFacts struct {
	now    time.Time     // the clock's, for end marks
	window time.Duration // the retry window
	// following: the instance follows the bucket, so its view can lag
	// other instances' writes (follow.go).
	following bool
	guard     error // the fleet's guard forbids grants (nil: it allows them)
	room      error // the request's session is at its cap (nil: room, or none)
}

// claim says whether a request may claim a free resource before the
// waiters queued for it (tracker.claim), and how many are ahead.
type claim struct {
	ok    bool
	ahead int
}

// viewFacts returns the view's facts, now (room: none).
func (l *engineDeps) viewFacts() viewFacts {
	return viewFacts{now: l.cfg.Clock.Now(), window: l.tracker.window, following: l.following(), guard: l.guardRefusal()}
}

// factsFor returns the view's facts for a decision on g, now.
func (l *leaseOps) factsFor(g *grantReq) viewFacts {
	f := l.viewFacts()
	if g.session != "" {
		f.room = l.sessions.sessionRoom(g.session)
	}
	return f
}

// readToGrant reads what a decision on g's grant rests on: whether the
// retry memory has g's lease ended (then nothing else), g's session (if
// any), the key under the name rule (claimName), whether the lease
// found there is of a session that a fresh read does not find, and the
// view's facts. again asks to decide on fresh reads.
func (l *leaseOps) readToGrant(ctx context.Context, g *grantReq, fresh bool) (s grantSnap, again bool, err error) {
	if s.ended = l.tracker.retry.hasEnded(g.key, g.requestID, g.tenant); s.ended {
		return s, false, nil // decided on that alone
	}
	if g.session != "" {
		if s.sess, err = l.sessions.session(ctx, g, fresh); err != nil {
			return s, false, err
		}
	}
	if s.o, err = l.current(ctx, g.key, fresh); err != nil {
		return s, false, err
	}
	if s.o, again, err = l.names.claimName(ctx, g.resource, s.o, 0, fresh); again || err != nil {
		return s, again, err
	}
	s.expired = l.tracker.expired(s.o, time.Now())
	if o := s.o; fresh && o.held() && o.rec.Session != "" && !s.expired {
		// Decide on the holder's session as the stream leader has it.
		if s.orphan, err = l.sessions.sessionGone(ctx, o.rec.Session); err != nil {
			return s, false, err
		}
	}
	s.claim = l.tracker.claim(resourceOf(g.key), g.hash, s.o, l.cfg.Reservation)
	s.facts = l.factsFor(g)
	return s, false, nil
}

// decideGrant is the verdict on g's grant from the snapshot s: lease_lost
// to a retry of g whose lease ended, prove a retry of g (the lease is its
// own), refuse, decide on fresh reads, or write the lease. It is a
// function of its arguments alone.
func decideGrant(g *grantReq, s grantSnap, fresh bool) verdict[*streams.LeaseResponse, struct{}] {
	type v = verdict[*streams.LeaseResponse, struct{}]
	if s.ended {
		return answer[*streams.LeaseResponse, struct{}](nil, leaseEnded(g.requestID))
	}
	if s.o.held() && g.mine(s.o.rec) {
		return v{kind: proveRetry}
	}
	refusal, again := mustRefuse(g, s, fresh)
	switch {
	case again:
		return v{kind: readAgain}
	case refusal == nil && s.facts.guard != nil:
		refusal = s.facts.guard
	case refusal == nil && s.facts.room != nil:
		refusal = s.facts.room
	}
	if refusal != nil {
		return answer[*streams.LeaseResponse, struct{}](nil, refusal)
	}
	return v{kind: writePlan}
}

// mustRefuse decides whether the key observed in s.o is someone else's: it
// returns the refusal (locked, reserved for waiters, lease_lost) when it
// is, and again when that must be decided on a read first.
func mustRefuse(g *grantReq, s grantSnap, fresh bool) (refusal error, again bool) {
	o := s.o
	switch {
	case (o.held() || o.foreign) && !s.orphan && !s.expired:
		if !fresh && (o.foreign || s.facts.following) {
			// Another instance may have ended the lease since the watcher
			// last delivered (it lags by milliseconds under load, by
			// seconds after a leader change): refuse only on a read. A
			// lone instance refuses on its own view: it made every write
			// but those behind its back.
			return nil, true
		}
		return lockedError(o, g.who), false
	case !o.held() && !o.foreign && o.end.Ended(g.requestID, g.tenant, s.facts.now, s.facts.window):
		return leaseEnded(g.requestID), false
	case !s.claim.ok:
		// Free, or expired by observation, but waiters have the first
		// claim.
		return newOpError(streams.CodeLocked, "resource is free but reserved for the %d waiters ahead", s.claim.ahead), false
	}
	// Free, or expired by observation: take it over by compare-and-set on
	// the revision seen.
	return nil, false
}

// sameRequest answers a retry of the acquire that holds the lease o: the
// same lease, renewed, because the caller counts its deadline from this
// request; or locked when the retry names another owner or another
// session (another caller reusing the request id). A lease of a session
// is not renewed: its session is what is kept alive. It is answered only
// once it is proven held now (heldInSession): its grant committed with its
// session live, and a session live now has been live since.
func (l *leaseOps) sameRequest(ctx context.Context, g *grantReq, o observation) (*streams.LeaseResponse, error) {
	if o.rec.Owner != g.owner || o.rec.Session != g.session {
		return nil, lockedError(o, g.who)
	}
	if g.session != "" {
		sess, err := l.heldInSession(ctx, g, []string{g.key}, []observation{o})
		if err != nil {
			return nil, err
		}
		return sessionLeaseResponse(g.resource, o.rec.TokenAt(o.rev), o.rec, sess), nil
	}
	resp, err := l.extend(ctx, g.resource, g.key, o, g.ttl)
	if errors.Is(err, errHoldOver) {
		return nil, newOpError(streams.CodeLeaseLost, "request_id %q holds a lease that has been held for its max hold", g.requestID)
	}
	return resp, err
}

// heldInSession proves, before a retry is answered from an earlier grant
// of a session, that the lease o is still current and its session still
// live, and returns the session's record. The read that found the lease
// may come from a node that no longer leads the stream (right after a
// partition heals it answers from old state), and the session may have
// ended since the grant (its leases then count as ended before they are
// deleted): a retry sent after the session's close must never be told it
// holds the lease. The lease is proven first, then the session: a session
// live after the lease's proof was live at it too, so the answer holds
// at that proof. On errConflict the caller decides again on fresh reads.
//
// A lock set's retry is proven the same way, over every key of the set
// (keys, observed in obs); g is then the set's request as its first key's.
func (l *leaseOps) heldInSession(ctx context.Context, g *grantReq, keys []string, obs []observation) (*streams.Record, error) {
	if err := l.confirmAll(ctx, keys, obs); err != nil {
		return nil, err
	}
	sess, err := l.sessions.session(ctx, g, true)
	if err != nil {
		return nil, err
	}
	if err := l.sessions.confirmSession(ctx, g.session, sess); err != nil {
		return nil, err
	}
	return sess.rec, nil
}

// grant writes a new lease for g over the revision observed in o. A lease
// of a session commits with the check that the session observed in sess
// has not moved on (see leaseWrites), on any number of instances.
func (l *leaseOps) grant(ctx context.Context, g *grantReq, o observation, sess observation) (*streams.LeaseResponse, error) {
	now := l.cfg.Clock.Now()
	rec := newLease(now, g.requestID, g.owner, g.tenant, g.ttl, l.holdLimit(now, g.maxHold))
	rec.Limit, rec.Value = g.limit, g.value
	if g.session != "" {
		sessionLease(rec, now, g.session, l.holdLimit(now, g.maxHold))
	}
	seq, nameSeq, dup, err := l.writeGrant(ctx, g, rec, o.rev, sess)
	if err != nil {
		if !errors.Is(err, errConflict) {
			l.tracker.forget(g.key)
		}
		return nil, err
	}
	if dup {
		return l.earlierGrant(ctx, g, seq)
	}
	l.tracker.observe(g.key, entry{rev: seq, rec: rec})
	if nameSeq != 0 {
		l.tracker.observe(streams.LeaseKey(g.sem), entry{rev: nameSeq, sem: g.limit})
	}
	if g.session == "" {
		l.report.granted(g.resource, seq, g.owner, g.who, "acquire")
		return leaseResponse(g.resource, seq, rec), nil
	}
	l.report.granted(g.resource, seq, g.owner, g.who, "acquire")
	return sessionLeaseResponse(g.resource, seq, rec, sess.rec), nil
}

// writeGrant writes the lease rec for g over revision expect
// (grantWrites): in a session, with the check of the session observed in
// sess, together with the session's other grants (commitGrant). It
// returns the grant's revision and, for a permit, its name record's
// (nameSeq), or dup when an earlier write of the request (or its cancel)
// was found.
func (l *leaseOps) writeGrant(ctx context.Context, g *grantReq, rec *streams.Record, expect uint64, sess observation) (seq, nameSeq uint64, dup bool, err error) {
	var revs []uint64
	if g.session == "" {
		revs, dup, err = l.store.commitWrites(ctx, "grant", grantWrites(g, rec, expect, check{}))
	} else {
		session := check{key: streams.SessionKey(g.session), rev: sess.rev}
		revs, dup, err = l.sessions.commitGrant(ctx, "grant", g.session, grantWrites(g, rec, expect, session))
	}
	switch {
	case err != nil && isConflict(err) && g.session != "":
		l.conflictPause(ctx) // perhaps another instance's write to the session
	case err != nil || dup:
	case g.limit != 0:
		seq, nameSeq = revs[0], revs[len(revs)-1] // the name record is last
	default:
		seq = revs[0]
	}
	return seq, nameSeq, dup, err
}

// grantWrites are the writes of the grant of rec to g over revision
// expect: the lease with the request's message id, and the session's
// check if session names a key (leaseWrites); for a permit, also its
// semaphore's name record, by compare-and-set on the revision the name
// rule read (engine.go), last.
func grantWrites(g *grantReq, rec *streams.Record, expect uint64, session check) []write {
	ws := leaseWrites(g.key, rec, expect, grantMsgID(g.hash), session)
	if g.limit != 0 {
		ws = append(ws, write{key: streams.LeaseKey(g.sem), expect: g.nameRev, e: entry{sem: g.limit}})
	}
	return ws
}

// leaseWrites are the writes of the grant of rec at key over revision
// expect, with message id msgID (a second grant of the request is a
// duplicate), and, when session names a key, the check that the session
// record is still at its revision. Written as one atomic batch, the grant
// commits only if the session has not moved on since it was read: had it
// ended (its record deleted by a close or an expiry), the batch fails
// whole. So a grant never follows its session's end in the stream, which
// is what lets whoever ends a session find every lease it holds (see
// endSession).
func leaseWrites(key string, rec *streams.Record, expect uint64, msgID string, session check) []write {
	ws := []write{{key: key, expect: expect, e: entry{rec: rec}, msgID: msgID}}
	if session.key != "" {
		ws = append(ws, write{key: session.key, expect: session.rev, check: true})
	}
	return ws
}

// earlierGrant answers an acquire whose granting write JetStream reported
// as a duplicate of an earlier write at seq (an earlier attempt of the same
// request_id, or its cancel tombstone; 0 when an atomic batch does not
// say): the same lease if it is still current, otherwise lease_lost, never
// a second lease. It runs on the commit loop, every read fresh, as a
// request in no session whatever g's (at most maxAttempts times): a
// retry's proof that finds the lease moved on reads again.
func (l *leaseOps) earlierGrant(ctx context.Context, g *grantReq, seq uint64) (*streams.LeaseResponse, error) {
	return commitLoop(ctx, l.engineDeps, "", true, engineSteps[earlierSnap, struct{}, *streams.LeaseResponse]{
		read: func(ctx context.Context, _ bool) (s earlierSnap, _ bool, err error) {
			s.held, s.o, err = l.grantAt(ctx, g, seq)
			return s, false, err
		},
		decide: func(s earlierSnap, _ bool) verdict[*streams.LeaseResponse, struct{}] {
			if s.held == nil {
				return answer[*streams.LeaseResponse, struct{}](nil, newOpError(streams.CodeLeaseLost, "request_id %q was granted before or cancelled, and that lease is no longer current", g.requestID))
			}
			return verdict[*streams.LeaseResponse, struct{}]{kind: proveRetry}
		},
		prove: func(ctx context.Context, s earlierSnap) (*streams.LeaseResponse, outcome, error) {
			return settled(l.sameRequest(ctx, s.held, s.o))
		},
	})
}

// earlierSnap is what earlierGrant's answer rests on: the request
// narrowed to the key of its earlier lease (nil: none is current) and
// what was read there (grantAt).
type earlierSnap struct {
	held *grantReq
	o    observation
}

// grantAt finds, on fresh reads, the current lease of g's request that was
// granted at seq (0: at whatever revision): at g's key or, for a permit of
// a semaphore, at the permit that the earlier write took, which need not
// be the one this attempt picked (an instance whose view lagged picks
// another free permit). It returns the request narrowed to that lease's
// key and what was read there, or nil when there is none.
func (l *leaseOps) grantAt(ctx context.Context, g *grantReq, seq uint64) (*grantReq, observation, error) {
	candidates := []*grantReq{g}
	if g.sem != "" {
		var err error
		if candidates, err = l.sems.permitsOf(ctx, g, seq); err != nil {
			return nil, observation{}, err
		}
	}
	for _, c := range candidates {
		o, err := l.current(ctx, c.key, true)
		if err != nil {
			return nil, observation{}, err
		}
		if o.held() && g.mine(o.rec) && (seq == 0 || o.rec.TokenAt(o.rev) == seq) {
			return c, o, nil
		}
	}
	return nil, observation{}, nil
}

// renew extends the lease leaseID of resource by ttl, and sets its value
// to value unless that is empty: on the commit loop, with no session
// (so at most maxAttempts times).
func (l *leaseOps) renew(ctx context.Context, resource, leaseID string, ttl time.Duration, value string, who origin) (*streams.LeaseResponse, error) {
	r := &renewReq{resource: resource, key: streams.LeaseKey(resource), leaseID: leaseID, ttl: ttl, value: value, who: who}
	st, err := l.lock(ctx, r.key)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	return commitLoop(ctx, l.engineDeps, "", false, engineSteps[observation, renewPlan, *streams.LeaseResponse]{
		read: l.readKey(r.key),
		decide: func(o observation, fresh bool) verdict[*streams.LeaseResponse, renewPlan] {
			return decideRenew(r, o, fresh)
		},
		commit: func(ctx context.Context, _ observation, p renewPlan) (*streams.LeaseResponse, outcome, error) {
			return l.commitRenew(ctx, r, p)
		},
	})
}

// renewReq is one validated renew.
type renewReq struct {
	resource, key, leaseID string
	ttl                    time.Duration
	value                  string
	who                    origin
}

// renewAct is what a renew writes.
type renewAct uint8

const (
	renewExtend   renewAct = iota // a new expiry (and value, if given)
	renewProclaim                 // a session's lease's new value only
	renewRefute                   // prove the lease gone, then refuse
)

// renewPlan is a renew's plan: what to write, over the lease observed
// in o (carrying the new value, if given).
type renewPlan struct {
	act renewAct
	o   observation
}

// decideRenew is the verdict on renew r from the key's observation o:
// refuse (a lease not current is refused only on a fresh read, proven by
// the commit), decide on a fresh read, or renew the lease.
func decideRenew(r *renewReq, o observation, fresh bool) verdict[*streams.LeaseResponse, renewPlan] {
	type v = verdict[*streams.LeaseResponse, renewPlan]
	if !o.held() || !sameLease(o.rec.LeaseID, r.leaseID) {
		if !fresh {
			return v{kind: readAgain}
		}
		return v{kind: writePlan, plan: renewPlan{act: renewRefute, o: o}}
	}
	if o.rec.Set != "" {
		return answer[*streams.LeaseResponse, renewPlan](nil, errSetMember())
	}
	if r.value != "" {
		rec := *o.rec
		rec.Value = r.value
		o.rec = &rec
	}
	if o.rec.Session == "" {
		return v{kind: writePlan, plan: renewPlan{act: renewExtend, o: o}}
	}
	if r.value == "" {
		return answer[*streams.LeaseResponse, renewPlan](nil, newOpError(streams.CodeInvalidRequest, "the lease belongs to a session and lives as long as it: keep the session alive (session.keepalive) instead of renewing the lease"))
	}
	// A new value for a lease of a session (an election's leader held in
	// a session proclaims): the value only, its expiry stays the
	// session's.
	return v{kind: writePlan, plan: renewPlan{act: renewProclaim, o: o}}
}

// commitRenew writes renew r's plan p. A lost race of the renewal is
// counted as a conflict; the proclaim's and the proof's are not (stale).
func (l *leaseOps) commitRenew(ctx context.Context, r *renewReq, p renewPlan) (*streams.LeaseResponse, outcome, error) {
	switch p.act {
	case renewRefute:
		if out, err := l.refute(ctx, r.key, p.o); out != committed || err != nil {
			return nil, out, err
		}
		l.report.renewRefused(r.resource, "not_current", r.who)
		return nil, committed, newOpError(streams.CodeLeaseLost, "lease is no longer current")
	case renewProclaim:
		return quiet(settled(l.proclaim(ctx, r.resource, r.key, p.o)))
	}
	resp, err := l.extend(ctx, r.resource, r.key, p.o, r.ttl)
	if errors.Is(err, errHoldOver) {
		l.report.renewRefused(r.resource, "max_hold", r.who)
		return nil, committed, newOpError(streams.CodeLeaseLost, "lease has been held for its max hold (until %s)", p.o.rec.HoldUntil)
	}
	return settled(resp, err)
}

// release ends the lease leaseID of resource, handing the resource to the
// head waiter in the same write when one is queued.
func (l *leaseOps) release(ctx context.Context, resource, leaseID string, who origin) (*streams.ReleaseResponse, error) {
	key := streams.LeaseKey(resource)
	st, err := l.lock(ctx, key)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	o, ok := l.tracker.get(key)
	if ok && o.held() && o.rec.Set != "" && sameLease(o.rec.LeaseID, leaseID) {
		return nil, errSetMember()
	}
	if ok && o.held() && o.rec.Session != "" && sameLease(o.rec.LeaseID, leaseID) {
		if _, _, live := l.tracker.sessionIx.sessionInfo(o.rec.Session); !live {
			return l.releaseInEndedSession(ctx, resource, key, leaseID, o.rec.Session, who)
		}
	}
	ended, err := l.handover.endIf(ctx, resource, key, func(rec *streams.Record) bool {
		// A lease of a session that has ended ended with it: it is not
		// released again (its record, if this instance missed it when the
		// session ended, is swept).
		return sameLease(rec.LeaseID, leaseID) && rec.Set == "" && !l.tracker.sessionIx.sessionLeaseEnded(rec)
	}, endRelease, who, "")
	if err != nil {
		return nil, err
	}
	released := ended != nil
	if released {
		if released, err = l.releaseCounts(ctx, key, ended.session); err != nil {
			return nil, err
		}
	}
	return &streams.ReleaseResponse{Resource: resource, Released: released}, nil
}

// releaseCounts reports whether a release that ended a lease of session
// hash ("" for none), its end now key's last write, counts: only if the
// session had not ended before it in the stream (liveInStream), when the
// instance follows the bucket; its view of the session may lag. If it
// had, the lease had ended with it.
func (l *leaseOps) releaseCounts(ctx context.Context, key, hash string) (bool, error) {
	if hash == "" || !l.sessions.inStreamOrder() {
		return true, nil
	}
	o, _ := l.tracker.get(key)
	if err := l.sessions.liveInStream(ctx, o.rev, hash); isCode(err, streams.CodeLeaseLost) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return true, nil
}

// releaseWhy says how a release of a lease of session hash ("" for none)
// ends it, and for whom: a release by who, unless the session has ended,
// which this instance may not have seen (it is then read fresh): the lease
// ended with it, and what is left of it is ended as its session's end
// would (the answer is released:false).
func (l *leaseOps) releaseWhy(ctx context.Context, hash string, who origin) (endReason, origin, error) {
	if hash == "" {
		return endRelease, who, nil
	}
	if _, _, live := l.tracker.sessionIx.sessionInfo(hash); live {
		return endRelease, who, nil
	}
	gone, err := l.sessions.sessionGone(ctx, hash)
	if err != nil || !gone {
		return endRelease, who, err
	}
	return endSessionExpiry, origin{}, nil
}

// releaseInEndedSession answers the release of a lease of session hash
// that this instance does not know live (it missed the session's end, or
// never saw the session): on a fresh read of the session's record. A
// session that has ended ended the lease with it: the answer is
// released:false, as for any lease that has ended, and the record, if it
// is still there, is ended now (its session's end, as the sweep would).
func (l *leaseOps) releaseInEndedSession(ctx context.Context, resource, key, leaseID, hash string, who origin) (*streams.ReleaseResponse, error) {
	why, by, err := l.releaseWhy(ctx, hash, who)
	if err != nil {
		return nil, err
	}
	match := func(rec *streams.Record) bool { return sameLease(rec.LeaseID, leaseID) && rec.Set == "" }
	ended, err := l.handover.endIf(ctx, resource, key, match, why, by, "")
	if err != nil {
		return nil, err
	}
	return &streams.ReleaseResponse{Resource: resource, Released: ended != nil && why == endRelease}, nil
}

// revoke ends the current lease of resource, whoever holds it. Only an
// operator may: a sender the NATS server vouched for (on an import) as one
// on the service's operator list.
func (l *leaseOps) revoke(ctx context.Context, resource, reason string, who origin) (*streams.RevokeResponse, error) {
	if !who.operator {
		l.report.ended(endRevoke, resource, 0, "", "forbidden", who, slog.String("reason", reason))
		if who.tenant() == "" {
			return nil, newOpError(streams.CodeForbidden, "revoke needs an operator: the request carries no identity stamped by the NATS server (send it through the operators' account import)")
		}
		return nil, newOpError(streams.CodeForbidden, "revoke needs an operator: %s is not on the service's operator list", who.tenant())
	}
	key := streams.LeaseKey(resource)
	st, err := l.lock(ctx, key)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	ended, err := l.handover.endIf(ctx, resource, key, func(*streams.Record) bool { return true }, endRevoke, who, reason)
	if err != nil {
		return nil, err
	}
	resp := &streams.RevokeResponse{Resource: resource, Revoked: ended != nil}
	if ended != nil {
		resp.Token = ended.token
	}
	return resp, nil
}

// status reports the state of resource, read from the stream leader, as
// who may see it.
func (l *leaseOps) status(ctx context.Context, resource string, who origin) (*streams.StatusResponse, error) {
	o, err := l.current(ctx, streams.LeaseKey(resource), true)
	if err != nil {
		return nil, err
	}
	resp := &streams.StatusResponse{Resource: resource}
	resp.Waiters, _ = l.tracker.waiterCounts(streams.EncodeResource(resource), "")
	if o.held() && o.rec.Session != "" {
		// Decide on the session as the stream leader has it: a lease of
		// an ended session is no one's.
		if _, err := l.current(ctx, streams.SessionKey(o.rec.Session), true); err != nil {
			return nil, err
		}
	}
	if o.held() && !l.tracker.sessionIx.sessionLeaseEnded(o.rec) {
		resp.Held = true
		resp.Owner = ownerFor(o.rec, who)
		resp.Token = o.rec.TokenAt(o.rev)
		resp.ExpiresAt = o.rec.ExpiresAt
		resp.HoldUntil = o.rec.HoldUntil
		resp.InSession, resp.SessionOwner = l.sessions.sessionOf(o.rec, who, &resp.ExpiresAt)
		resp.SetSize, resp.Value = o.rec.SetSize, o.rec.Value
	}
	return resp, nil
}

// list answers a page of the held leases this instance knows of, as who
// may see them.
func (l *leaseOps) list(req *streams.ListRequest, who origin) *streams.ListResponse {
	limit := req.Limit
	if limit == 0 {
		limit = streams.DefaultListLimit
	}
	page, more := l.tracker.list(req.Prefix, req.After, limit)
	resp := &streams.ListResponse{Leases: make([]streams.LeaseInfo, 0, len(page))}
	now := time.Now()
	for _, it := range page {
		if l.tracker.expired(it.o, now) {
			continue // about to be swept
		}
		info := streams.LeaseInfo{Resource: it.resource, Owner: ownerFor(it.o.rec, who),
			Token: it.o.rec.TokenAt(it.o.rev), ExpiresAt: it.o.rec.ExpiresAt, Waiters: it.waiters, HoldUntil: it.o.rec.HoldUntil}
		info.InSession, info.SessionOwner = l.sessions.sessionOf(it.o.rec, who, &info.ExpiresAt)
		info.SetSize = it.o.rec.SetSize
		if sem, k, ok := streams.SplitPermit(it.resource); ok {
			info.Resource, info.Permit = sem, k
		}
		resp.Leases = append(resp.Leases, info)
	}
	if more && len(page) > 0 {
		resp.Next = page[len(page)-1].resource
	}
	return resp
}
