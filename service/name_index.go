package service

import (
	"fmt"
	"strings"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// The name index, the view's side of the name rule (engine.go): the
// tracker indexes, by semaphore name, the limits that its held permits
// carry, so that a semaphore's limit is known from all its permits, whatever their numbers, without reading
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
