package service

import (
	"strings"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// The liveness of waiter records. A waiting acquire costs no write while
// nothing changes: its record is written once, when it queues, and lives
// while both of these hold:
//
//   - its revision has stood for less than the record's liveness_ms plus
//     ExpiryGrace (as any record: see tracker.ownDeadline). The serving
//     instance sets liveness_ms to what is left of the wait plus
//     WaiterLiveness, so a record whose instance failed to remove it when
//     the wait ended is removed soon after;
//   - its instance, named by its wake subject, is alive: heard on the
//     heartbeat subject (follow.go), or the record itself was written,
//     within WaiterLiveness plus ExpiryGrace. Heartbeats cost one message a
//     second an instance, whatever the number of waiters.
//
// So a waiter whose instance died leaves the queue within WaiterLiveness
// plus ExpiryGrace of its instance's last heartbeat, as it did when each
// record was rewritten every third of that window. The second rule counts
// from the record's own write too, so a record that an older release keeps
// refreshing (with a short liveness_ms) lives while it is refreshed, heard
// or not; and a record that an older release sees from a newer one lives
// for liveness_ms, until the wait's end (docs/compatibility.md).
//
// Every instance sweeps: the one that serves a waiter removes its record
// when the wait ends; the others remove the records of an instance that
// has gone silent.

// maxInstanceID bounds the instance id a heartbeat may carry (a nuid has
// 22 characters); anything longer is not an instance's.
const maxInstanceID = 64

// instanceIndex is what the tracker knows of the other instances: when
// each was last heard, and the waiter records each serves.
type instanceIndex struct {
	// t is the tracker whose mu guards the index.
	t *tracker
	// heardAt is when each other instance was last heard (since epoch),
	// and instWaits the waiter records of each instance; self is this
	// instance's id, wakeRoot the root of wake subjects ("<prefix>.wake."),
	// liveness the waiter liveness window. Without a
	// wakeRoot, waiter records live by their own revision alone.
	heardAt   map[string]time.Duration
	instWaits map[string]*instanceWaits
	self      string
	wakeRoot  string
	liveness  time.Duration
}

// instanceWaits is what the tracker knows of the waiter records of one
// instance: their keys, and when the first of them was indexed (since the
// tracker's epoch), which counts as a heartbeat: an instance that was
// never heard gets a full liveness window from then.
type instanceWaits struct {
	keys  map[string]struct{}
	since time.Duration
}

// heard notes a heartbeat of instance id.
func (in *instanceIndex) heard(id string) {
	if id == "" || len(id) > maxInstanceID {
		return
	}
	in.t.mu.Lock()
	defer in.t.mu.Unlock()
	in.heardAt[id] = time.Since(in.t.epoch)
}

// instanceOf returns the instance that serves the waiter whose wake
// subject is wake, or "" when wake is not one of this prefix.
func (in *instanceIndex) instanceOf(wake string) string {
	rest, ok := strings.CutPrefix(wake, in.wakeRoot)
	if !ok || in.wakeRoot == "" {
		return ""
	}
	id, _, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	return id
}

// indexInstanceWait moves waiter key key from the instance of wake
// subject from (if any) to that of wake subject to (if any). The caller
// holds t.mu.
func (in *instanceIndex) indexInstanceWait(key, from, to string) {
	fromID, toID := in.instanceOf(from), in.instanceOf(to)
	if iw := in.instWaits[fromID]; fromID != "" && iw != nil {
		delete(iw.keys, key)
		if len(iw.keys) == 0 {
			delete(in.instWaits, fromID)
		}
	}
	if toID == "" {
		return
	}
	iw := in.instWaits[toID]
	if iw == nil {
		iw = &instanceWaits{keys: make(map[string]struct{}), since: time.Since(in.t.epoch)}
		in.instWaits[toID] = iw
	}
	iw.keys[key] = struct{}{}
}

// instanceDeadlineLocked is when the waiter record observed in o is gone
// by the second rule above, or the zero time when the rule does not apply
// (this instance's own waiters, whose end this instance decides; records
// of no instance). The caller holds t.mu.
func (in *instanceIndex) instanceDeadlineLocked(o *observation) time.Time {
	if o.rec == nil || o.rec.Wake == "" || in.liveness <= 0 || !strings.HasPrefix(o.key, streams.WaitKeyPrefix) {
		return time.Time{}
	}
	id := in.instanceOf(o.rec.Wake)
	if id == "" || id == in.self {
		return time.Time{}
	}
	last := o.seen
	if at, ok := in.heardAt[id]; ok {
		if h := in.t.epoch.Add(at); h.After(last) {
			last = h
		}
	}
	if iw := in.instWaits[id]; iw != nil {
		if s := in.t.epoch.Add(iw.since); s.After(last) {
			last = s
		}
	}
	return last.Add(in.liveness + in.t.grace)
}

// instancesDue makes due, at now, the waiter records of every instance
// that has gone silent, and forgets the heartbeats of instances that have
// been silent long and have no waiter records. The caller holds t.mu.
func (in *instanceIndex) instancesDue(now time.Time) {
	d := now.Sub(in.t.epoch)
	for id, iw := range in.instWaits {
		if id == in.self {
			continue
		}
		last := iw.since
		if at, ok := in.heardAt[id]; ok && at > last {
			last = at
		}
		if d-last < in.liveness+in.t.grace {
			continue
		}
		for key := range iw.keys {
			o, ok := in.t.keys[key]
			// due 0: the sweep has it already (or it is not held).
			if !ok || !o.held() || o.due == 0 || o.due <= d {
				continue
			}
			o.due = d
			in.t.keys[key] = o
			in.t.due.push(dueItem{at: d, key: o.key, rev: o.rev})
		}
	}
	for id, at := range in.heardAt {
		if _, waits := in.instWaits[id]; !waits && d-at > forgetInstance {
			delete(in.heardAt, id)
		}
	}
}

// forgetInstance is how long the tracker keeps the last heartbeat of an
// instance that has no waiter records: long past any liveness window.
const forgetInstance = 10 * time.Minute
