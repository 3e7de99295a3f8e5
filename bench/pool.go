package main

import (
	"container/heap"
	"math/rand/v2"
	"time"
)

// idSet is a set of small integer ids with O(1) add, remove and uniform
// random pick. It is not safe for concurrent use.
type idSet struct {
	ids []int32
	pos []int32 // pos[id] is 1 + the index of id in ids, or 0
}

func newIDSet(n int) idSet { return idSet{pos: make([]int32, n)} }

func (s *idSet) len() int { return len(s.ids) }

func (s *idSet) has(id int32) bool { return s.pos[id] != 0 }

func (s *idSet) add(id int32) {
	if s.pos[id] != 0 {
		return
	}
	s.ids = append(s.ids, id)
	s.pos[id] = int32(len(s.ids))
}

func (s *idSet) remove(id int32) {
	p := s.pos[id]
	if p == 0 {
		return
	}
	last := s.ids[len(s.ids)-1]
	s.ids[p-1] = last
	s.pos[last] = p
	s.ids = s.ids[:len(s.ids)-1]
	s.pos[id] = 0
}

// pick removes and returns a uniformly random member; ok is false when
// the set is empty.
func (s *idSet) pick(rng *rand.Rand) (id int32, ok bool) {
	if len(s.ids) == 0 {
		return 0, false
	}
	id = s.ids[rng.IntN(len(s.ids))]
	s.remove(id)
	return id, true
}

// renewItem is a lease due for renewal; gen tells a stale item (the lease
// was released or renewed since) from a current one.
type renewItem struct {
	due time.Time
	id  int32
	gen uint32
}

type renewHeap []renewItem

func (h renewHeap) Len() int           { return len(h) }
func (h renewHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h renewHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *renewHeap) Push(x any)        { *h = append(*h, x.(renewItem)) }
func (h *renewHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

func (h *renewHeap) push(it renewItem) { heap.Push(h, it) }

func (h *renewHeap) pop() (renewItem, bool) {
	if h.Len() == 0 {
		return renewItem{}, false
	}
	return heap.Pop(h).(renewItem), true
}

// quarantined is a resource whose state is unknown (a write's outcome was
// unknown) until it can no longer hold a lease.
type quarantined struct {
	until time.Time
	id    int32
}
