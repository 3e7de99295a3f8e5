package service

import (
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/btree"

	"github.com/jetlock/jetlock/streams"
)

// tracker keeps, for every lease and waiter key this instance has seen
// written, the last revision it saw and when it first saw it on the
// monotonic clock. That observation is the only basis of expiry: a lease
// expires once its revision has stood unchanged for ttl + grace since
// first seen here, so wall-clock skew between instances cannot expire a
// lease early, and a service restart only makes expiry later.
//
// Its size is bounded by the bucket, not by what callers ask about: a key
// never written is not kept, and a deleted key is forgotten once the retry
// window has passed (its delete marker expires from the bucket then too).
// Due times sit in a min-heap, so each sweep costs in proportion to the
// leases that expire, not to all keys. A key has at most one item there
// that counts (observation.due): a renewal, which only moves a deadline
// later, leaves it in place, and the item is put back at the new deadline
// when it comes up. The heap then holds an item per lease and per lease
// released before its deadline, not one per renewal.
//
// The tracker itself holds the observations, their expiry, the waiter
// queues (tracker.go), and the retry memory (retry_memory.go). What it
// indexes besides is in types of its own, each kept under the tracker's mu
// and reached through its fields: sessionIx (the members of each session:
// session_index.go), setIx (the keys of each lock set: set_index.go),
// nameIx (semaphores by name: name_index.go), instances (the other
// instances and their waiter records: instances.go) and caps (the places
// being written, for the waiter caps: caps.go).
type tracker struct {
	grace, foreignTTL time.Duration

	mu     sync.Mutex
	keys   map[string]observation // by value: no allocation per key
	due    dueHeap
	maxSeq uint64
	// deleted holds the keys whose last write deleted them (with nothing
	// else to remember), apart from keys and in less space: at the design
	// load most of what an instance knows is the retry window's deleted
	// keys. It is keyed by a 64-bit hash of the key (keyID), so that
	// neither it nor gone holds a string. Two keys with one id (a chance
	// of about one in 2^64 for a pair) cost time, never safety: a write of
	// the other key may be taken for stale until it is written or read
	// again, and every decision still commits by compare-and-set. gone
	// lists those deletes, and marks the deletes kept in keys for their end
	// mark, oldest first, to forget after the window.
	deleted map[uint64]deletedKey
	gone    fifo[uint64] // keyIDs
	marks   fifo[markedKey]
	// keysPeak and deletedPeak are the most keys and deleted held since
	// those maps were made (see shrink.go).
	keysPeak, deletedPeak mapPeak

	// held indexes the resources (decoded names) whose lease keys hold a
	// lease, in order, for list. It is brought up to date only when a list
	// needs it: heldChanges holds the lease keys whose lease began (true)
	// or ended (false) since; past maxHeldChanges the changes are dropped
	// and heldStale makes the next list rebuild the index from keys. A
	// lease beginning or ending then costs a map write instead of an
	// ordered insert, and only instances that are asked to list pay for
	// the order.
	held        *btree.BTreeG[string]
	heldChanges map[string]bool
	heldStale   bool
	nHeld       int // leases held, up to date

	// waiters indexes the waiter records by encoded resource and request
	// hash; tenantWaits counts them by tenant, for the caps; nWaiters all
	// of them. tenantLeases counts the leases held by each tenant.
	waiters      map[string]map[string]waiterInfo
	tenantWaits  map[string]int
	tenantLeases map[string]int
	nWaiters     int
	// left is when a waiter last left each queue (monotonic reading).
	left map[string]time.Time

	// The indexes of what it holds, each kept under mu (see their files).
	sessionIx *sessionIndex
	setIx     *setIndex
	nameIx    *nameIndex
	instances *instanceIndex
	caps      *waitCaps

	// announce, if set, is given the election events of each change the
	// tracker takes in (see elections.go), outside its lock.
	announce func([]streams.ElectionEvent)

	// window is the retry window; seed keys the hashes of deleted keys
	// and ended ids; epoch is the origin of the tracker's offsets.
	window time.Duration
	seed   maphash.Seed
	epoch  time.Time
	// retry is the retry memory (retry_memory.go).
	retry *retryMemory
}

// fifo holds what the tracker forgets after the retry window, oldest
// first, each with when it was seen (an offset from the tracker's epoch,
// which also tells it from a later item of the same key or id).
type fifo[T any] []seenAt[T]

type seenAt[T any] struct {
	v  T
	at time.Duration
}

func (q *fifo[T]) push(v T, at time.Duration) { *q = append(*q, seenAt[T]{v: v, at: at}) }

// pop drops the oldest item and hands it to forget.
func (q *fifo[T]) pop(t *tracker, forget func(*tracker, T, time.Duration)) {
	it := (*q)[0]
	(*q)[0] = seenAt[T]{}
	*q = (*q)[1:]
	forget(t, it.v, it.at)
}

// expire pops up to n items seen more than the retry window before since,
// and gives the queue storage of its size when it has shrunk.
func (q *fifo[T]) expire(t *tracker, since time.Duration, n int, forget func(*tracker, T, time.Duration)) {
	for ; n > 0 && len(*q) > 0 && since-(*q)[0].at > t.window; n-- {
		q.pop(t, forget)
	}
	*q = shrinkSlice(*q)
}

// markedKey is a delete kept in keys for its end mark.
type markedKey struct {
	key string
	rev uint64
}

// deletedKey is what the tracker keeps of a deleted key: the revision of
// the delete and when it was seen, as an offset from epoch (monotonic).
type deletedKey struct {
	rev  uint64
	seen time.Duration
}

// waiterInfo is what the tracker knows of one queued waiter.
type waiterInfo struct {
	hash      string
	ticket    uint64
	rev       uint64 // of its record's last write
	owner     string
	tenant    string
	requestID string
	wake      string
	leaseTTL  time.Duration // what its acquire asked for
	maxHold   time.Duration
	session   string // the key hash of its session, if any
	set       string // the hash of its lock set, if it waits for one
	setSize   int
	limit     int    // the limit of the semaphore it waits for, if any
	value     string // its lease's value (elections)
}

type observation struct {
	entry
	seen time.Time // carries a monotonic reading
	// key is the key's name as the tracker keeps it (empty for a deleted
	// key): the observations, due items and index changes of a key share
	// this one copy rather than each request's own.
	key string
	// due is the time of the key's due item (since epoch), no later than
	// its deadline; zero when it has none (not held, or being swept).
	due time.Duration
	// freeUntil is when the free renewal (keepalive) of this revision
	// that is under way has had its whole budget (since epoch), or zero.
	freeUntil time.Duration
}

type dueItem struct {
	at  time.Duration // since the tracker's epoch
	key string
	rev uint64
}

func newTracker(grace, foreignTTL, retryWindow time.Duration) *tracker {
	t := &tracker{grace: grace, foreignTTL: foreignTTL, window: retryWindow, seed: maphash.MakeSeed(), epoch: time.Now()}
	t.sessionIx, t.setIx, t.nameIx = &sessionIndex{t: t}, &setIndex{t: t}, &nameIndex{t: t}
	t.instances, t.caps, t.retry = &instanceIndex{t: t}, &waitCaps{t: t}, &retryMemory{t: t}
	t.resetLocked()
	return t
}

// resetLocked forgets everything; the caller holds t.mu (or owns t).
func (t *tracker) resetLocked() {
	t.keys, t.deleted = make(map[string]observation), make(map[uint64]deletedKey)
	t.due, t.gone, t.marks, t.nameIx.idleSems = nil, nil, nil, nil
	t.retry.ids.reset()
	t.held, t.heldChanges, t.heldStale, t.nHeld = btree.NewOrderedG[string](32), make(map[string]bool), false, 0
	t.waiters = make(map[string]map[string]waiterInfo)
	t.tenantWaits, t.tenantLeases = make(map[string]int), make(map[string]int)
	t.left = make(map[string]time.Time)
	t.caps.pending, t.caps.pendingRes, t.caps.pendingTenant = make(map[string]pendingWait), make(map[string]int), make(map[string]int)
	t.nWaiters = 0
	t.sessionIx.sessions, t.sessionIx.tenantSessions, t.sessionIx.nSessions = make(map[string]*sessionMembers), make(map[string]int), 0
	t.sessionIx.orphans = make(map[string]struct{})
	t.setIx.setLeases = make(map[string]map[string]struct{})
	t.nameIx.sems = make(map[string]map[int]int)
	t.instances.heardAt, t.instances.instWaits = make(map[string]time.Duration), make(map[string]*instanceWaits)
}

// reset forgets every observation, keeping the highest revision seen: after
// the stream went back behind the service's back, nothing known holds.
func (t *tracker) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resetLocked()
}

// observe records e for key if it is newer than what is known, and returns
// the observation now current. A key never written (revision 0) is not
// kept.
func (t *tracker) observe(key string, e entry) observation {
	var evs []streams.ElectionEvent
	o := t.observeLocked(key, e, &evs)
	if len(evs) > 0 && t.announce != nil {
		t.announce(evs)
	}
	return o
}

// observeLocked is observe; it adds to evs the election events of the
// change. It takes t.mu.
func (t *tracker) observeLocked(key string, e entry, evs *[]streams.ElectionEvent) observation {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.rev > t.maxSeq {
		t.maxSeq = e.rev
	}
	o, known := t.lookup(key)
	if known && o.rev >= e.rev {
		return o
	}
	if e.rev == 0 {
		return observation{entry: e, seen: now}
	}
	if o.held() && o.rec.LeaseID != "" && (!e.held() || e.rec.RequestID != o.rec.RequestID || e.rec.Tenant != o.rec.Tenant) {
		t.retry.note(key, o.rec.RequestID, o.rec.Tenant, now)
		if e.end != nil && e.end.RequestID == o.rec.RequestID && e.end.Tenant == o.rec.Tenant {
			// The ended ids answer a retry of that request for the
			// window (retry memory); the mark need not be kept as well.
			e.end = nil
		}
	}
	wasHeld, due, wasRev := o.held(), o.due, o.rev
	var wasTenant string
	var wasRec *streams.Record
	if wasHeld {
		wasTenant, wasRec = o.rec.Tenant, o.rec
	}
	if o.key != "" {
		key = o.key
	}
	o = observation{entry: e, seen: now, key: key}
	t.place(&o, due, now)
	t.reindex(key, e, wasHeld, wasTenant, wasRec, wasRev, now, evs)
	t.forgetGone(now, 16)
	return o
}

// place stores the new observation o of a key (whose previous expiry was
// due) among the live keys, or records the key as deleted. The caller
// holds t.mu.
func (t *tracker) place(o *observation, due time.Duration, now time.Time) {
	key, e := o.key, o.entry
	at := now.Sub(t.epoch)
	id := t.keyID(key)
	switch {
	case e.held() || e.foreign:
		t.schedule(o, due)
		t.keys[key] = *o
		delete(t.deleted, id)
	case e.sem != 0:
		t.keys[key] = *o // a semaphore's name record (the name rule, engine.go)
		delete(t.deleted, id)
		t.nameIx.noteNameRecord(key, at)
	case e.end != nil:
		t.keys[key] = *o
		delete(t.deleted, id)
		t.marks.push(markedKey{key: key, rev: e.rev}, at)
	default:
		t.deleted[id] = deletedKey{rev: e.rev, seen: at}
		t.deletedPeak.note(len(t.deleted))
		delete(t.keys, key)
		t.gone.push(id, at)
	}
	t.keysPeak.note(len(t.keys))
}

// reindex updates the indexes that follow a key's change from its previous
// state (wasHeld by wasTenant as wasRec at revision wasRev) to e, and puts
// the election events it causes in evs. The caller holds t.mu.
func (t *tracker) reindex(key string, e entry, wasHeld bool, wasTenant string, wasRec *streams.Record, wasRev uint64, now time.Time, evs *[]streams.ElectionEvent) {
	switch {
	case isSessionKey(key):
		t.sessionIx.sessionChanged(key, wasHeld, wasTenant, e, now)
	case strings.HasPrefix(key, streams.WaitKeyPrefix):
		t.indexWaiter(key, e)
		t.sessionIx.indexSessionMember(key, wasRec, e.rec)
	default:
		if wasHeld != e.held() {
			// The list index changes only when a lease begins or ends,
			// not with each renewal.
			t.indexLease(key, e.held())
		}
		t.countTenantLease(wasHeld, wasTenant, e)
		t.sessionIx.indexSessionMember(key, wasRec, e.rec)
		t.setIx.indexSetMember(key, wasRec, e.rec)
		t.nameIx.indexPermit(key, wasRec, e.rec)
		*evs = electionEvents(key, wasRec, wasRev, e)
	}
}

// countTenantLease moves a lease key's count from the tenant that held it
// (if wasHeld) to the tenant of e (if held). The caller holds t.mu.
func (t *tracker) countTenantLease(wasHeld bool, wasTenant string, e entry) {
	if wasHeld && e.held() && e.rec.Tenant == wasTenant {
		return // a renewal
	}
	if wasHeld {
		if t.tenantLeases[wasTenant]--; t.tenantLeases[wasTenant] <= 0 {
			delete(t.tenantLeases, wasTenant)
		}
	}
	if e.held() {
		t.tenantLeases[e.rec.Tenant]++
	}
}

// schedule gives o, held or foreign, its due item: the key's item due at
// due, if it has one no later than o's deadline (popDue puts it back at
// the deadline when it comes up), or a new one. The caller holds t.mu.
func (t *tracker) schedule(o *observation, due time.Duration) {
	d := t.deadlineLocked(o).Sub(t.epoch)
	if due != 0 && due <= d {
		o.due = due
		return
	}
	o.due = d
	t.due.push(dueItem{at: d, key: o.key, rev: o.rev})
}

// forgetGone drops up to n observations of keys deleted longer than the
// retry window ago, and as many kept for their end mark. The caller holds
// t.mu.
func (t *tracker) forgetGone(now time.Time, n int) {
	since := now.Sub(t.epoch)
	t.gone.expire(t, since, n, (*tracker).forgetDeleted)
	t.marks.expire(t, since, n, (*tracker).forgetMarked)
}

// forgetDeleted forgets the delete of key id seen at, unless the key was
// written since.
func (t *tracker) forgetDeleted(id uint64, at time.Duration) {
	if d, ok := t.deleted[id]; ok && d.seen == at {
		delete(t.deleted, id)
	}
}

// forgetMarked forgets a delete kept for its end mark, unless the key was
// written since.
func (t *tracker) forgetMarked(m markedKey, _ time.Duration) {
	if o, ok := t.keys[m.key]; ok && o.rev == m.rev {
		delete(t.keys, m.key)
	}
}

// keyID is the id under which a deleted key is kept.
func (t *tracker) keyID(key string) uint64 {
	return maphash.String(t.seed, key)
}

// deadline is when o is due to be swept: a lease after its TTL plus
// grace, a foreign value after the longest TTL plus grace, and a lease or
// waiter of a session that has ended soon after the session's end (see
// sessionTakeover).
func (t *tracker) deadline(o *observation) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.deadlineLocked(o)
}

// ownDeadline is when o expires by observation of its own key: after its
// TTL plus grace (a foreign value: the longest TTL plus grace).
//
// A lease of a session has no TTL of its own: it lives as long as its
// session does, up to its hold limit. Its record's ttl_ms (at most a
// record's longest) is only what makes the record valid, so its own
// deadline is its hold limit plus grace, counted from when it was seen by
// the time the record had left to its hold limit when written (both times
// written by one instance: no skew enters), or none.
func (t *tracker) ownDeadline(o *observation) time.Time {
	ttl := t.foreignTTL
	if o.rec != nil {
		ttl = time.Duration(o.rec.TTLms) * time.Millisecond
		if o.rec.Session != "" && strings.HasPrefix(o.key, streams.LeaseKeyPrefix) {
			ttl = sessionLeaseHold(o.rec)
		}
	}
	return o.seen.Add(ttl + t.grace)
}

// noHold is how long a lease of a session without a hold limit may stand,
// as the tracker counts: for ever, in practice.
const noHold = 100 * 365 * 24 * time.Hour

// sessionLeaseHold is how long the lease of a session rec may stand from
// its last write: until its hold limit, or for ever.
func sessionLeaseHold(rec *streams.Record) time.Duration {
	until := holdUntil(rec)
	if until.IsZero() {
		return noHold
	}
	written, err := streams.ParseTime(rec.RenewedAt)
	if err != nil {
		return time.Duration(rec.TTLms) * time.Millisecond
	}
	return max(until.Sub(written), time.Duration(rec.TTLms)*time.Millisecond)
}

// deadlineLocked is deadline; the caller holds t.mu.
func (t *tracker) deadlineLocked(o *observation) time.Time {
	d := t.ownDeadline(o)
	if id := t.instances.instanceDeadlineLocked(o); !id.IsZero() && id.Before(d) {
		d = id
	}
	if t.sessionIx.orphanedLocked(o.rec) {
		return o.seen
	}
	if o.rec != nil && o.rec.Session != "" {
		if end, ended := t.sessionIx.sessionEndedLocked(o.rec.Session); ended && end.Add(sessionTakeover).Before(d) {
			d = end.Add(sessionTakeover)
		}
	}
	return d
}

// maxHeldChanges bounds the list index changes kept between lists, for an
// index of n leases: beyond it, rebuilding the index costs less than
// applying them.
func maxHeldChanges(n int) int { return max(1024, n) }

// indexLease notes, for the list index and the count of leases, that the
// lease of key began (held) or ended. The caller holds t.mu.
func (t *tracker) indexLease(key string, held bool) {
	if held {
		t.nHeld++
	} else {
		t.nHeld--
	}
	if t.heldStale {
		return
	}
	t.heldChanges[key] = held
	if len(t.heldChanges) > maxHeldChanges(t.nHeld) {
		// A new map: clear would keep the memory of this one while no
		// list comes to use it.
		t.heldChanges = make(map[string]bool)
		t.heldStale = true
	}
}

// refreshHeld brings the list index up to date. The caller holds t.mu.
func (t *tracker) refreshHeld() {
	if t.heldStale {
		var held []string
		for key, o := range t.keys {
			if o.held() && strings.HasPrefix(key, streams.LeaseKeyPrefix) {
				held = append(held, decodedResource(resourceOf(key)))
			}
		}
		slices.Sort(held)
		t.held.Clear(false)
		for _, res := range held {
			t.held.ReplaceOrInsert(res)
		}
		t.heldStale = false
		return
	}
	for key, held := range t.heldChanges {
		if res := decodedResource(resourceOf(key)); held {
			t.held.ReplaceOrInsert(res)
		} else {
			t.held.Delete(res)
		}
	}
	clear(t.heldChanges)
}

// indexWaiter updates the waiter index with the newest entry of a waiter
// key. The caller holds t.mu.
func (t *tracker) indexWaiter(key string, e entry) {
	enc, hash, ok := strings.Cut(key[len(streams.WaitKeyPrefix):], ".")
	if !ok {
		return
	}
	q := t.waiters[enc]
	old, had := q[hash]
	var wake string
	if e.held() {
		wake = e.rec.Wake
	}
	if old.wake != wake {
		t.instances.indexInstanceWait(key, old.wake, wake)
	}
	if had {
		delete(q, hash)
		t.nWaiters--
		if t.tenantWaits[old.tenant]--; t.tenantWaits[old.tenant] <= 0 {
			delete(t.tenantWaits, old.tenant)
		}
	}
	if !e.held() {
		if len(q) == 0 {
			delete(t.waiters, enc)
			delete(t.left, enc)
		} else if had {
			t.left[enc] = time.Now()
		}
		return
	}
	if q == nil {
		q = make(map[string]waiterInfo)
		t.waiters[enc] = q
	}
	t.caps.unpendLocked(key) // counted as a record now
	q[hash] = waiterInfo{hash: hash, ticket: e.rec.TokenAt(e.rev), rev: e.rev, owner: e.rec.Owner, tenant: e.rec.Tenant, requestID: e.rec.RequestID,
		wake: e.rec.Wake, leaseTTL: time.Duration(e.rec.LeaseTTLms) * time.Millisecond, maxHold: time.Duration(e.rec.MaxHoldMs) * time.Millisecond,
		session: e.rec.Session, set: e.rec.Set, setSize: e.rec.SetSize, limit: e.rec.Limit, value: e.rec.Value}
	t.nWaiters++
	t.tenantWaits[e.rec.Tenant]++
}

// head returns the waiter with the smallest ticket on the encoded
// resource, skipping the requests whose hashes are in skip.
func (t *tracker) head(enc string, skip ...string) (waiterInfo, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var best waiterInfo
	found := false
next:
	for _, w := range t.waiters[enc] {
		for _, h := range skip {
			if w.hash == h {
				continue next
			}
		}
		if !found || w.ticket < best.ticket {
			best, found = w, true
		}
	}
	return best, found
}

// ahead returns the number of waiters on the encoded resource with a
// smaller ticket than the waiter hash (all of them if hash is not queued
// there), how many of those wait for lock sets, and when a waiter last
// left that queue.
func (t *tracker) ahead(enc, hash string) (n, sets int, left time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.waiters[enc]
	mine, queued := q[hash]
	for _, w := range q {
		if !queued || w.ticket < mine.ticket {
			n++
			if w.set != "" {
				sets++
			}
		}
	}
	return n, sets, t.left[enc]
}

// claim reports whether request hash may take the free (or expired)
// resource observed in o, reserved for waiters for reservation each. The
// waiter k places behind the head may claim once the resource has been
// free, with no waiter leaving the queue, for k reservation periods: the
// head claims at once, a dead head delays the next by one period, and
// skips keep ticket order too. A request that is not queued counts as
// behind every waiter. It also returns the number of waiters ahead of
// hash.
//
// A waiter for a lock set holds its place at the head of a free resource
// while the other resources of its set are still held: it is not skipped
// while its record lives (its instance refreshes it), or the sets would
// starve behind single waiters. Its record leaves the queue when its
// instance dies, and the waiters behind it claim then.
func (t *tracker) claim(enc, hash string, o observation, reservation time.Duration) claim {
	ahead, sets, left := t.ahead(enc, hash)
	if ahead == 0 {
		return claim{ok: true}
	}
	if sets > 0 {
		return claim{ahead: ahead}
	}
	since := o.seen
	if o.held() || o.foreign {
		since = t.deadline(&o)
	}
	if left.After(since) {
		since = left
	}
	return claim{ok: time.Since(since) > time.Duration(ahead)*reservation, ahead: ahead}
}

// waiterCounts returns the number of waiters on the encoded resource and
// of waiters of tenant.
func (t *tracker) waiterCounts(enc, tenant string) (onResource, ofTenant int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.waiters[enc]), t.tenantWaits[tenant]
}

// tenantLeaseCount returns the number of leases held by tenant.
func (t *tracker) tenantLeaseCount(tenant string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tenantLeases[tenant]
}

// counts returns the number of held leases and of waiters known.
func (t *tracker) counts() (leases, waiters int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.nHeld, t.nWaiters
}

// listed is one lease of a list page.
type listed struct {
	resource string
	o        observation
	waiters  int
}

// list returns up to limit held leases whose resource starts with prefix
// and sorts after after, in resource order, and whether more follow.
func (t *tracker) list(prefix, after string, limit int) ([]listed, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.refreshHeld()
	from := max(prefix, after)
	var out []listed
	more := false
	t.held.AscendGreaterOrEqual(from, func(res string) bool {
		if !strings.HasPrefix(res, prefix) {
			return false
		}
		if res == after && after != "" {
			return true
		}
		if len(out) == limit {
			more = true
			return false
		}
		enc := streams.EncodeResource(res)
		if o := t.keys[streams.LeaseKeyPrefix+enc]; o.held() {
			out = append(out, listed{resource: res, o: o, waiters: len(t.waiters[enc])})
		}
		return true
	})
	return out, more
}

// maxRev returns the highest revision observed.
func (t *tracker) maxRev() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.maxSeq
}

// get returns the current observation of key.
func (t *tracker) get(key string) (observation, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lookup(key)
}

// lookup returns what is known of key, deleted or not. The caller holds
// t.mu.
func (t *tracker) lookup(key string) (observation, bool) {
	if o, ok := t.keys[key]; ok {
		return o, true
	}
	if d, ok := t.deleted[t.keyID(key)]; ok {
		return observation{entry: entry{rev: d.rev}, seen: t.epoch.Add(d.seen)}, true
	}
	return observation{}, false
}

// vanished takes in a read from the stream leader that found nothing
// stored at key, and returns what is now known of it. A delete marker
// lives for the retry window only (Nats-TTL); the tracker forgets it on
// its own clock, a little after the bucket drops it, and may learn it
// again meanwhile from a read or a late watcher delivery. Kept, that
// marker's revision would fail every compare-and-set on the key (which
// expects its last revision, now none) until forgotten. A lease, waiter,
// name record or foreign value cannot vanish from the bucket (only the stream's
// recreation takes them, which the stream guard handles): it stays.
func (t *tracker) vanished(key string) observation {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o, known := t.lookup(key); known && (o.held() || o.foreign || o.sem != 0) {
		return o
	}
	delete(t.deleted, t.keyID(key))
	delete(t.keys, key)
	return observation{seen: time.Now()}
}

// forget drops what is known of key, after a write whose outcome is unknown.
func (t *tracker) forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.deleted, t.keyID(key))
	if o, ok := t.keys[key]; ok {
		switch {
		case isSessionKey(key):
			if o.held() {
				// Not an end: the outcome of a write is unknown.
				if t.sessionIx.tenantSessions[o.rec.Tenant]--; t.sessionIx.tenantSessions[o.rec.Tenant] <= 0 {
					delete(t.sessionIx.tenantSessions, o.rec.Tenant)
				}
				t.sessionIx.nSessions--
			}
		case strings.HasPrefix(key, streams.WaitKeyPrefix):
			t.indexWaiter(key, entry{})
			t.sessionIx.indexSessionMember(key, o.rec, nil)
		case o.held():
			t.indexLease(key, false)
			t.countTenantLease(true, o.rec.Tenant, entry{})
			t.sessionIx.indexSessionMember(key, o.rec, nil)
			t.setIx.indexSetMember(key, o.rec, nil)
			t.nameIx.indexPermit(key, o.rec, nil)
		}
		delete(t.keys, key)
	}
}

// expired reports whether o, the current observation of its key, has passed
// its TTL plus grace at now (a foreign value: the longest TTL plus grace),
// or belongs to a session the tracker knows to have ended: a session's
// lease is valid only while its session is.
func (t *tracker) expired(o observation, now time.Time) bool {
	if !o.held() && !o.foreign {
		return false
	}
	return !now.Before(t.ownDeadline(&o)) || t.sessionIx.sessionLeaseEnded(o.rec) || t.instanceGone(&o, now)
}

// instanceGone reports whether o is a waiter record whose instance has
// gone silent (see instances.go).
func (t *tracker) instanceGone(o *observation, now time.Time) bool {
	if o.rec == nil || o.rec.Wake == "" {
		return false // not a waiter: no lock taken on the paths that ask of leases
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.instances.instanceDeadlineLocked(o)
	return !d.IsZero() && !now.Before(d)
}

// popDue removes and returns the items of keys, held or foreign, that
// have passed their deadline at now, each with the key's current
// revision. An item of a key written since it was scheduled goes back at
// the key's new deadline; an item that is no longer its key's is dropped.
// The sweep owns what it is given until it writes the key or calls
// retryAt.
func (t *tracker) popDue(now time.Time, limit int) []dueItem {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forgetGone(now, limit)
	t.retry.forget(now, limit)
	t.instances.instancesDue(now)
	t.shrink()
	var out []dueItem
	for since := now.Sub(t.epoch); len(t.due) > 0 && len(out) < limit && t.due[0].at <= since; {
		it := t.due.pop()
		o, ok := t.keys[it.key]
		if !ok || o.due != it.at || !(o.held() || o.foreign) {
			continue
		}
		if d := t.deadlineLocked(&o).Sub(t.epoch); d > since {
			o.due, it.at = d, d
			t.due.push(it)
		} else {
			o.due, it.rev = 0, o.rev
			out = append(out, it)
		}
		t.keys[it.key] = o
	}
	return out
}

// shrink makes anew what a churn of names grew and has shrunk since (see
// shrink.go): the maps of keys, and the due heap, whose items of keys
// ended before their deadline stay until it comes, so that it is rebuilt
// from the items that count once those are under half of it. The caller
// holds t.mu.
func (t *tracker) shrink() {
	t.keys = shrinkMap(t.keys, &t.keysPeak)
	t.deleted = shrinkMap(t.deleted, &t.deletedPeak)
	if len(t.due) >= minShrink && len(t.due) > 2*len(t.keys) {
		live := make(dueHeap, 0, len(t.keys))
		for _, it := range t.due {
			if o, ok := t.keys[it.key]; ok && o.due == it.at {
				live.push(it)
			}
		}
		t.due = live
	}
	t.due = shrinkSlice(t.due)
}

// takeFree reports whether a free renewal (or keepalive) of keys, as
// observed at revs, may start at now, and if so marks it under way on each
// key until now plus budget (a request's whole time, receipt to answer):
// one free renewal of a revision at a time, so that requests sent at once
// do not all pass as the one the lease needs. Once it has committed, the
// key's next revision has no mark; one that did not commit frees the mark
// when its budget has passed, for its retry.
func (t *tracker) takeFree(keys []string, revs []uint64, now time.Time, budget time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	at := now.Sub(t.epoch)
	for i, key := range keys {
		if o, ok := t.keys[key]; !ok || o.rev != revs[i] || o.freeUntil > at {
			return false
		}
	}
	for _, key := range keys {
		o := t.keys[key]
		o.freeUntil = at + budget
		t.keys[key] = o
	}
	return true
}

// retryAt puts an item the sweep was given back, to be tried again at,
// unless its key was written (and so scheduled) since.
func (t *tracker) retryAt(it dueItem, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o, ok := t.keys[it.key]; ok && o.rev == it.rev && o.due == 0 {
		o.due, it.at = at.Sub(t.epoch), at.Sub(t.epoch)
		t.keys[it.key] = o
		t.due.push(it)
	}
}

// dueHeap is a min-heap of due items by time. Its own push and pop, rather
// than container/heap's, keep an item from being boxed into an interface
// (an allocation on every write the tracker observes).
type dueHeap []dueItem

func (h *dueHeap) push(it dueItem) {
	*h = append(*h, it)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if q[i].at >= q[p].at {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *dueHeap) pop() dueItem {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q[n] = dueItem{}
	q = q[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && q[l].at < q[m].at {
			m = l
		}
		if r := l + 1; r < n && q[r].at < q[m].at {
			m = r
		}
		if m == i {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}

// longestQueues returns the n resources (decoded names) with the most
// waiters, most first.
func (t *tracker) longestQueues(n int) []ranked {
	t.mu.Lock()
	counts := make(map[string]int64, len(t.waiters))
	for enc, q := range t.waiters {
		counts[decodedResource(enc)] = int64(len(q))
	}
	t.mu.Unlock()
	return topOf(counts, n)
}
