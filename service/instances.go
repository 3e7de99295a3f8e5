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

// instanceWaits is what the tracker knows of the waiter records of one
// instance: their keys, and when the first of them was indexed (since the
// tracker's epoch), which counts as a heartbeat: an instance that was
// never heard gets a full liveness window from then.
type instanceWaits struct {
	keys  map[string]struct{}
	since time.Duration
}

// heard notes a heartbeat of instance id.
func (t *tracker) heard(id string) {
	if id == "" || len(id) > maxInstanceID {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.heardAt[id] = time.Since(t.epoch)
}

// instanceOf returns the instance that serves the waiter whose wake
// subject is wake, or "" when wake is not one of this prefix.
func (t *tracker) instanceOf(wake string) string {
	rest, ok := strings.CutPrefix(wake, t.wakeRoot)
	if !ok || t.wakeRoot == "" {
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
func (t *tracker) indexInstanceWait(key, from, to string) {
	fromID, toID := t.instanceOf(from), t.instanceOf(to)
	if iw := t.instWaits[fromID]; fromID != "" && iw != nil {
		delete(iw.keys, key)
		if len(iw.keys) == 0 {
			delete(t.instWaits, fromID)
		}
	}
	if toID == "" {
		return
	}
	iw := t.instWaits[toID]
	if iw == nil {
		iw = &instanceWaits{keys: make(map[string]struct{}), since: time.Since(t.epoch)}
		t.instWaits[toID] = iw
	}
	iw.keys[key] = struct{}{}
}

// instanceDeadlineLocked is when the waiter record observed in o is gone
// by the second rule above, or the zero time when the rule does not apply
// (this instance's own waiters, whose end this instance decides; records
// of no instance). The caller holds t.mu.
func (t *tracker) instanceDeadlineLocked(o *observation) time.Time {
	if o.rec == nil || o.rec.Wake == "" || t.liveness <= 0 || !strings.HasPrefix(o.key, streams.WaitKeyPrefix) {
		return time.Time{}
	}
	id := t.instanceOf(o.rec.Wake)
	if id == "" || id == t.self {
		return time.Time{}
	}
	last := o.seen
	if at, ok := t.heardAt[id]; ok {
		if h := t.epoch.Add(at); h.After(last) {
			last = h
		}
	}
	if iw := t.instWaits[id]; iw != nil {
		if s := t.epoch.Add(iw.since); s.After(last) {
			last = s
		}
	}
	return last.Add(t.liveness + t.grace)
}

// instancesDue makes due, at now, the waiter records of every instance
// that has gone silent, and forgets the heartbeats of instances that have
// been silent long and have no waiter records. The caller holds t.mu.
func (t *tracker) instancesDue(now time.Time) {
	d := now.Sub(t.epoch)
	for id, iw := range t.instWaits {
		if id == t.self {
			continue
		}
		last := iw.since
		if at, ok := t.heardAt[id]; ok && at > last {
			last = at
		}
		if d-last < t.liveness+t.grace {
			continue
		}
		for key := range iw.keys {
			o, ok := t.keys[key]
			// due 0: the sweep has it already (or it is not held).
			if !ok || !o.held() || o.due == 0 || o.due <= d {
				continue
			}
			o.due = d
			t.keys[key] = o
			t.due.push(dueItem{at: d, key: o.key, rev: o.rev})
		}
	}
	for id, at := range t.heardAt {
		if _, waits := t.instWaits[id]; !waits && d-at > forgetInstance {
			delete(t.heardAt, id)
		}
	}
}

// forgetInstance is how long the tracker keeps the last heartbeat of an
// instance that has no waiter records: long past any liveness window.
const forgetInstance = 10 * time.Minute
