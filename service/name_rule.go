package service

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// The name rule: a name is one thing at a time, a lock (a lock-set member,
// an election) or a semaphore of one limit, decided in the commit that
// grants, on any number of instances.
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

// nameOps keeps a name one thing at a time (the name rule, in the bucket
// and on the view) and the waiter caps (caps.go).
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

// maxChecks bounds the messages of one atomic batch of checks: well under
// JetStream's largest atomic batch (1,000 messages by default).
const maxChecks = 500

// nameMsg is the write of the name record of semaphore name of limit, by
// compare-and-set on expect, for the atomic batch of a permit's grant.
func (s *store) nameMsg(name string, limit int, expect uint64) *batchMsg {
	return s.putMsg(streams.LeaseKey(name), streams.AppendNameRecord(nil, limit), expect, "")
}

// prove proves that each of keys is still at its revision in revs, by
// atomic batches of checks that commit only if it is (checkMsg), and
// writes then, if not nil, in the last of them; so then commits only if
// every key is still at its revision. It returns the last batch's
// revision. Each batch commits after every read it proves: a key proven
// at its revision by an earlier batch was there when that batch
// committed.
func (s *store) prove(ctx context.Context, keys []string, revs []uint64, then *batchMsg) (uint64, error) {
	var seq uint64
	for len(keys) > 0 || then != nil {
		n := min(len(keys), maxChecks)
		msgs := make([]*batchMsg, n, n+1)
		for i := range n {
			msgs[i] = &batchMsg{Msg: s.checkMsg(keys[i], revs[i])}
		}
		keys, revs = keys[n:], revs[n:]
		if len(keys) == 0 && then != nil {
			msgs, then = append(msgs, then), nil
		}
		var err error
		if seq, err = s.batch(ctx, "confirm", msgs); err != nil {
			return 0, err
		}
	}
	return seq, nil
}

// The view's side of the rule: the tracker indexes, by semaphore name,
// the limits that its held permits carry, so that a semaphore's limit is
// known from all its permits, whatever their numbers, without reading
// each. With it, a request that asks for a name as another kind than the
// name is held or waited on as, as this instance knows it, is refused
// before any write (sameKind); a name waited on keeps its kind for its
// waiters, which the bucket's records do not show; and the name records of
// idle semaphores are found for retirement.

// nameIndex is what the tracker knows of semaphores by name: the limits
// their held permits carry, and which of them are idle.
type nameIndex struct {
	// t is the tracker whose mu guards the index.
	t *tracker
	// sems counts the held permits of each semaphore by the limit they
	// carry.
	sems map[string]map[int]int
	// idleSems lists the semaphores whose last permit this instance saw
	// end (or whose name record it saw with none held), oldest first: once
	// idle for the retry window, their name records are retired
	// (Service.retireIdle), so the bucket and this view keep a record only
	// for the names used lately.
	idleSems fifo[string]
}

// indexPermit moves the count of a permit key from the limit of old (if
// held) to that of rec (if held). The caller holds t.mu.
func (ix *nameIndex) indexPermit(key string, old, rec *streams.Record) {
	enc := resourceOf(key)
	if !strings.Contains(enc, "=23") { // '#': only permits have one
		return
	}
	sem, _, ok := streams.SplitPermit(decodedResource(enc))
	if !ok {
		return
	}
	from, to := 0, 0
	if old != nil {
		from = old.Limit
	}
	if rec != nil {
		to = rec.Limit
	}
	if from == to {
		return
	}
	m := ix.sems[sem]
	if from != 0 && m != nil {
		if m[from]--; m[from] <= 0 {
			delete(m, from)
		}
		if len(m) == 0 && to == 0 {
			delete(ix.sems, sem)
			ix.idleSems.push(sem, time.Since(ix.t.epoch))
		}
	}
	if to != 0 {
		if m = ix.sems[sem]; m == nil {
			m = make(map[int]int, 1)
			ix.sems[sem] = m
		}
		m[to]++
	}
}

// permitLimit returns the limit the held permits of semaphore sem carry,
// as this instance knows them (the one most of them carry, should two
// ever disagree), or 0 when none is held.
func (ix *nameIndex) permitLimit(sem string) int {
	ix.t.mu.Lock()
	defer ix.t.mu.Unlock()
	best, n := 0, 0
	for limit, count := range ix.sems[sem] {
		if count > n || count == n && limit < best {
			best, n = limit, count
		}
	}
	return best
}

// semaphoreLimit returns the limit of semaphore sem as this instance
// knows it: that of its held permits, else that of its waiters, else 0.
func (l *nameOps) semaphoreLimit(sem string) int {
	if n := l.tracker.nameIx.permitLimit(sem); n != 0 {
		return n
	}
	if w, ok := l.tracker.head(streams.EncodeResource(streams.PermitQueue(sem))); ok {
		return w.limit
	}
	return 0
}

// nameUse is what a name is used as while it is held or waited on.
type nameUse struct {
	lock, election bool // its lease key held, or waited on, without or with a value
	limit          int  // a semaphore's: its permits held or its queue waited on
}

// useOf returns what name is used as, as this instance knows it.
func (l *nameOps) useOf(name string) nameUse {
	var u nameUse
	if o, ok := l.tracker.get(streams.LeaseKey(name)); ok && o.held() {
		u.election, u.lock = o.rec.Value != "", o.rec.Value == ""
	} else if w, ok := l.tracker.head(streams.EncodeResource(name)); ok {
		u.election, u.lock = w.value != "", w.value == ""
	}
	u.limit = l.semaphoreLimit(name)
	return u
}

// String names what u is, for an answer that refuses another use.
func (u nameUse) String() string {
	switch {
	case u.limit != 0:
		return fmt.Sprintf("a semaphore of limit %d", u.limit)
	case u.election:
		return "an election"
	case u.lock:
		return "a lock"
	}
	return "free"
}

// sameKind refuses a request that asks for name as another kind than it
// is used as: a lock (election: with a value) or a semaphore of limit
// limit. A name nobody holds or waits on may become anything.
func (l *nameOps) sameKind(name string, k kind, limit int, value string) error {
	u := l.useOf(name)
	var clash bool
	switch k {
	case kindSemaphore:
		clash = u.lock || u.election || (u.limit != 0 && u.limit != limit)
	default:
		clash = u.limit != 0 || (value != "" && u.lock) || (value == "" && u.election)
	}
	if !clash {
		return nil
	}
	return newOpError(streams.CodeInvalidRequest, "%s is %s: a name is one thing at a time (a lock, an election, or a semaphore of one limit)", quoteName(name), u)
}

// quoteName quotes a resource name for an answer.
func quoteName(name string) string { return fmt.Sprintf("%q", name) }

// noteNameRecord lists semaphore name's name record, seen at key, as idle
// when none of its permits is held as this instance knows it (a record
// learnt from the bucket, not just written with a permit). The caller
// holds t.mu.
func (ix *nameIndex) noteNameRecord(key string, at time.Duration) {
	name := decodedResource(resourceOf(key))
	if len(ix.sems[name]) == 0 {
		ix.idleSems.push(name, at)
	}
}

// idleSemaphores pops up to n of the semaphores listed idle more than the
// retry window before now.
func (ix *nameIndex) idleSemaphores(now time.Time, n int) []string {
	ix.t.mu.Lock()
	defer ix.t.mu.Unlock()
	var out []string
	ix.idleSems.expire(ix.t, now.Sub(ix.t.epoch), n, func(_ *tracker, sem string, _ time.Duration) { out = append(out, sem) })
	return out
}
