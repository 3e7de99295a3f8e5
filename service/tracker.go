package service

import (
	"container/heap"
	"sync"
	"time"
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

func newTracker(grace time.Duration) *tracker {
	return &tracker{grace: grace, keys: make(map[string]*observation)}
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
	o = &observation{entry: e, seen: time.Now()}
	t.keys[key] = o
	if e.held() {
		heap.Push(&t.due, dueItem{at: t.deadline(o), key: key, rev: e.rev})
	}
	return *o
}

func (t *tracker) deadline(o *observation) time.Time {
	return o.seen.Add(time.Duration(o.rec.TTLms)*time.Millisecond + t.grace)
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
	for t.due.Len() > 0 && len(out) < limit && !t.due[0].at.After(now) {
		it := heap.Pop(&t.due).(dueItem)
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
	heap.Push(&t.due, it)
	t.mu.Unlock()
}

type dueHeap []dueItem

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(dueItem)) }
func (h *dueHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}
