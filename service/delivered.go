package service

import (
	"container/heap"
	"sync"
)

// deliveries tells the requests that wait for the watcher to deliver a
// revision (a grant to a session, see validInSession; a session's end,
// see awaitDelivered) when it has: each waits on a channel of its own,
// closed once the watcher has delivered its revision, so a delivery wakes
// only the requests it concerns, however many wait.
type deliveries struct {
	mu    sync.Mutex
	at    uint64 // the last revision delivered
	waits revWaits
}

// revWait is one request's wait for revision rev.
type revWait struct {
	rev  uint64
	done chan struct{}
}

// revWaits is a min-heap of waits by revision.
type revWaits []revWait

func (q revWaits) Len() int           { return len(q) }
func (q revWaits) Less(i, j int) bool { return q[i].rev < q[j].rev }
func (q revWaits) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *revWaits) Push(x any)        { *q = append(*q, x.(revWait)) }
func (q *revWaits) Pop() any {
	old := *q
	w := old[len(old)-1]
	*q = old[:len(old)-1]
	return w
}

// closedChan is the wait of a revision already delivered.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// wait returns a channel closed once rev has been delivered (or the
// watcher has stopped: the waiter then checks what was delivered).
func (d *deliveries) wait(rev uint64) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at >= rev {
		return closedChan
	}
	w := revWait{rev: rev, done: make(chan struct{})}
	heap.Push(&d.waits, w)
	return w.done
}

// delivered notes that the watcher has delivered rev, and wakes every
// wait for it or an earlier revision.
func (d *deliveries) delivered(rev uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rev > d.at {
		d.at = rev
	}
	for len(d.waits) > 0 && d.waits[0].rev <= d.at {
		close(heap.Pop(&d.waits).(revWait).done)
	}
}

// stopped wakes every wait: the watcher has stopped, and a wait whose
// revision it did not deliver gives up rather than linger.
func (d *deliveries) stopped() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, w := range d.waits {
		close(w.done)
	}
	d.waits = nil
}
