package service

import (
	"math/rand/v2"
	"testing"
	"time"
)

// recentIDs answers as a map of id to its last note, with the oldest notes
// forgotten first, through growth, shrinking, ids noted again and probe
// chains that wrap around the index: checked against that map after every
// step of a random run.
func TestRecentIDsMatchesAMap(t *testing.T) {
	const window = 50
	rng := rand.New(rand.NewPCG(1, 2))
	var r recentIDs
	model := map[uint64]time.Duration{} // id → last note
	var order []seenAt[uint64]          // every note, oldest first
	now := time.Duration(0)
	// Few distinct ids, so that many are noted again, in an index small
	// enough for long probe chains.
	idOf := func(k uint64) uint64 { return k * 0x2545F4914F6CDD1D }
	id := func() uint64 { return idOf(uint64(rng.IntN(300))) }
	check := func(step int) {
		t.Helper()
		if r.len() != len(model) {
			t.Fatalf("step %d: %d ids remembered, want %d", step, r.len(), len(model))
		}
		for k := range uint64(300) {
			at, ok := r.seen(idOf(k))
			want, wantOK := model[idOf(k)]
			if ok != wantOK || at != want {
				t.Fatalf("step %d: id %d seen (%v, %v), want (%v, %v)", step, k, at, ok, want, wantOK)
			}
		}
	}
	// forget drops from the model what recentIDs drops: the notes
	// older than the window, except an id's later note.
	forget := func(since time.Duration) {
		for len(order) > 0 && since-order[0].at > window {
			if model[order[0].v] == order[0].at {
				delete(model, order[0].v)
			}
			order = order[1:]
		}
	}
	for step := range 20000 {
		switch op := rng.IntN(10); {
		case op < 6: // a burst grows the ring
			for range 1 + rng.IntN(8) {
				k := id()
				r.note(k, now)
				model[k] = now
				order = append(order, seenAt[uint64]{v: k, at: now})
			}
		case op < 9:
			now += time.Duration(rng.IntN(4))
			r.expire(now, window, 1000)
			forget(now)
		default: // a long quiet spell shrinks it
			now += window + 1
			r.expire(now, window, 1000)
			forget(now)
		}
		check(step)
	}
	// Grown for many ids, it shrinks back once they are forgotten.
	for k := range uint64(10000) {
		r.note(idOf(1000+k), now)
	}
	r.expire(now+window+1, window, 20000)
	if r.len() != 0 || len(r.ring) != minRecent || len(r.index) > 2*minRecent {
		t.Errorf("after forgetting all: %d ids, ring %d, index %d; want 0, %d, %d", r.len(), len(r.ring), len(r.index), minRecent, 2*minRecent)
	}
}

// expire forgets at most n ids a call, and dropOldest the oldest whatever
// its age.
func TestRecentIDsExpiryIsBounded(t *testing.T) {
	var r recentIDs
	for i := range uint64(100) {
		r.note(i, time.Duration(i))
	}
	r.expire(1000, 10, 30)
	if r.len() != 70 {
		t.Fatalf("%d ids after expiring 30 of 100, want 70", r.len())
	}
	if _, ok := r.seen(29); ok {
		t.Fatal("id 29 still remembered")
	}
	if _, ok := r.seen(30); !ok {
		t.Fatal("id 30 forgotten")
	}
	r.dropOldest()
	if _, ok := r.seen(30); ok || r.len() != 69 {
		t.Fatalf("after dropOldest: id 30 remembered %v, %d ids; want forgotten, 69", ok, r.len())
	}
	r.expire(50, 10, 1000) // ids noted at 40 or later stay
	if r.len() != 60 {
		t.Fatalf("%d ids after expiring those older than 40, want 60", r.len())
	}
}
