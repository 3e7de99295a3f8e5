package service

import (
	"fmt"
	"testing"

	"github.com/jetlock/jetlock/streams"
)

// A wait is woken by the delivery of its revision or a later one, not
// before; a revision already delivered needs no wait; the watcher's stop
// wakes every wait.
func TestDeliveriesWakeOnlyWhatTheyReach(t *testing.T) {
	var d deliveries
	d.restart()
	d.caughtUp()
	isDone := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	w5, w7, w9 := d.wait(5), d.wait(7), d.wait(9)
	d.delivered(4)
	if isDone(w5) || isDone(w7) || isDone(w9) {
		t.Fatal("a delivery of 4 woke a wait for 5 or later")
	}
	d.delivered(7)
	if !isDone(w5) || !isDone(w7) || isDone(w9) {
		t.Fatalf("after 7: waits for 5, 7, 9 woken %v %v %v; want true true false", isDone(w5), isDone(w7), isDone(w9))
	}
	if !isDone(d.wait(6)) {
		t.Fatal("a wait for a revision already delivered blocks")
	}
	if len(d.waits) != 1 {
		t.Fatalf("%d waits kept; want the one for 9", len(d.waits))
	}
	d.stopped()
	if !isDone(w9) || len(d.waits) != 0 {
		t.Fatal("the watcher's stop left a wait")
	}
}

// A session is known live or ended only as of a delivered revision, and
// only once the watcher has caught up; a restarted watcher knows nothing
// until it has caught up again.
func TestDeliveriesKnowSessionsAsOfARevision(t *testing.T) {
	var d deliveries
	d.restart()
	key := streams.SessionKey("h1")
	d.session(key, entry{rev: 3, rec: &streams.Record{LeaseID: "secret"}})
	if _, known := d.liveAt("h1", "secret", 3); known {
		t.Fatal("known before the watcher caught up")
	}
	d.caughtUp()
	d.delivered(5)
	if live, known := d.liveAt("h1", "secret", 5); !live || !known {
		t.Fatalf("live session at 5: %v %v", live, known)
	}
	if live, _ := d.liveAt("h1", "another", 5); live {
		t.Fatal("live with another secret")
	}
	if _, known := d.liveAt("h1", "secret", 6); known {
		t.Fatal("known at a revision not delivered yet")
	}
	d.session(key, entry{rev: 6})
	d.delivered(6)
	if live, known := d.liveAt("h1", "secret", 6); live || !known {
		t.Fatalf("ended session at 6: live %v known %v", live, known)
	}
	d.restart()
	if _, known := d.liveAt("h1", "secret", 1); known {
		t.Fatal("a restarted watcher knows what an earlier one delivered")
	}
}

// A session whose end is delivered was live at every revision before its
// end (with its own secret), not at or after it; a restarted watcher
// keeps where sessions ended; and the ends kept are bounded, the oldest
// forgotten first (judged ended at every revision: refused, never wrongly
// counted).
func TestDeliveriesJudgeASessionAtTheGrantsRevision(t *testing.T) {
	var d deliveries
	d.restart()
	d.caughtUp()
	d.session(streams.SessionKey("h1"), entry{rev: 3, rec: &streams.Record{LeaseID: "secret"}})
	d.session(streams.SessionKey("h1"), entry{rev: 9})
	d.delivered(9)
	for _, c := range []struct {
		secret string
		rev    uint64
		live   bool
	}{{"secret", 4, true}, {"", 8, true}, {"secret", 9, false}, {"another", 4, false}} {
		if live, known := d.liveAt("h1", c.secret, c.rev); live != c.live || !known {
			t.Errorf("secret %q at %d: live %v known %v; want live %v", c.secret, c.rev, live, known, c.live)
		}
	}
	d.restart()
	d.caughtUp()
	d.delivered(10)
	if live, _ := d.liveAt("h1", "secret", 4); !live {
		t.Error("a restarted watcher forgot where a session ended")
	}
	for i := range 2 * endedKeep {
		key := streams.SessionKey(fmt.Sprint("n", i))
		d.session(key, entry{rev: uint64(11 + 2*i), rec: &streams.Record{LeaseID: "s"}})
		d.session(key, entry{rev: uint64(12 + 2*i)})
	}
	if n := len(d.ended) + len(d.endedBefore); n > 2*endedKeep {
		t.Fatalf("%d ended sessions kept; want at most %d", n, 2*endedKeep)
	}
	d.delivered(uint64(12 + 4*endedKeep))
	if live, _ := d.liveAt("h1", "secret", 4); live {
		t.Error("the oldest end is still kept after twice endedKeep more")
	}
	last := fmt.Sprint("n", 2*endedKeep-1)
	if live, _ := d.liveAt(last, "s", uint64(9+4*endedKeep)); !live {
		t.Error("the newest end was forgotten")
	}
}

// A grant after a session's delivered end is known an orphan from the
// deliveries alone (no read of a stream leader, which could answer from
// old state); a session ended after the grant, one reopened since its end
// (another secret, live), or one whose end the watcher never delivered
// is not.
func TestDeliveriesKnowAnEndBeforeAGrant(t *testing.T) {
	var d deliveries
	d.restart()
	d.caughtUp()
	key := streams.SessionKey("h1")
	d.session(key, entry{rev: 3, rec: &streams.Record{LeaseID: "secret"}})
	d.session(key, entry{rev: 6})
	if d.endedEarlier("h1", "secret", 7) {
		t.Fatal("known before the grant's revision was delivered")
	}
	d.delivered(8)
	for _, c := range []struct {
		hash, secret string
		rev          uint64
		ended        bool
	}{{"h1", "secret", 7, true}, {"h1", "", 7, true}, {"h1", "secret", 5, false}, {"h1", "another", 7, false}, {"h2", "", 7, false}} {
		if got := d.endedEarlier(c.hash, c.secret, c.rev); got != c.ended {
			t.Errorf("session %s (secret %q) at %d: ended before %v; want %v", c.hash, c.secret, c.rev, got, c.ended)
		}
	}
	d.session(key, entry{rev: 8, rec: &streams.Record{LeaseID: "reopened"}})
	if d.endedEarlier("h1", "", 8) {
		t.Error("a session reopened under the same hash is taken for ended")
	}
}
