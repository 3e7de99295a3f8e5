package service

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The due heap pops items in time order, however pushes and pops mix.
func TestDueHeapOrder(t *testing.T) {
	base := time.Now()
	r := rand.New(rand.NewPCG(1, 2))
	var h dueHeap
	var want []time.Duration // what h holds, as offsets from base
	for i := range 5000 {
		if len(h) > 0 && r.IntN(3) == 0 {
			slices.Sort(want)
			got := h.pop()
			if d := got.at.Sub(base); d != want[0] {
				t.Fatalf("step %d: popped %v, want the earliest %v", i, d, want[0])
			}
			want = want[1:]
			continue
		}
		d := time.Duration(r.IntN(1000)) * time.Millisecond
		h.push(dueItem{at: base.Add(d), key: "k", rev: uint64(i)})
		want = append(want, d)
	}
	slices.Sort(want)
	for _, w := range want {
		if d := h.pop().at.Sub(base); d != w {
			t.Fatalf("draining: popped %v, want %v", d, w)
		}
	}
	if len(h) != 0 {
		t.Fatalf("%d items left", len(h))
	}
}
