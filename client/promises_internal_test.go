package client

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// suspendClock is a clock whose wall clock runs ahead of its monotonic
// clock by what a suspend of the host took: Linux's monotonic clock stops
// while the host or VM sleeps, the wall clock (and the service's) goes on.
type suspendClock struct {
	mu     sync.Mutex
	asleep time.Duration
}

func (c *suspendClock) now() (mono, wall time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := time.Now()
	return t, t.Round(0).Add(c.asleep)
}

func (c *suspendClock) suspend(d time.Duration) {
	c.mu.Lock()
	c.asleep += d
	c.mu.Unlock()
}

// P3: after a suspend longer than what is left of the lease, Lost closes
// although the monotonic clock says the deadline is still ahead: the
// earlier of the two clocks' deadlines counts. Before, a lease was lost
// late by the time the host slept. With the expiry timer armed (and so
// asleep on the monotonic clock), Lost closes within its poll.
func TestDeadlinePassesByTheWallClockAfterASuspend(t *testing.T) {
	for _, armed := range []bool{false, true} {
		clk := &suspendClock{}
		lf := newLife("renewal", time.Second)
		lf.clock = clk
		lf.setDeadline(time.Now(), time.Minute)
		if armed {
			lf.arm()
		}
		if lf.check() {
			t.Fatal("lost before any suspend")
		}
		clk.suspend(2 * time.Minute)
		if !armed {
			if !lf.check() {
				t.Fatal("not lost after a suspend past the deadline: the wall clock is not looked at")
			}
		} else {
			select {
			case <-lf.lost:
			case <-time.After(30 * time.Second): // the poll is expiryPoll; this only bounds a broken test
				t.Fatal("the expiry timer never noticed the suspend")
			}
		}
		if cause := context.Cause(lf.ctx); !errors.Is(cause, ErrLeaseLost) {
			t.Fatalf("cause %v, want ErrLeaseLost", cause)
		}
		if left := lf.left(lf.expires()); left != 0 {
			t.Fatalf("%v left after the deadline passed", left)
		}
	}
}

// A wall clock behind the monotonic one (stepped back) changes nothing:
// the monotonic deadline still counts.
func TestDeadlineIgnoresAWallClockSteppedBack(t *testing.T) {
	clk := &suspendClock{}
	lf := newLife("renewal", 0)
	lf.clock = clk
	lf.setDeadline(time.Now(), 100*time.Millisecond)
	clk.suspend(-time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for !lf.check() {
		if time.Now().After(deadline) {
			t.Fatal("the monotonic deadline did not count")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// eventMsg is an election event as the service publishes it.
func eventMsg(t *testing.T, ev streams.ElectionEvent) *nats.Msg {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Data: b}
}

// P9: Observe never goes back to an older value. A status read tells
// the leader's token but not the revision of its value; a late proclaim
// event of that leader, older than the value read, used to be delivered
// after it (the read recorded the token as the revision).
func TestObserveNeverGoesBackAfterAStatusRead(t *testing.T) {
	const name = "elect/order"
	o := &observer{e: &Election{name: name}}
	took := func() []LeaderChange {
		q := o.queue
		o.queue = nil
		return q
	}
	// The first read finds leader 10 with value v2 (proclaimed at
	// revision 12, which the read does not tell).
	o.apply(&streams.StatusResponse{Resource: name, Held: true, Token: 10, Value: "v2"}, true, false)
	if q := took(); len(q) != 1 || q[0].Value != "v2" || !q[0].Resync {
		t.Fatalf("first read delivered %+v", q)
	}
	// The late event of v1 (revision 11) must not be delivered.
	gap := o.event(eventMsg(t, streams.ElectionEvent{Resource: name, Event: streams.EventProclaimed, Token: 10, Value: "v1", Revision: 11}))
	if q := took(); len(q) != 0 {
		t.Fatalf("a proclaim older than the value read was delivered: %+v", q)
	}
	if !gap {
		t.Fatal("an event the observer cannot order did not ask for a read")
	}
	// The next read still finds v2: v1 was older, and is dropped.
	o.apply(&streams.StatusResponse{Resource: name, Held: true, Token: 10, Value: "v2"}, false, false)
	if q := took(); len(q) != 0 || o.pending != nil {
		t.Fatalf("after the read that found v2 again: delivered %+v, pending %+v", q, o.pending)
	}
	// A new proclaim (v3 at revision 15) is confirmed by the read and
	// delivered as the event it was, which orders what follows.
	o.event(eventMsg(t, streams.ElectionEvent{Resource: name, Event: streams.EventProclaimed, Token: 10, Value: "v3", Revision: 15}))
	if q := took(); len(q) != 0 {
		t.Fatalf("an unordered proclaim delivered before the read: %+v", q)
	}
	o.apply(&streams.StatusResponse{Resource: name, Held: true, Token: 10, Value: "v3"}, false, false)
	if q := took(); len(q) != 1 || q[0].Value != "v3" || q[0].Revision != 15 || q[0].Resync || q[0].Event != streams.EventProclaimed {
		t.Fatalf("the confirmed proclaim: %+v", q)
	}
	// Ordered from now on: an older event is dropped, a newer delivered
	// at once.
	o.event(eventMsg(t, streams.ElectionEvent{Resource: name, Event: streams.EventProclaimed, Token: 10, Value: "v2", Revision: 12}))
	if q := took(); len(q) != 0 {
		t.Fatalf("an event older than the state delivered: %+v", q)
	}
	o.event(eventMsg(t, streams.ElectionEvent{Resource: name, Event: streams.EventProclaimed, Token: 10, Value: "v4", Revision: 16}))
	if q := took(); len(q) != 1 || q[0].Value != "v4" {
		t.Fatalf("a newer proclaim: %+v", q)
	}
	// A new leader is newer whatever the order: delivered at once.
	o.event(eventMsg(t, streams.ElectionEvent{Resource: name, Event: streams.EventElected, Token: 20, Value: "w1", Revision: 20}))
	if q := took(); len(q) != 1 || q[0].Token != 20 || q[0].Event != streams.EventElected {
		t.Fatalf("a new leader: %+v", q)
	}
}
