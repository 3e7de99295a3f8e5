package service

import (
	"strings"
	"sync"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// tracker keeps, for every lease key this instance has seen, the last
// revision it saw and when it first saw it on the monotonic clock. That
// observation is the only basis of expiry: a lease expires once its
// revision has stood unchanged for ttl + grace since first seen here, so
// wall-clock skew between instances cannot expire a lease early, and a
// service restart only makes expiry later.
//
// Due times sit in a min-heap, so each sweep costs in proportion to the
// leases that expire, not to all keys.
type tracker struct {
	grace time.Duration

	mu     sync.Mutex
	keys   map[string]*observation
	due    dueHeap
	maxSeq uint64

	// waiters indexes the waiter records by encoded resource and request
	// hash; owners counts them by owner, for the caps.
	waiters map[string]map[string]waiterInfo
	owners  map[string]int
	// left is when a waiter last left each queue (monotonic reading).
	left map[string]time.Time

	// ended remembers, for the retry window, the request ids whose leases
	// ended (keyed by lease key and request id), so that a retry is
	// answered lease_lost even when JetStream has forgotten the grant's
	// message id: it rebuilds its duplicate table after a restart only from
	// the messages still stored (nats-server issue 3272), and a released
	// or renewed grant is no longer stored.
	window time.Duration
	ended  map[string]time.Time
	endedQ []endedItem
}

type endedItem struct {
	id string
	at time.Time
}

// waiterInfo is what the tracker knows of one queued waiter.
type waiterInfo struct {
	hash      string
	ticket    uint64
	owner     string
	requestID string
	wake      string
}

type observation struct {
	entry
	seen time.Time // carries a monotonic reading
}

type dueItem struct {
	at  time.Time
	key string
	rev uint64
}

func newTracker(grace, retryWindow time.Duration) *tracker {
	return &tracker{grace: grace, keys: make(map[string]*observation),
		waiters: make(map[string]map[string]waiterInfo), owners: make(map[string]int), left: make(map[string]time.Time),
		window: retryWindow, ended: make(map[string]time.Time)}
}

// observe records e for key if it is newer than what is known, and returns
// the observation now current.
func (t *tracker) observe(key string, e entry) observation {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.rev > t.maxSeq {
		t.maxSeq = e.rev
	}
	o := t.keys[key]
	if o != nil && o.rev >= e.rev {
		return *o
	}
	if o != nil && o.held() && o.rec.LeaseID != "" && (!e.held() || e.rec.RequestID != o.rec.RequestID) {
		t.noteEnded(key, o.rec.RequestID)
	}
	if o == nil {
		o = new(observation)
		t.keys[key] = o
	}
	// In place: every use of an observation's pointer holds t.mu, and
	// callers get copies.
	*o = observation{entry: e, seen: time.Now()}
	if strings.HasPrefix(key, streams.WaitKeyPrefix) {
		t.indexWaiter(key, e)
	}
	if e.held() {
		t.due.push(dueItem{at: t.deadline(o), key: key, rev: e.rev})
	}
	return *o
}

// noteEnded records that the lease of requestID at key ended, and forgets
// what is older than the retry window. The caller holds t.mu.
func (t *tracker) noteEnded(key, requestID string) {
	now := time.Now()
	id := key + "\x00" + requestID
	t.ended[id] = now
	t.endedQ = append(t.endedQ, endedItem{id: id, at: now})
	for len(t.endedQ) > 0 && now.Sub(t.endedQ[0].at) > t.window {
		if t.ended[t.endedQ[0].id] == t.endedQ[0].at {
			delete(t.ended, t.endedQ[0].id)
		}
		t.endedQ = t.endedQ[1:]
	}
}

// hasEnded reports whether the lease of requestID at key ended within the
// retry window.
func (t *tracker) hasEnded(key, requestID string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.ended[key+"\x00"+requestID]
	return ok && time.Since(at) <= t.window
}

func (t *tracker) deadline(o *observation) time.Time {
	return o.seen.Add(time.Duration(o.rec.TTLms)*time.Millisecond + t.grace)
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
	if had {
		delete(q, hash)
		if old.owner != "" {
			if t.owners[old.owner]--; t.owners[old.owner] <= 0 {
				delete(t.owners, old.owner)
			}
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
	q[hash] = waiterInfo{hash: hash, ticket: e.rec.TokenAt(e.rev), owner: e.rec.Owner, requestID: e.rec.RequestID, wake: e.rec.Wake}
	if e.rec.Owner != "" {
		t.owners[e.rec.Owner]++
	}
}

// head returns the waiter with the smallest ticket on the encoded
// resource, skipping the request named skip (the current holder's).
func (t *tracker) head(enc, skip string) (waiterInfo, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var best waiterInfo
	found := false
	for _, w := range t.waiters[enc] {
		if w.requestID == skip && skip != "" {
			continue
		}
		if !found || w.ticket < best.ticket {
			best, found = w, true
		}
	}
	return best, found
}

// ahead returns the number of waiters on the encoded resource with a
// smaller ticket than the waiter hash, or all of them if hash is not
// queued there, and when a waiter last left that queue.
func (t *tracker) ahead(enc, hash string) (n int, left time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.waiters[enc]
	mine, queued := q[hash]
	if !queued {
		return len(q), t.left[enc]
	}
	for _, w := range q {
		if w.ticket < mine.ticket {
			n++
		}
	}
	return n, t.left[enc]
}

// waiterCounts returns the number of waiters on the encoded resource and
// of waiters with owner.
func (t *tracker) waiterCounts(enc, owner string) (onResource, ofOwner int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	onResource = len(t.waiters[enc])
	if owner != "" {
		ofOwner = t.owners[owner]
	}
	return onResource, ofOwner
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
	o := t.keys[key]
	if o == nil {
		return observation{}, false
	}
	return *o, true
}

// forget drops what is known of key, after a write whose outcome is unknown.
func (t *tracker) forget(key string) {
	t.mu.Lock()
	delete(t.keys, key)
	t.mu.Unlock()
}

// expired reports whether o, the current observation of its key, has passed
// its TTL plus grace at now.
func (t *tracker) expired(o observation, now time.Time) bool {
	return o.held() && !now.Before(t.deadline(&o))
}

// popDue removes and returns the items due at now whose revision is still
// the current, held one of their key.
func (t *tracker) popDue(now time.Time, limit int) []dueItem {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []dueItem
	for len(t.due) > 0 && len(out) < limit && !t.due[0].at.After(now) {
		it := t.due.pop()
		if o := t.keys[it.key]; o != nil && o.rev == it.rev && o.held() {
			out = append(out, it)
		}
	}
	return out
}

// retryAt puts an item back to be tried again at.
func (t *tracker) retryAt(it dueItem, at time.Time) {
	t.mu.Lock()
	it.at = at
	t.due.push(it)
	t.mu.Unlock()
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
		if !q[i].at.Before(q[p].at) {
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
		if l < n && q[l].at.Before(q[m].at) {
			m = l
		}
		if r := l + 1; r < n && q[r].at.Before(q[m].at) {
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
