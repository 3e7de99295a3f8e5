package service

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// The engine: every grant (a lock, a permit of a semaphore, a lock set),
// the answer to a grant's duplicate (earlierGrant), the renewal of a
// lease, every request about a session (open, keepalive, close, the
// lookup of a grant's session) and the conditional end of a lease is made
// by one commit loop (commitLoop) from three steps that its primitive
// supplies. The read step gathers a snapshot (the records, the session's
// record, the name rule's record), on the instance's view or fresh from
// the stream leader. The decide step does no I/O: it returns a verdict
// value — answer now (a response or a refusal), decide again on fresh
// reads, prove and answer a retry of the same request, or write a plan
// (a grant, a renewal, or the conditional write that proves the fresh
// read a refusal rests on). Every decide step is a function of its
// snapshot and its request alone: the read step puts in the snapshot what
// the view adds (viewFacts: the clock's reading, whether the instance
// follows the bucket, the guard, the session's or tenant's room; each
// key's expiry and the waiters ahead), and a grant's writes are planned as
// values (write: grantWrites, setGrantWrites) that the store commits as
// one atomic batch. So the simulation (sim_internal_test.go) runs the same
// loop and grant deciders against a model of the bucket. The commit step
// writes the plan and reports, as a value, whether the write committed,
// lost a race (conflict), found the snapshot moved on under a write not
// counted as a race (stale) or was a duplicate of an earlier write of the
// request. The loop owns what is common: the bound of attempts, the switch
// to fresh reads, the conflict's report and pause (races), and the answer
// when every attempt lost a race. Renewals and releases of lock sets,
// waiter enqueues, the end of a session's leases and sets, and a few
// single-key writes (a waiter record's delete, cancel tombstones) run on
// it too.
//
// This file holds the loop and what every primitive's steps share: the
// clock a snapshot is read at, the guard's verdict, the key locks the loop
// runs under, and the name rule, which every grant's read step applies.
// Each primitive's read step and decider are in its own file (locks.go,
// semaphores.go, sets.go, sessions.go).

// verdictKind says what the loop does with a decision.
type verdictKind uint8

const (
	// answerNow: answer with the verdict's response, or its refusal.
	answerNow verdictKind = iota
	// readAgain: the view must not decide alone; decide on fresh reads.
	readAgain
	// proveRetry: the records hold this request's earlier grant; the
	// prove step answers it (renewed, or proven held in its session).
	proveRetry
	// writePlan: write the verdict's plan (the commit step).
	writePlan
)

// verdict is a decide step's result: what to do, and with what.
type verdict[R, P any] struct {
	kind verdictKind
	resp R     // answerNow: the response, unless err
	err  error // answerNow: the refusal
	plan P     // writePlan: what to write
}

// answer is the verdict to answer now with resp or the refusal err.
func answer[R, P any](resp R, err error) verdict[R, P] {
	return verdict[R, P]{kind: answerNow, resp: resp, err: err}
}

// outcome is what a commit (or a retry's proof) reports of its writes.
type outcome uint8

const (
	committed  outcome = iota // written (or answered); the response stands
	conflicted                // lost a race with another writer: decide again
	duplicated                // an earlier write of the request was found
	// stale: the snapshot was not current (a write or proof that is not
	// counted as a lost race found its key moved on): decide again on
	// fresh reads, with neither the conflict's report nor its pause.
	stale
)

// engineSteps is one primitive's part of the commit loop, over its
// snapshot S, its plan P and its response R.
type engineSteps[S, P, R any] struct {
	// read gathers the snapshot (fresh: from the stream leader); again
	// asks for fresh reads (the view may lag, or a read's own commit,
	// such as a name record's retirement, lost a race).
	read func(ctx context.Context, fresh bool) (snap S, again bool, err error)
	// decide is the verdict on snap; it does no I/O.
	decide func(snap S, fresh bool) verdict[R, P]
	// prove answers a retry of the request found in snap.
	prove func(ctx context.Context, snap S) (R, outcome, error)
	// commit writes plan.
	commit func(ctx context.Context, snap S, plan P) (R, outcome, error)
	// earlier answers a commit that found an earlier write of the
	// request (nil: the commit step resolves its duplicates itself).
	earlier func(ctx context.Context, snap S) (R, error)
	// pause: after a lost commit, wait about a commit before reading
	// again (the winner may be this request's own attempt elsewhere).
	pause bool
}

// races is what the commit loop asks of its instance when a commit lost a
// race: count it, and with pause wait about a commit (the instance's
// engineDeps; the simulation's scheduler in its tests).
type races interface {
	lostRace(ctx context.Context, pause bool)
}

// commitLoop reads, decides, writes and retries on a conflict, at most
// attempts(session) times, starting on the view unless fresh.
func commitLoop[S, P, R any](ctx context.Context, l races, session string, fresh bool, s engineSteps[S, P, R]) (R, error) {
	var zero R
	for attempt := 0; attempt < attempts(session); attempt++ {
		snap, again, err := s.read(ctx, fresh)
		if err != nil {
			return zero, err
		}
		if again {
			fresh = true
			continue
		}
		v := s.decide(snap, fresh)
		var resp R
		var out outcome
		switch v.kind {
		case answerNow:
			return v.resp, v.err
		case readAgain:
			fresh = true
			continue
		case proveRetry:
			if resp, out, err = s.prove(ctx, snap); out == conflicted || out == stale {
				fresh = true
				continue
			}
			return resp, err
		}
		resp, out, err = s.commit(ctx, snap, v.plan)
		switch out {
		case conflicted:
			l.lostRace(ctx, s.pause)
			fresh = true
			continue
		case stale:
			fresh = true
			continue
		case duplicated:
			return s.earlier(ctx, snap)
		}
		return resp, err
	}
	return zero, tooManyConflicts()
}

// lostRace counts a commit that lost a race, and with pause waits about a
// commit (conflictPause).
func (l *engineDeps) lostRace(ctx context.Context, pause bool) {
	l.report.conflict()
	if pause {
		l.conflictPause(ctx)
	}
}

// write is one message of a commit as a decision plans it: at key, by
// compare-and-set on revision expect, the entry e (a record, a name
// record, or a delete and its end mark); or, with check, no value but the
// condition that key is still at expect. msgID, when set, makes a second
// write of the same request a duplicate. A commit's writes are one atomic
// batch: all or nothing.
type write struct {
	key    string
	expect uint64
	e      entry
	msgID  string
	check  bool
}

// settled turns a write's error into the loop's outcome: a lost
// compare-and-set is a conflict, anything else stands.
func settled[R any](resp R, err error) (R, outcome, error) {
	if isConflict(err) {
		var zero R
		return zero, conflicted, nil
	}
	return resp, committed, err
}

// quiet makes a conflict of a write that is not counted as a lost race
// (it is not reported, nor paused after) stale.
func quiet[R any](resp R, out outcome, err error) (R, outcome, error) {
	if out == conflicted {
		out = stale
	}
	return resp, out, err
}

// isConflict reports whether err is a lost compare-and-set.
func isConflict(err error) bool { return errors.Is(err, errConflict) }

// recordPlan is what a request about one record writes: its own write
// (recordAct) on a record it may act on, or the proof (recordProve) of the
// fresh read that shows it may not.
type recordPlan uint8

const (
	recordAct recordPlan = iota
	recordProve
)

// recordSnap is a record as a request about it read it, and whether it
// has expired as the instance observes it (tracker.expired).
type recordSnap struct {
	observation
	expired bool
}

// recordSteps are the steps of a request about one record (a lease, a
// session) that acts on it when it is live and otherwise answers a
// negative that rests on a proven fresh read.
type recordSteps[R any] struct {
	// live says whether the record read (s) is one the request may act on
	// (held by its caller, say): the decide step.
	live func(s recordSnap) bool
	// act is the request's write on a live record (it may write nothing).
	act func(ctx context.Context, o observation) (R, outcome, error)
	// negative is the answer when a fresh read, proven current, is not
	// live.
	negative func(o observation) (R, error)
	// pause: after act lost a race, wait about a commit.
	pause bool
}

// onRecord runs a request about the record at key on the commit loop: act
// when the record read is live; otherwise, on a fresh read proven current
// by prove (a proof that finds the record moved on reads again: stale),
// the negative answer. At most attempts(session) times, starting on the
// view unless fresh.
func onRecord[R any](ctx context.Context, l *engineDeps, key, session string, fresh bool, prove func(context.Context, observation) (outcome, error), s recordSteps[R]) (R, error) {
	return commitLoop(ctx, l, session, fresh, engineSteps[recordSnap, recordPlan, R]{
		read: func(ctx context.Context, fresh bool) (recordSnap, bool, error) {
			o, err := l.current(ctx, key, fresh)
			return recordSnap{observation: o, expired: err == nil && l.tracker.expired(o, time.Now())}, false, err
		},
		decide: func(r recordSnap, fresh bool) verdict[R, recordPlan] {
			switch {
			case s.live(r):
				return verdict[R, recordPlan]{kind: writePlan, plan: recordAct}
			case !fresh:
				return verdict[R, recordPlan]{kind: readAgain}
			}
			return verdict[R, recordPlan]{kind: writePlan, plan: recordProve}
		},
		commit: func(ctx context.Context, r recordSnap, p recordPlan) (R, outcome, error) {
			if p == recordAct {
				return s.act(ctx, r.observation)
			}
			var zero R
			if out, err := prove(ctx, r.observation); out != committed || err != nil {
				return zero, out, err
			}
			resp, err := s.negative(r.observation)
			return resp, committed, err
		},
		pause: s.pause,
	})
}

// guardRefusal is the guard's verdict on grants, a fact of every grant's
// snapshot: errBelowHighWater while the bucket's stream is below the token
// high-water mark (streamGuard), nil otherwise.
func (l *engineDeps) guardRefusal() error {
	if l.guard.below.Load() {
		return errBelowHighWater
	}
	return nil
}

// The engine's clock: the time a snapshot is read at.

// Clock supplies wall-clock time. jetlock uses it only for the times it
// reports (expires_at); every expiry decision runs on the monotonic clock
// reading that time.Now carries, so a skewed wall clock cannot expire a
// lease early. Tests inject a skewed clock.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// The key locks: the commit loop runs under its key's lock.

// keyLocks serialise this instance's work on one key, so that its own
// requests do not race each other's compare-and-set. Instances still race
// each other; compare-and-set decides those races.
//
// The locks are per key, not per stripe of keys: a key's lock exists while
// a request holds or waits for it, and the count of those waiting is the
// key's own. A request waits for its key no longer than its deadline, and
// at most maxWaiting requests wait for one key: beyond them a request is
// refused at once. So a flood on one hot key holds a bounded number of the
// in-flight places, and never refuses or delays a request for another key
// (a renewal of another tenant's lease included).
type keyLocks struct {
	seed       maphash.Seed
	maxWaiting int
	shards     [keyLockShards]keyShard
}

// keyLockShards spreads the map of held keys over several mutexes; a
// shard's mutex is held only to find or drop a key's lock, never while
// waiting for one.
const keyLockShards = 64

type keyShard struct {
	mu   sync.Mutex
	held map[string]*keyLock
	free []*keyLock // unused locks, for reuse
}

// keyLock is the lock of one key while anyone holds or waits for it.
type keyLock struct {
	ch    chan struct{} // holds a token while the key is locked
	key   string
	shard *keyShard
	users int // holder and waiters; guarded by shard.mu
}

// errBusy is returned when too many requests already wait for a key.
var errBusy = errors.New("resource busy")

func newKeyLocks(maxWaiting int) *keyLocks {
	p := &keyLocks{seed: maphash.MakeSeed(), maxWaiting: maxWaiting}
	for i := range p.shards {
		p.shards[i].held = make(map[string]*keyLock)
	}
	return p
}

// lock locks key, waiting until ctx ends. It returns the lock to unlock,
// or an error wrapping errUnavailable: errBusy when maxWaiting requests
// already wait for the key, or ctx's error.
func (p *keyLocks) lock(ctx context.Context, key string) (*keyLock, error) {
	sh := &p.shards[maphash.String(p.seed, key)%keyLockShards]
	sh.mu.Lock()
	kl := sh.held[key]
	if kl == nil {
		if n := len(sh.free); n > 0 {
			kl, sh.free = sh.free[n-1], sh.free[:n-1]
		} else {
			kl = &keyLock{ch: make(chan struct{}, 1), shard: sh}
		}
		kl.key = key
		sh.held[key] = kl
	} else if kl.users > p.maxWaiting { // a holder and maxWaiting waiters
		sh.mu.Unlock()
		return nil, fmt.Errorf("%w: %w: %d requests already wait for it; retry with backoff", errUnavailable, errBusy, p.maxWaiting)
	}
	kl.users++
	sh.mu.Unlock()
	select {
	case kl.ch <- struct{}{}:
		return kl, nil
	default:
	}
	select {
	case kl.ch <- struct{}{}:
		return kl, nil
	case <-ctx.Done():
		kl.drop()
		return nil, fmt.Errorf("%w: waiting for the resource's other requests: %w", errUnavailable, ctx.Err())
	}
}

// unlock unlocks the key.
func (kl *keyLock) unlock() {
	<-kl.ch
	kl.drop()
}

// drop ends one holder's or waiter's use of the lock; the last one's
// frees it for reuse.
func (kl *keyLock) drop() {
	sh := kl.shard
	sh.mu.Lock()
	if kl.users--; kl.users == 0 {
		delete(sh.held, kl.key)
		kl.key = ""
		if len(sh.free) < 64 {
			sh.free = append(sh.free, kl)
		}
	}
	sh.mu.Unlock()
}

// waiting returns the number of requests waiting for key (not the holder).
func (p *keyLocks) waiting(key string) int {
	sh := &p.shards[maphash.String(p.seed, key)%keyLockShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if kl := sh.held[key]; kl != nil {
		return kl.users - 1
	}
	return 0
}

// The name rule, which the read step of every grant applies (claimName):
// a name is one thing at a time, a lock (a lock-set member, an election)
// or a semaphore of one limit, decided in the commit that grants, on any
// number of instances.
//
// A lock, a set member and an election live at the name's lease key, so
// two of them collide on that key's compare-and-set. A semaphore's permits
// live at keys of their own; so every grant of a permit writes, in the
// same atomic batch, the semaphore's name record (streams.AppendNameRecord)
// at the name's lease key, by compare-and-set on the revision read. Then:
//
//   - a lock and a permit granted at once on one name compare-and-set the
//     same key: one commits, the other decides again and finds the name
//     held as the other kind;
//   - two permits of different limits likewise: the second finds the name
//     record of the first's limit;
//   - a permit granted before the name record's revision is found by
//     reading the permits, proven current by checks that commit after that
//     revision; one granted after it has moved the name's key, which fails
//     the compare-and-set of whoever replaces the name record.
//
// A name record stays once the permits end (a semaphore is used again
// with the same limit without a read of every permit). A grant of another
// kind or limit retires it: it proves every permit of its limit free and
// deletes the record by compare-and-set, then decides again. The sweep
// retires the records of semaphores idle for the retry window the same
// way (Service.retireIdle).

// nameOps keeps a name one thing at a time: the name rule in the bucket
// (here) and on the view (sameKind, name_index.go); and the waiter caps
// (caps.go).
type nameOps struct {
	*engineDeps
}

// nameAction is what the name rule asks of a grant (decideName).
type nameAction int

const (
	nameGrant  nameAction = iota // commit over the name's key as read
	nameRefuse                   // the name is held as another kind
	nameRetire                   // retire the name record first, then decide again
)

// decideName is the name rule for a grant of a permit of a semaphore of
// limit (0: a lock, a set member or an election) on a name whose lease key
// holds e: a pure function of what was read. A permit is refused while the
// key holds a lease (or a foreign value); a grant of another kind or limit
// than a name record's must retire it first.
func decideName(e entry, limit int) nameAction {
	switch {
	case limit != 0 && (e.held() || e.foreign):
		return nameRefuse
	case e.sem == limit || e.sem == 0:
		return nameGrant
	}
	return nameRetire
}

// mayRetire reports whether a name record may be retired, given its
// permits as read: none of them is held (nor holds a foreign value).
func mayRetire(permits []entry) bool {
	for _, p := range permits {
		if p.held() || p.foreign {
			return false
		}
	}
	return true
}

// claimName applies the name rule to a grant on name, of a permit of a
// semaphore of limit (0: a lock, a set member or an election), whose lease
// key was observed in o (fresh: read from the stream leader). It returns
// what the grant's commit must find at that key: o itself, or the delete
// that retired a name record. A refusal is an *opError; again asks to
// decide on fresh reads (the view may lag, or the retirement lost a race).
func (l *nameOps) claimName(ctx context.Context, name string, o observation, limit int, fresh bool) (_ observation, again bool, _ error) {
	switch decideName(o.entry, limit) {
	case nameGrant:
		return o, false, nil
	case nameRetire:
		retired, out, err := l.retireName(ctx, name, o, limit, fresh)
		if out == conflicted {
			return o, true, nil
		}
		return retired, false, err
	}
	switch {
	case !fresh && l.following():
		return o, true, nil // the view may lag the lease's end
	case o.foreign:
		return o, false, lockedError(o, origin{})
	}
	return o, false, errKind(name, nameUse{election: o.rec.Value != "", lock: o.rec.Value == ""}, limit)
}

// retireName retires the name record of semaphore name (its limit o.sem)
// for a grant of another kind or limit: if any of its permits is held, the
// grant is refused; otherwise every permit is proven free and the record
// deleted, in commits that check each permit's revision as read (the last
// of them deletes the record by compare-and-set on o's revision). With
// fresh, the permits are read from the stream leader. It reports, as an
// outcome (settled), whether the retirement committed or lost a race
// (the name record or a permit moved on): the caller then reads again.
func (l *nameOps) retireName(ctx context.Context, name string, o observation, limit int, fresh bool) (observation, outcome, error) {
	keys, revs, err := l.freePermits(ctx, name, o, limit, fresh)
	if err == nil {
		o, err = l.deleteName(ctx, name, o, keys, revs)
	}
	return settled(o, err)
}

// freePermits reads the permits of the semaphore name (its limit o.sem),
// each one seen held read again fresh, and returns their keys and the
// revisions read, or refuses the grant of limit while one is held.
func (l *nameOps) freePermits(ctx context.Context, name string, o observation, limit int, fresh bool) (keys []string, revs []uint64, err error) {
	keys = make([]string, o.sem)
	revs = make([]uint64, o.sem)
	for k := 1; k <= o.sem; k++ {
		key := permitKey(name, k)
		p, err := l.current(ctx, key, fresh)
		if err != nil {
			return nil, nil, err
		}
		if !mayRetire([]entry{p.entry}) {
			// Held as this instance knows it: refused only on a read.
			if p, err = l.current(ctx, key, true); err != nil {
				return nil, nil, err
			}
		}
		if !mayRetire([]entry{p.entry}) {
			return nil, nil, errKind(name, nameUse{limit: o.sem}, limit)
		}
		keys[k-1], revs[k-1] = key, p.rev
	}
	return keys, revs, nil
}

// deleteName deletes the name record of name, observed in o, by
// compare-and-set on its revision, in commits that check the permits
// keys at the revisions revs.
func (l *nameOps) deleteName(ctx context.Context, name string, o observation, keys []string, revs []uint64) (observation, error) {
	nameKey := streams.LeaseKey(name)
	seq, err := l.store.prove(ctx, keys, revs, l.store.deleteMsg(nameKey, o.rev, nil))
	if err != nil {
		// The name record or a permit moved on, or a permit's delete
		// marker the view knew has left the bucket: read them again.
		l.tracker.forget(nameKey)
		for _, k := range keys {
			l.tracker.forget(k)
		}
		return o, err
	}
	return l.tracker.observe(nameKey, entry{rev: seq}), nil
}

// errKind refuses a request for name as a semaphore of limit (0: a lock or
// an election) while it is used as u.
func errKind(name string, u nameUse, limit int) *opError {
	asked := "a lock"
	if limit != 0 {
		asked = fmt.Sprintf("a semaphore of limit %d", limit)
	}
	return newOpError(streams.CodeInvalidRequest, "%s is %s, asked for as %s: a name is one thing at a time (a lock, an election, or a semaphore of one limit)", quoteName(name), u, asked)
}

// quoteName quotes a resource name for an answer.
func quoteName(name string) string { return fmt.Sprintf("%q", name) }
