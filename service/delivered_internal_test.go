package service

import "testing"

// A wait is woken by the delivery of its revision or a later one, not
// before; a revision already delivered needs no wait; the watcher's stop
// wakes every wait.
func TestDeliveriesWakeOnlyWhatTheyReach(t *testing.T) {
	var d deliveries
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
