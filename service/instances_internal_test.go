package service

import (
	"testing"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// The liveness of waiter records as the tracker decides it: a record of
// another instance lives while that instance is heard (whatever its own
// liveness_ms, which a newer instance sets to its wait's end), and is due
// once the instance has been silent for the liveness window and grace; a
// record an older release keeps rewriting lives while it is rewritten,
// heard or not; this instance's own records are never taken for dead by
// it.
func TestWaiterLivesWhileItsInstanceIsHeard(t *testing.T) {
	const liveness = 600 * time.Millisecond
	tr := newTracker(0, time.Minute, time.Minute)
	tr.instances.self, tr.instances.wakeRoot, tr.instances.liveness = "me", "jetlock.wake.", liveness
	rev := uint64(0)
	write := func(key, instance string, ttl time.Duration) observation {
		rev++
		rec := &streams.Record{RequestID: "r", TTLms: ttl.Milliseconds(), Wake: "jetlock.wake." + instance + ".h", Token: 0}
		return tr.observe(key, entry{rev: rev, rec: rec})
	}
	heardKey, silentKey, oldKey, ownKey := streams.WaitKey("a", "1"), streams.WaitKey("a", "2"), streams.WaitKey("a", "3"), streams.WaitKey("a", "4")
	write(heardKey, "heard", time.Hour)
	write(silentKey, "silent", time.Hour)
	write(oldKey, "old", 4*liveness) // an older release: rewritten, never heard
	write(ownKey, "me", time.Hour)
	due := map[string]bool{}
	for end := time.Now().Add(8 * liveness); time.Now().Before(end); time.Sleep(liveness / 6) {
		tr.instances.heard("heard")
		if o, _ := tr.get(oldKey); time.Since(o.seen) > liveness/4 {
			write(oldKey, "old", 4*liveness)
		}
		for _, it := range tr.popDue(time.Now(), 100) {
			due[it.key] = true
		}
	}
	if !due[silentKey] {
		t.Errorf("the waiter of a silent instance was never due")
	}
	for _, k := range []string{heardKey, oldKey, ownKey} {
		if due[k] {
			t.Errorf("%s was due while its instance was heard, it was rewritten, or it is this instance's", k)
		}
		if o, _ := tr.get(k); tr.expired(o, time.Now()) {
			t.Errorf("%s expired", k)
		}
	}
	if o, _ := tr.get(silentKey); !tr.expired(o, time.Now()) {
		t.Errorf("the silent instance's waiter is not expired")
	}
	// Its record removed, the tracker forgets the silent instance's waits.
	rev++
	tr.observe(silentKey, entry{rev: rev})
	if _, ok := tr.instances.instWaits["silent"]; ok {
		t.Errorf("the silent instance's waits are still indexed")
	}
}
