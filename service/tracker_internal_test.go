package service

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/jetlock/jetlock/streams"
)

// The due heap pops items in time order, however pushes and pops mix.
func TestDueHeapOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h dueHeap
	var want []time.Duration // what h holds
	for i := range 5000 {
		if len(h) > 0 && r.IntN(3) == 0 {
			slices.Sort(want)
			got := h.pop()
			if d := got.at; d != want[0] {
				t.Fatalf("step %d: popped %v, want the earliest %v", i, d, want[0])
			}
			want = want[1:]
			continue
		}
		d := time.Duration(r.IntN(1000)) * time.Millisecond
		h.push(dueItem{at: d, key: "k", rev: uint64(i)})
		want = append(want, d)
	}
	slices.Sort(want)
	for _, w := range want {
		if d := h.pop().at; d != w {
			t.Fatalf("draining: popped %v, want %v", d, w)
		}
	}
	if len(h) != 0 {
		t.Fatalf("%d items left", len(h))
	}
}

// list answers from the lazily kept index exactly what a model of the held
// leases says, in order, whether the changes since the last list were
// applied one by one or dropped for a rebuild (more than maxHeldChanges),
// and the count of held leases is right at every step.
func TestListIndexFollowsLeases(t *testing.T) {
	tr := newTracker(time.Second, time.Minute, time.Minute)
	r := rand.New(rand.NewPCG(3, 4))
	model := map[string]bool{} // resource -> held
	rev := uint64(0)
	names := make([]string, 3000)
	for i := range names {
		names[i] = fmt.Sprintf("res/%04d", i)
		if i%7 == 0 {
			names[i] = fmt.Sprintf("res/odd name %04d", i) // escaped in its key
		}
	}
	check := func(step string) {
		t.Helper()
		var want []string
		for res, held := range model {
			if held {
				want = append(want, res)
			}
		}
		slices.Sort(want)
		if n, _ := tr.counts(); n != len(want) {
			t.Fatalf("%s: counts says %d leases, model %d", step, n, len(want))
		}
		var got []string
		for after := ""; ; {
			page, more := tr.list("res/", after, 500)
			for _, l := range page {
				got = append(got, l.resource)
			}
			if !more {
				break
			}
			after = page[len(page)-1].resource
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: list has %d resources, model %d (first difference near %v)", step, len(got), len(want), firstDiff(got, want))
		}
	}
	for round, changes := range []int{10, 500, 5000, 20, 20000, 3} {
		for range changes {
			res := names[r.IntN(len(names))]
			key := streams.LeaseKey(res)
			rev++
			switch {
			case r.IntN(10) == 0:
				tr.forget(key)
				model[res] = false
			case model[res]:
				tr.observe(key, entry{rev: rev})
				model[res] = false
			default:
				tr.observe(key, entry{rev: rev, rec: &streams.Record{LeaseID: fmt.Sprint(rev), RequestID: fmt.Sprint(rev), TTLms: 30000}})
				model[res] = true
			}
		}
		check(fmt.Sprintf("round %d (%d changes)", round, changes))
	}
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return a[i] + " / " + b[i]
		}
	}
	return "the end"
}

// A deleted key is known, with the revision of its delete and when that
// was seen, until the retry window has passed: a stale write below it is
// ignored, a newer one replaces it, and a delete that carries an end mark
// the ended ids do not cover keeps that mark.
func TestDeletedKeysAreKeptForTheWindow(t *testing.T) {
	tr := newTracker(0, time.Minute, 40*time.Millisecond)
	key := streams.LeaseKey("r")
	before := time.Now()
	tr.observe(key, entry{rev: 5})
	o, ok := tr.get(key)
	if !ok || o.rev != 5 || o.held() || o.seen.Before(before) || time.Since(o.seen) > time.Second {
		t.Fatalf("deleted key: %+v, %v", o, ok)
	}
	if o := tr.observe(key, entry{rev: 4, rec: &streams.Record{LeaseID: "l", RequestID: "q"}}); o.rev != 5 || o.held() {
		t.Fatalf("an older write replaced the delete: %+v", o)
	}
	if o := tr.observe(key, entry{rev: 6, rec: &streams.Record{LeaseID: "l", RequestID: "q", TTLms: 1000}}); o.rev != 6 || !o.held() {
		t.Fatalf("a newer grant did not replace the delete: %+v", o)
	}
	marked := streams.LeaseKey("marked")
	tr.observe(marked, entry{rev: 7, end: &streams.EndMark{RequestID: "elsewhere"}})
	if o, ok := tr.get(marked); !ok || o.end == nil || o.end.RequestID != "elsewhere" {
		t.Fatalf("end mark lost: %+v, %v", o, ok)
	}
	time.Sleep(60 * time.Millisecond)
	tr.observe(streams.LeaseKey("later"), entry{rev: 8}) // forgets what is past the window
	if _, ok := tr.get(marked); ok {
		t.Fatal("the marked delete is still known after the window")
	}
	if o, ok := tr.get(key); !ok || !o.held() {
		t.Fatalf("the lease granted over the delete was forgotten with it: %+v, %v", o, ok)
	}
}

// A key's observation, its due items and its list index changes share the
// tracker's one copy of the key's name, however many requests named it
// (each request decodes a name of its own).
func TestTrackerKeepsOneCopyOfAKey(t *testing.T) {
	tr := newTracker(time.Second, time.Minute, time.Minute)
	name := func() string { return streams.LeaseKey(strings.Repeat("r", 40)) } // a new string on every call
	first := name()
	tr.observe(first, entry{rev: 1, rec: &streams.Record{LeaseID: "l", RequestID: "q", TTLms: 1000}})
	for rev := uint64(2); rev <= 5; rev++ {
		key := name()
		if unsafe.StringData(key) == unsafe.StringData(first) {
			t.Fatal("the test's names share their bytes")
		}
		tr.observe(key, entry{rev: rev, rec: &streams.Record{LeaseID: "l", RequestID: "q", TTLms: 1000}})
	}
	same := func(what, s string) {
		t.Helper()
		if unsafe.StringData(s) != unsafe.StringData(first) {
			t.Errorf("%s keeps a copy of its own", what)
		}
	}
	o, ok := tr.get(name())
	if !ok || o.rev != 5 {
		t.Fatalf("observation: %+v, %v", o, ok)
	}
	same("the observation", o.key)
	for key := range tr.keys {
		same("the map key", key)
	}
	if len(tr.due) != 1 {
		t.Fatalf("%d due items for a lease renewed 4 times, want 1", len(tr.due))
	}
	for _, it := range tr.due {
		same("a due item", it.key)
	}
	for key := range tr.heldChanges {
		same("the list index change", key)
	}
}

// Forgetting a delete after the window forgets only that delete: a later
// delete of the same key stays known for a window of its own.
func TestForgettingADeleteKeepsALaterOne(t *testing.T) {
	tr := newTracker(0, time.Minute, time.Minute)
	key := streams.LeaseKey("twice")
	tr.observe(key, entry{rev: 5})
	tr.observe(key, entry{rev: 6, rec: &streams.Record{LeaseID: "l", RequestID: "q", TTLms: 1000}})
	time.Sleep(time.Millisecond)
	tr.observe(key, entry{rev: 7})
	if len(tr.gone) != 2 {
		t.Fatalf("%d deletes queued, want 2", len(tr.gone))
	}
	tr.mu.Lock()
	tr.forgetGone(tr.epoch.Add(tr.gone[0].at+tr.window+1), 16) // the first delete's window is over, not the second's
	tr.mu.Unlock()
	if o, ok := tr.get(key); !ok || o.rev != 7 || o.held() {
		t.Fatalf("the later delete: %+v, %v; want it known at revision 7", o, ok)
	}
	if len(tr.gone) != 1 {
		t.Fatalf("%d deletes queued after the first was forgotten, want 1", len(tr.gone))
	}
}

// At most maxEnded ended request ids are remembered: beyond that, the
// oldest are forgotten first, whatever the retry window.
func TestEndedIDsAreBounded(t *testing.T) {
	tr := newTracker(0, time.Minute, time.Hour)
	now := time.Now()
	tr.mu.Lock()
	for i := range maxEnded + 10 {
		tr.retry.note("lease.k", strconv.Itoa(i), "", now)
	}
	tr.mu.Unlock()
	if tr.retry.ids.len() != maxEnded || tr.retry.ids.entries() != maxEnded {
		t.Fatalf("%d ended ids remembered (%d entries), want the bound %d", tr.retry.ids.len(), tr.retry.ids.entries(), maxEnded)
	}
	if tr.retry.hasEnded("lease.k", "9", "") || !tr.retry.hasEnded("lease.k", "10", "") || !tr.retry.hasEnded("lease.k", strconv.Itoa(maxEnded+9), "") {
		t.Fatal("want the 10 oldest forgotten and the rest remembered")
	}
}

// A lease has one due item however often it is renewed: at the first
// deadline it goes back at the renewal's, and only a renewal due earlier
// (a shorter TTL) schedules an item of its own. What popDue hands the
// sweep carries the key's current revision, and the key has no other item
// that counts until the sweep writes it or puts the item back.
func TestARenewalMovesTheLeasesDueItem(t *testing.T) {
	tr := newTracker(0, time.Minute, time.Minute)
	key := streams.LeaseKey("renewed")
	lease := func(rev uint64, ttlMs int64) entry {
		return entry{rev: rev, rec: &streams.Record{LeaseID: "l", RequestID: "q", TTLms: ttlMs}}
	}
	tr.observe(key, lease(1, 1000))
	o2 := tr.observe(key, lease(2, 2000))
	if len(tr.due) != 1 {
		t.Fatalf("%d due items after a renewal, want 1", len(tr.due))
	}
	if got := tr.popDue(tr.epoch.Add(tr.due[0].at), 10); len(got) != 0 {
		t.Fatalf("renewed lease swept at its first deadline: %+v", got)
	}
	if len(tr.due) != 1 || tr.due[0].at != tr.deadline(&o2).Sub(tr.epoch) {
		t.Fatalf("due items %+v, want one at the renewal's deadline", tr.due)
	}
	o3 := tr.observe(key, lease(3, 10))
	if len(tr.due) != 2 {
		t.Fatalf("%d due items after a renewal due earlier, want 2", len(tr.due))
	}
	got := tr.popDue(tr.deadline(&o3), 10)
	if len(got) != 1 || got[0].rev != 3 || got[0].key != key {
		t.Fatalf("swept %+v, want the lease at revision 3", got)
	}
	later := tr.deadline(&o2).Add(time.Minute)
	if again := tr.popDue(later, 10); len(again) != 0 {
		t.Fatalf("swept again while the sweep has it: %+v", again)
	}
	tr.retryAt(got[0], later)
	if again := tr.popDue(later, 10); len(again) != 1 || again[0].rev != 3 {
		t.Fatalf("after retryAt swept %+v, want the lease at revision 3", again)
	}
	// A retry of a revision written over since is not put back.
	tr.observe(key, lease(4, 1000))
	tr.retryAt(got[0], later)
	if n := len(tr.due); n != 1 {
		t.Fatalf("%d due items after a stale retry, want the renewal's 1", n)
	}
}
