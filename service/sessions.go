package service

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Sessions. A session is a record at streams.SessionKey(hash) that lives
// as a lease does: a keepalive rewrites it by compare-and-set, and it
// expires once its revision has stood for its TTL plus grace on the
// observing instance's monotonic clock (never by JetStream's per-key TTL,
// whose marker could erase an acknowledged keepalive). Its hash derives
// from the tenant and the open's request id, so a retried open finds it;
// the session id is that hash and a secret of 128 random bits kept in the
// record, which only the session's holder (and whoever reads the bucket)
// knows.
//
// A lease or wait made with a session id names the session's hash in its
// record and has no TTL of its own (only its hold limit). It is valid only
// while its session is: it counts only if no end of its session precedes
// it in the stream.
//
//   - A grant to a session (a lease, a permit, a set, a hand-over to a
//     waiter of a session) commits in one atomic batch with a check that
//     the session record is still at the revision read (leaseWrites), on
//     any number of instances: no grant follows its session's end in the
//     stream, and a lease of a session found in the bucket was granted while
//     its session lived. A keepalive that lands between the read and the
//     grant (on another instance; this one's are gated, sessionGate) fails
//     the grant's check: it is decided again on fresh reads. A retry is
//     answered from its earlier grant once the lease and the session are
//     proven current (heldInSession): a session live now was live at the
//     grant.
//   - A release of a lease of a session counts only if the session had not
//     ended before it: an instance that follows the bucket judges where the
//     release landed in the stream (liveInStream), a lone instance by its
//     view, which holds every end of a session (its own).
//   - Ending a session is one compare-and-set delete of its record (so a
//     keepalive that landed first wins), after which its leases count as
//     ended everywhere (tracker.expired): anyone may take them over by
//     compare-and-set on their revisions. The instance that ended it waits
//     until its watcher has delivered the delete — and with it every grant
//     committed before — and then ends every lease (handing it to the next
//     waiter, or deleting it in atomic batches of many keys) and every
//     wait of the session that its index lists. Other instances make the
//     same leases due a little later, in case it died meanwhile.

// sessionBatch bounds the lease keys one atomic batch deletes when a
// session ends: well under JetStream's largest atomic batch (1,000
// messages), so that one batch is one short commit, and a conflict on one
// key falls back to one write per key for no more than this many.
const sessionBatch = 64

// sessionParallel bounds the writes in flight at once while a session's
// leases and waits are ended.
const sessionParallel = 16

// Why a session ended, in its end mark, and why its leases did, in
// theirs.
const (
	endSessionClose  endReason = "session_close"
	endSessionExpiry endReason = "session_expiry"
)

// sessionGate serialises, within this instance, the writes that commit
// with a check of session hash's record or rewrite it: its keepalives, its
// end, the proofs of a negative answer about it, and the grants to it (a
// batch of them at a time, sessionCommits).
// JetStream refuses a second write whose check names a key while one is
// being proposed (it answers a conflict), so without the gate the
// concurrent writes of one session would fail each other. Between
// instances such conflicts remain; they are retried after a pause
// (conflictPause). The gate is always the last lock taken (after the
// session's key and a lease key), so it cannot deadlock.
func (l *sessionOps) sessionGate(ctx context.Context, hash string) (*keyLock, error) {
	return l.keys.lock(ctx, "gate."+hash)
}

// commitGrant commits ws, the writes of a grant (a lease, a permit, a set,
// a hand-over) to session hash, or to no session when hash is empty, as
// store.commitWrites does: in a session through the session's gate,
// together with the session's other grants waiting then (sessionCommits).
func (l *sessionOps) commitGrant(ctx context.Context, op, hash string, ws []write) (revs []uint64, dup bool, err error) {
	if hash == "" {
		return l.store.commitWrites(ctx, op, ws)
	}
	return l.commits.commit(ctx, op, hash, ws)
}

// sessionOps opens, keeps alive and ends sessions, ends their members
// with them, and decides whether a grant made in a session counts.
type sessionOps struct {
	*engineDeps
	commits *sessionCommits
	// the roles it reaches (see locks)
	sets     *setOps
	handover *handoverOps
}

// sessionReq is a validated session.open.
type sessionReq struct {
	requestID, owner string
	ttl              time.Duration
	who              origin
	tenant           string
	hash, key        string
}

// newSessionReq returns the open of requestID by who.
func newSessionReq(requestID, owner string, ttl time.Duration, who origin) *sessionReq {
	tenant := who.tenant()
	hash := sessionHash(requestID, tenant)
	return &sessionReq{requestID: requestID, owner: owner, ttl: ttl, who: who, tenant: tenant, hash: hash, key: streams.SessionKey(hash)}
}

// sessionHash is the key hash of the session opened by requestID of
// tenant: a request hash of no resource (no resource is empty), so it
// never meets a lease's.
func sessionHash(requestID, tenant string) string { return requestHash("", requestID, tenant) }

// sessionID is the id handed to the session's holder.
func sessionID(hash string, rec *streams.Record) string { return hash + rec.LeaseID }

// holds reports whether who, presenting secret, holds the session observed
// in o: a live record of who's tenant carrying that secret.
func holds(o observation, secret string, who origin) bool {
	return o.held() && o.rec.Tenant == who.tenant() && sameLease(o.rec.LeaseID, secret)
}

// errNoSession is the answer about a session that has ended, never
// existed, or is another caller's: they are not told apart.
func errNoSession() *opError {
	return newOpError(streams.CodeLeaseLost, "session has ended (or is not this caller's): open a new one")
}

// sessionEnded is the answer to a retried open whose session has ended.
func sessionEnded(requestID string) *opError {
	return newOpError(streams.CodeLeaseLost, "request_id %q opened a session before, and that session has ended: open a new one with a new request_id", requestID)
}

// openSession opens the session of r, or answers a retry of the same open
// with the same session while it lives (as a keepalive), and lease_lost
// once it has ended: on the commit loop, as a request in no session (at
// most maxAttempts times). No conflict of an open is counted or paused
// after (stale).
func (l *sessionOps) openSession(ctx context.Context, r *sessionReq) (*streams.SessionResponse, error) {
	st, err := l.lock(ctx, r.key)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	if l.tracker.retry.hasEnded(r.key, r.requestID, r.tenant) {
		return nil, sessionEnded(r.requestID)
	}
	return commitLoop(ctx, l.engineDeps, "", false, engineSteps[openSnap, openPlan, *streams.SessionResponse]{
		read: func(ctx context.Context, fresh bool) (openSnap, bool, error) {
			o, err := l.current(ctx, r.key, fresh)
			return openSnap{o: o, facts: l.openFacts(r)}, false, err
		},
		decide: func(s openSnap, _ bool) verdict[*streams.SessionResponse, openPlan] {
			return decideOpen(r, s)
		},
		commit: func(ctx context.Context, s openSnap, p openPlan) (*streams.SessionResponse, outcome, error) {
			return l.commitOpen(ctx, r, s.o, p)
		},
	})
}

// openSnap is what an open decides on: its key's observation, and the
// view's facts (room: the tenant's cap of sessions).
type openSnap struct {
	o     observation
	facts viewFacts
}

// openFacts returns the view's facts for the open r, now.
func (l *sessionOps) openFacts(r *sessionReq) viewFacts {
	f := l.viewFacts()
	if n, _ := l.tracker.sessionIx.sessionCounts(r.tenant); n >= l.cfg.MaxSessionsPerTenant {
		f.room = newOpError(streams.CodeTooManyWaiters, "this NATS user has %d sessions open, the cap", n)
	}
	return f
}

// openPlan is what an open writes.
type openPlan uint8

const (
	openNew     openPlan = iota // a new session
	openRetried                 // the same open, retried: kept alive
)

// decideOpen is the verdict on the open r from the snapshot s: the same
// open retried if its key holds it, a new session, or a refusal. It is a
// function of its arguments alone.
func decideOpen(r *sessionReq, s openSnap) verdict[*streams.SessionResponse, openPlan] {
	type v = verdict[*streams.SessionResponse, openPlan]
	refuse := func(err error) v { return answer[*streams.SessionResponse, openPlan](nil, err) }
	o := s.o
	switch {
	case o.foreign:
		return refuse(newOpError(streams.CodeUnavailable, "the session's key holds a value jetlock did not write; it is removed once it has stood for the longest TTL"))
	case o.held():
		// The hash is the tenant's and the request id's: this is the
		// same open, retried.
		if o.rec.Owner != r.owner {
			return refuse(newOpError(streams.CodeInvalidRequest, "request_id %q opened a session for another owner", r.requestID))
		}
		return v{kind: writePlan, plan: openRetried}
	case o.end.Ended(r.requestID, r.tenant, s.facts.now, s.facts.window):
		return refuse(sessionEnded(r.requestID))
	case s.facts.room != nil:
		return refuse(s.facts.room)
	}
	return v{kind: writePlan, plan: openNew}
}

// commitOpen writes the open r's plan p over its key's observation o. A
// write that lost a race is stale: decided again on fresh reads, as is an
// earlier open (earlierOpen) whose every attempt lost one.
func (l *sessionOps) commitOpen(ctx context.Context, r *sessionReq, o observation, p openPlan) (*streams.SessionResponse, outcome, error) {
	if p == openRetried {
		resp, err := l.extend(ctx, "", r.key, o, r.ttl)
		if err != nil {
			return quiet(settled[*streams.SessionResponse](nil, err))
		}
		return &streams.SessionResponse{SessionID: sessionID(r.hash, o.rec), TTLms: resp.TTLms, ExpiresAt: resp.ExpiresAt}, committed, nil
	}
	now := l.cfg.Clock.Now()
	rec := &streams.Record{LeaseID: newLeaseID(), Owner: r.owner, Tenant: r.tenant, RequestID: r.requestID, GrantedAt: streams.FormatTime(now)}
	setExpiry(rec, now, r.ttl, time.Time{})
	seq, dup, err := l.store.put(ctx, r.key, rec, o.rev, "sess-"+r.hash)
	if err != nil {
		if !isConflict(err) {
			l.tracker.forget(r.key)
		}
		return quiet(settled[*streams.SessionResponse](nil, err))
	}
	if dup {
		// Opened before, at seq: the same session if it is still
		// the key's record, else it has ended. A read can still miss
		// that write (it committed while this request was deciding):
		// decide on a read that has seen it.
		return quiet(settled(l.earlierOpen(ctx, r, seq)))
	}
	l.tracker.observe(r.key, entry{rev: seq, rec: rec})
	l.report.session("opened", r.owner, r.who)
	return &streams.SessionResponse{SessionID: sessionID(r.hash, rec), TTLms: rec.TTLms, ExpiresAt: rec.ExpiresAt}, committed, nil
}

// earlierOpen answers an open whose write JetStream reported as a
// duplicate of an earlier write at seq (an earlier attempt of the same
// open): that session, kept alive, while it is the key's record; once the
// key has moved past it, lease_lost. It reads fresh until a read has seen
// seq (pausing about a commit between), on the commit loop.
func (l *sessionOps) earlierOpen(ctx context.Context, r *sessionReq, seq uint64) (*streams.SessionResponse, error) {
	type v = verdict[*streams.SessionResponse, openPlan]
	return commitLoop(ctx, l.engineDeps, r.hash, true, engineSteps[observation, openPlan, *streams.SessionResponse]{
		read: func(ctx context.Context, _ bool) (observation, bool, error) {
			o, err := l.current(ctx, r.key, true)
			if err == nil && o.rev < seq {
				l.conflictPause(ctx) // the read has not seen the earlier write yet
				return o, true, nil
			}
			return o, false, err
		},
		decide: func(o observation, _ bool) v {
			switch {
			case !o.held():
				return answer[*streams.SessionResponse, openPlan](nil, sessionEnded(r.requestID))
			case o.rec.Owner != r.owner:
				// The key is the tenant's and the request id's: the
				// record is that open's, kept alive since.
				return answer[*streams.SessionResponse, openPlan](nil, newOpError(streams.CodeInvalidRequest, "request_id %q opened a session for another owner", r.requestID))
			}
			return v{kind: writePlan, plan: openRetried}
		},
		commit: func(ctx context.Context, o observation, p openPlan) (*streams.SessionResponse, outcome, error) {
			return quiet(l.commitOpen(ctx, r, o, p))
		},
	})
}

// onSession runs a request about session hash on the commit loop
// (onRecord), its negative answer proven by confirmSession (through the
// session's gate): at most attempts(hash) times, starting on the view
// unless fresh.
func onSession[R any](ctx context.Context, l *sessionOps, hash string, fresh bool, s recordSteps[R]) (R, error) {
	prove := func(ctx context.Context, o observation) (outcome, error) {
		_, out, err := quiet(settled(struct{}{}, l.confirmSession(ctx, hash, o)))
		return out, err
	}
	return onRecord(ctx, l.engineDeps, streams.SessionKey(hash), hash, fresh, prove, s)
}

// asIs is the act of a request that only reads a live session: o itself.
func asIs(_ context.Context, o observation) (observation, outcome, error) {
	return o, committed, nil
}

// notOwned logs, at debug level, what a negative answer about session key
// rested on: rare, and the first thing to read when a caller disputes it.
func (l *sessionOps) notOwned(key string, o observation, secret string, who origin) {
	if !l.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	args := []any{"key", key, "rev", o.rev, "held", o.held(), "foreign", o.foreign, "ended", o.end != nil}
	if o.rec != nil {
		args = append(args, "tenant_match", o.rec.Tenant == who.tenant(), "secret_match", sameLease(o.rec.LeaseID, secret))
	}
	l.log.Debug("session not the caller's", args...)
}

// lockSession splits the session id id and locks its session's key.
func (l *sessionOps) lockSession(ctx context.Context, id string) (hash, key, secret string, st *keyLock, err error) {
	if hash, secret, err = streams.SplitSessionID(id); err != nil {
		return "", "", "", nil, err
	}
	key = streams.SessionKey(hash)
	if st, err = l.lock(ctx, key); err != nil {
		return "", "", "", nil, err
	}
	return hash, key, secret, st, nil
}

// keepalive extends the session id by ttl (zero: its TTL so far).
func (l *sessionOps) keepalive(ctx context.Context, id string, ttl time.Duration, who origin) (*streams.KeepaliveResponse, error) {
	hash, key, secret, st, err := l.lockSession(ctx, id)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	return onSession(ctx, l, hash, false, recordSteps[*streams.KeepaliveResponse]{
		live: func(s recordSnap) bool { return holds(s.observation, secret, who) },
		act: func(ctx context.Context, o observation) (*streams.KeepaliveResponse, outcome, error) {
			t := ttl
			if t == 0 {
				t = time.Duration(o.rec.TTLms) * time.Millisecond
			}
			gate, err := l.sessionGate(ctx, hash)
			if err != nil {
				return nil, committed, err
			}
			resp, err := l.extend(ctx, "", key, o, t)
			gate.unlock()
			if err != nil {
				return settled[*streams.KeepaliveResponse](nil, err)
			}
			leases, _ := l.tracker.sessionIx.memberCount(hash)
			l.report.keptAlive(leases)
			return &streams.KeepaliveResponse{SessionID: id, TTLms: resp.TTLms, ExpiresAt: resp.ExpiresAt, Leases: leases}, committed, nil
		},
		negative: func(o observation) (*streams.KeepaliveResponse, error) {
			l.notOwned(key, o, secret, who)
			return nil, errNoSession()
		},
		pause: true,
	})
}

// closeSession ends the session id: every lease it holds and every wait
// it made end with it. Closing a session that has ended already (or is
// not the caller's) answers closed:false.
func (l *sessionOps) closeSession(ctx context.Context, id string, who origin) (*streams.SessionCloseResponse, error) {
	hash, key, secret, st, err := l.lockSession(ctx, id)
	if err != nil {
		return nil, err
	}
	defer st.unlock()
	return onSession(ctx, l, hash, false, recordSteps[*streams.SessionCloseResponse]{
		live: func(s recordSnap) bool { return holds(s.observation, secret, who) },
		act: func(ctx context.Context, o observation) (*streams.SessionCloseResponse, outcome, error) {
			n, err := l.endSession(ctx, key, o, endSessionClose, who)
			if err != nil {
				return settled[*streams.SessionCloseResponse](nil, err)
			}
			return &streams.SessionCloseResponse{Closed: true, Released: n}, committed, nil
		},
		negative: func(o observation) (*streams.SessionCloseResponse, error) {
			l.notOwned(key, o, secret, who)
			return &streams.SessionCloseResponse{}, nil
		},
		pause: true,
	})
}

// endSession ends the session observed in o at key: one compare-and-set
// delete of its record (errConflict: it moved on, decide again), then the
// end of its leases and waits. It returns the number of leases the session
// held. The caller holds the session key's lock.
func (l *sessionOps) endSession(ctx context.Context, key string, o observation, why endReason, who origin) (int, error) {
	hash := sessionHashOf(key)
	end := &streams.EndMark{RequestID: o.rec.RequestID, Tenant: o.rec.Tenant, EndedAt: streams.FormatTime(l.cfg.Clock.Now()), Why: string(why)}
	gate, err := l.sessionGate(ctx, hash)
	if err != nil {
		return 0, err
	}
	seq, err := l.store.del(ctx, key, o.rev, end)
	gate.unlock()
	if err != nil {
		if !errors.Is(err, errConflict) {
			l.tracker.forget(key)
		}
		return 0, err
	}
	l.tracker.observe(key, entry{rev: seq, end: end})
	l.report.session(string(why), o.rec.Owner, who)
	// Every grant to the session committed before seq (see leaseWrites);
	// once the watcher has delivered seq, the index lists them all. A lone
	// instance, which follows no watcher, made them itself (and what an
	// instance it had not heard of yet granted is ended by the instances
	// that follow the bucket, or by the hold limit).
	l.awaitDelivered(ctx, seq)
	return l.endMembers(ctx, hash, why), nil
}

// awaitDelivered waits, within ctx and OpTimeout, until the watcher has
// delivered revision seq, when the instance follows the bucket.
func (l *sessionOps) awaitDelivered(ctx context.Context, seq uint64) {
	if !l.following() || l.delivered == nil {
		return
	}
	if !l.waitDelivered(ctx, seq) && ctx.Err() == nil {
		l.log.Warn("ending a session before the watcher delivered its end; the other instances end what is missed", "revision", seq)
	}
}

// waitDelivered waits, within ctx and OpTimeout, until the watcher has
// delivered revision seq, and reports whether it has.
func (l *sessionOps) waitDelivered(ctx context.Context, seq uint64) bool {
	if l.delivered() >= seq {
		return true
	}
	if l.seen == nil {
		return false
	}
	give := time.NewTimer(l.cfg.OpTimeout)
	defer give.Stop()
	select {
	case <-ctx.Done():
	case <-give.C:
	case <-l.seen.wait(seq):
	}
	return l.delivered() >= seq
}

// inStreamOrder reports whether the stream's order decides whether a
// release of a lease of a session counts (see liveInStream): while the
// instance follows the bucket and its watcher has delivered every record
// once. A lone instance's view holds every end of a session: its own.
func (l *sessionOps) inStreamOrder() bool {
	return l.delivered != nil && l.synced != nil && l.synced.Load() && l.following()
}

// liveInStream reports whether session hash was live at revision rev of
// the stream (nil), or had ended before it (lease_lost): where a release
// of one of its leases landed, whose answer must not say it released a
// lease that had ended with its session. Once the watcher has delivered
// rev, it has delivered every write before it (deliveries, which only the
// watcher feeds: no read of a stale stream leader enters it): a session
// record still live there (an ended session never lives again) was not
// ended before rev. When the watcher has not delivered rev within
// OpTimeout the answer is unavailable.
func (l *sessionOps) liveInStream(ctx context.Context, rev uint64, hash string) error {
	if l.seen != nil {
		give := time.NewTimer(l.cfg.OpTimeout)
		defer give.Stop()
		for {
			if live, known := l.seen.liveAt(hash, "", rev); known && live {
				return nil
			} else if known && l.seen.endedEarlier(hash, "", rev) {
				// The watcher delivered the session's end before rev:
				// committed, so no read decides it again (a stream leader
				// cut off by a partition that has just healed could still
				// show the session live).
				return errNoSession()
			} else if known {
				return l.notLiveAt(ctx, hash, rev)
			}
			select {
			case <-ctx.Done():
			case <-give.C:
			case <-l.seen.wait(rev):
				continue
			}
			break
		}
	}
	return newOpError(streams.CodeUnavailable, "the release was written but its session's order in the stream is not confirmed yet: retry")
}

// notLiveAt decides a release at rev of a lease of session hash that the
// watcher's deliveries do not show live there, nor ended before it (a
// session whose records the watcher skipped): on the stream leader, the
// session's record read fresh and proven current (confirmSession). Live
// now, it was never ended, so it was live at every revision since it was
// opened: the release counts. Otherwise it had ended (lease_lost). A
// negative answer is proven as every other is (see confirmNegative):
// deliveries is a fast path that does not show a session whose records
// its watcher skipped (one opened and kept alive while the watcher's
// consumer was made again, see deliveries).
func (l *sessionOps) notLiveAt(ctx context.Context, hash string, rev uint64) error {
	_, err := onSession(ctx, l, hash, true, recordSteps[struct{}]{
		live: func(s recordSnap) bool { return s.held() && !s.expired },
		act: func(context.Context, observation) (struct{}, outcome, error) {
			l.log.Debug("a session the watcher did not show live at a release's revision is live", "session", hash, "revision", rev, "delivered", l.delivered())
			return struct{}{}, committed, nil
		},
		negative: func(observation) (struct{}, error) {
			l.log.Debug("a release in a session that was not live at its place in the stream", "session", hash, "revision", rev, "delivered", l.delivered())
			return struct{}{}, errNoSession()
		},
	})
	return err
}

// endMembers ends every lease and wait of the ended session hash that the
// index lists, and returns the number of leases. Leases with a waiter are
// handed over one by one; the others are deleted in atomic batches of up
// to sessionBatch keys. At most sessionParallel writes are in flight, so
// a session of many leases never holds up other work for long.
func (l *sessionOps) endMembers(ctx context.Context, hash string, why endReason) int {
	leases, waits := l.tracker.sessionIx.members(hash)
	sem := make(chan struct{}, sessionParallel)
	var wg sync.WaitGroup
	run := func(f func()) {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			f()
		}()
	}
	for _, wkey := range waits {
		run(func() { l.endSessionWait(ctx, wkey, hash) })
	}
	var group []string
	sets := map[string][]string{} // a set lease's keys, by its lease id
	for _, key := range leases {
		if o, ok := l.tracker.get(key); ok && o.held() && o.rec.Set != "" {
			sets[o.rec.LeaseID] = append(sets[o.rec.LeaseID], key)
			continue
		}
		if _, queued := l.tracker.head(queueOf(key)); queued {
			run(func() { l.endSessionLease(ctx, key, hash, why) })
			continue
		}
		if group = append(group, key); len(group) == sessionBatch {
			g := group
			run(func() { l.removeSessionLeases(ctx, g, hash, why) })
			group = nil
		}
	}
	if len(group) > 0 {
		run(func() { l.removeSessionLeases(ctx, group, hash, why) })
	}
	for id, keys := range sets {
		run(func() { l.endSessionSet(ctx, id, keys, hash, why, false) })
	}
	wg.Wait()
	return len(leases)
}

// endSessionSet ends the set lease id of the ended session hash, held at
// keys (and at any other key the tracker knows it at): every key in one
// atomic batch, as a set ends whole, waking each key's head waiter. It
// reports false when the set is to be ended again later: the keys could
// not be locked or read, or fewer of them hold the set than its size (a
// key this instance forgot after a write of unknown outcome is not among
// them) and partial is not set. Such a set is left to the sweep
// (expireSetKey), which ends the keys it knows only once the set has been
// given setExpiryPatience to show whole.
func (l *sessionOps) endSessionSet(ctx context.Context, id string, keys []string, hash string, why endReason, partial bool) bool {
	for _, k := range l.tracker.setIx.setKeys(id) {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	unlock, err := l.sets.lockAll(ctx, keys)
	if err != nil {
		return false
	}
	defer unlock()
	ended, err := commitLoop(ctx, l.engineDeps, "", false, engineSteps[[]observation, []bool, bool]{
		read: func(ctx context.Context, fresh bool) ([]observation, bool, error) {
			obs, err := l.sets.readAll(ctx, keys, fresh)
			return obs, false, err
		},
		decide: func(obs []observation, fresh bool) verdict[bool, []bool] {
			match := make([]bool, len(keys))
			n, size := 0, 0
			for i, o := range obs {
				if match[i] = o.held() && o.rec.LeaseID == id && o.rec.Session == hash; match[i] {
					n, size = n+1, o.rec.SetSize
				}
			}
			switch {
			case n >= size || partial:
				return verdict[bool, []bool]{kind: writePlan, plan: match}
			case !fresh:
				return verdict[bool, []bool]{kind: readAgain} // the tracker's view may lag
			}
			return answer[bool, []bool](false, nil) // not known whole
		},
		commit: func(ctx context.Context, obs []observation, match []bool) (bool, outcome, error) {
			_, err := l.sets.endSetKeys(ctx, keys, obs, match, why, origin{}, "")
			return quiet(settled(err == nil, err))
		},
	})
	if !ended && err == nil {
		l.log.Debug("a set of an ended session not known whole", "session", hash, "lease_id", id)
	}
	return ended && err == nil
}

// endSessionLease ends the lease at key if it is still the ended session
// hash's, handing the resource to the next waiter.
func (l *sessionOps) endSessionLease(ctx context.Context, key, hash string, why endReason) {
	st, err := l.lock(ctx, key)
	if err != nil {
		return // the sweep ends it (sessionIndex.membersDue)
	}
	defer st.unlock()
	res := decodedResource(resourceOf(key))
	_, _ = commitLoop(ctx, l.engineDeps, "", false, engineSteps[observation, struct{}, struct{}]{
		read: l.readKey(key),
		decide: func(o observation, _ bool) verdict[struct{}, struct{}] {
			if !o.held() || o.rec.Session != hash {
				return answer[struct{}, struct{}](struct{}{}, nil)
			}
			return verdict[struct{}, struct{}]{kind: writePlan}
		},
		commit: func(ctx context.Context, o observation, _ struct{}) (struct{}, outcome, error) {
			err := l.handover.end(ctx, res, key, o, why, "")
			if err == nil {
				l.report.ended(why, res, o.rec.TokenAt(o.rev), o.rec.Owner, "ended", origin{})
			}
			return quiet(settled(struct{}{}, err))
		},
	})
}

// removeSessionLeases deletes the leases at keys that are still the ended
// session hash's, in one atomic batch (one commit for them all); if any
// moved on meanwhile, the batch fails whole and each is ended on its own.
func (l *sessionOps) removeSessionLeases(ctx context.Context, keys []string, hash string, why endReason) {
	type member struct {
		key string
		o   observation
		end *streams.EndMark
	}
	now := streams.FormatTime(l.cfg.Clock.Now())
	var ms []member
	var msgs []*batchMsg
	for _, key := range keys {
		o, ok := l.tracker.get(key)
		if !ok || !o.held() || o.rec.Session != hash {
			continue
		}
		end := &streams.EndMark{RequestID: o.rec.RequestID, Tenant: o.rec.Tenant, EndedAt: now, Why: string(why)}
		ms = append(ms, member{key: key, o: o, end: end})
		msgs = append(msgs, l.store.deleteMsg(key, o.rev, end.AppendJSON(nil)))
	}
	if len(ms) == 0 {
		return
	}
	if _, err := l.store.batch(ctx, "delete", msgs); err != nil {
		for _, m := range ms {
			if !errors.Is(err, errConflict) {
				l.tracker.forget(m.key)
			}
			l.endSessionLease(ctx, m.key, hash, why)
		}
		return
	}
	for i, m := range ms {
		l.tracker.observe(m.key, entry{rev: msgs[i].seq, end: m.end})
		res := decodedResource(resourceOf(m.key))
		l.report.ended(why, res, m.o.rec.TokenAt(m.o.rev), m.o.rec.Owner, "ended", origin{})
		l.handover.wakeHead(queueOf(m.key)) // a waiter that queued meanwhile
	}
}

// endSessionWait removes the waiter record at wkey if it is still the
// ended session hash's, and tells its waiting request at once.
func (l *sessionOps) endSessionWait(ctx context.Context, wkey, hash string) {
	o, ok := l.tracker.get(wkey)
	if !ok || !o.held() || o.rec.Session != hash {
		return
	}
	enc := resourceOf(wkey)
	st, err := l.lock(ctx, streams.LeaseKeyPrefix+enc)
	if err != nil {
		return
	}
	defer st.unlock()
	if _, err := l.handover.dequeue(ctx, decodedResource(enc), wkey, o.rec.Owner, o); err != nil {
		l.log.Debug("end a wait of an ended session", "key", wkey, "err", err)
	}
}

// expireSession ends the session observed in o, whose revision has stood
// for its TTL plus grace: by compare-and-set on that revision, so a
// keepalive that landed meanwhile wins. The caller holds the key's lock.
func (l *sessionOps) expireSession(ctx context.Context, key string, o observation) error {
	_, err := l.endSession(ctx, key, o, endSessionExpiry, origin{})
	return err
}

// session returns the live session g is made in, as g's caller holds it:
// from the tracker, or read fresh when the tracker does not show it live
// (or fresh is set). A session that has ended, is expiring, or is not the
// caller's is lease_lost, on a read proven by a conditional write
// (onSession).
func (l *sessionOps) session(ctx context.Context, g *grantReq, fresh bool) (observation, error) {
	return onSession(ctx, l, g.session, fresh, recordSteps[observation]{
		live: func(s recordSnap) bool { return holds(s.observation, g.secret, g.who) && !s.expired },
		act:  asIs,
		negative: func(observation) (observation, error) {
			return observation{}, errNoSession()
		},
	})
}

// confirmSession proves the fresh read o of session hash's record before a
// negative answer (see confirmNegative), through the session's gate: the
// confirming write checks the session's key, as its grants do. A conflict
// is decided again after a pause.
//
// A read that found the session's record deleted needs no proof: a stale
// leader answers from a prefix of the stream, in which that delete is
// committed too, and an ended session never lives again (a new open of
// the same request id makes a new secret).
func (l *sessionOps) confirmSession(ctx context.Context, hash string, o observation) error {
	if o.rev != 0 && !o.held() && !o.foreign {
		return nil
	}
	gate, err := l.sessionGate(ctx, hash)
	if err != nil {
		return err
	}
	err = l.confirmNegative(ctx, streams.SessionKey(hash), o)
	gate.unlock()
	if errors.Is(err, errConflict) {
		l.conflictPause(ctx)
	}
	return err
}

// sessionOf says whether rec, a lease record, belongs to a session, and
// that session's owner as who may see it (as the lease's owner). For a
// lease of a session it sets *expires to the session's expiry (the
// lease's own is its hold limit), when the tracker knows the session.
func (l *sessionOps) sessionOf(rec *streams.Record, who origin, expires *string) (bool, string) {
	if rec.Session == "" {
		return false, ""
	}
	owner, until, ok := l.tracker.sessionIx.sessionInfo(rec.Session)
	if ok && until < *expires {
		*expires = until // both RFC 3339 in UTC with milliseconds
	}
	if !who.sees(rec) {
		return true, ""
	}
	return true, owner
}

// sessionGone reports whether a fresh read finds session hash ended or
// absent. A lease whose session's record is absent (its end mark has left
// the bucket after the retry window, as when the instance that ended it
// died before ending the lease and no instance followed the bucket then)
// is nobody's.
func (l *sessionOps) sessionGone(ctx context.Context, hash string) (bool, error) {
	o, err := l.current(ctx, streams.SessionKey(hash), true)
	if err != nil {
		return false, err
	}
	return !o.held(), nil
}

// sessionRoom refuses a new lease or wait of session hash when it holds
// MaxPerSession already.
func (l *sessionOps) sessionRoom(hash string) error {
	if _, n := l.tracker.sessionIx.memberCount(hash); n >= l.cfg.MaxPerSession {
		return newOpError(streams.CodeTooManyWaiters, "this session holds %d leases and waits, the cap", n)
	}
	return nil
}

// sessionCheck returns the check a grant to a waiter of session hash
// commits with: that the session record is still at the revision the
// tracker (or a fresh read) has. A session that has ended is errDuplicate:
// its waiter can never be granted.
func (l *sessionOps) sessionCheck(ctx context.Context, hash string) (check, error) {
	key := streams.SessionKey(hash)
	o, known := l.tracker.get(key)
	if !known {
		var err error
		if o, err = l.current(ctx, key, true); err != nil {
			return check{}, err
		}
	}
	if !o.held() {
		return check{}, errDuplicate
	}
	return check{key: key, rev: o.rev}, nil
}

// sessionLease makes rec, a lease granted at now, a lease of session hash:
// it carries no TTL of its own but its hold limit (at most the longest a
// record may carry); its session's end ends it.
func sessionLease(rec *streams.Record, now time.Time, hash string, holdLimit time.Time) {
	rec.Session = hash
	setExpiry(rec, now, streams.MaxRecordTTL, holdLimit)
}

// sessionLeaseResponse is the grant of the lease rec of a session, whose
// record was observed in sess: the session's TTL and expiry stand for the
// lease's (the lease lives as long as the session).
func sessionLeaseResponse(resource string, token uint64, rec *streams.Record, sess *streams.Record) *streams.LeaseResponse {
	resp := leaseResponse(resource, token, rec)
	if sess != nil {
		resp.TTLms, resp.ExpiresAt = sess.TTLms, sess.ExpiresAt
	}
	return resp
}
