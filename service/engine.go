package service

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"
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

// writeAlways is the decide step of a loop that writes on every read (its
// commit decides, by compare-and-set on what was read).
func writeAlways[R any](observation, bool) verdict[R, struct{}] {
	return verdict[R, struct{}]{kind: writePlan}
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
