package service

import (
	"container/heap"
	"sync"
)

// deliveries is what the watcher has delivered, for the decisions that
// rest on the stream's order (a grant to a session, see validInSession):
// the last revision, and the sessions live as of that revision. It is fed
// by the watcher alone, never by reads or by this instance's own writes,
// so it is always the state of a prefix of the stream.
//
// It also tells the requests that wait for a revision's delivery when it
// has come: each waits on a channel of its own, closed once the watcher
// has delivered its revision, so a delivery wakes only the requests it
// concerns, however many wait.
type deliveries struct {
	mu    sync.Mutex
	at    uint64 // the last revision delivered
	waits revWaits
	// ready is set once the current watcher has delivered every existing
	// record; sessions holds the secret of every live session by hash.
	ready    bool
	sessions map[string]string
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

// restart forgets what an earlier watcher delivered: a new one delivers
// every record again before it is ready.
func (d *deliveries) restart() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ready, d.at, d.sessions = false, 0, map[string]string{}
}

// caughtUp notes that the watcher has delivered every existing record.
func (d *deliveries) caughtUp() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ready = true
}

// session notes the delivery of e at session key key.
func (d *deliveries) session(key string, e entry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sessions == nil {
		d.sessions = map[string]string{}
	}
	if hash := sessionHashOf(key); e.held() {
		d.sessions[hash] = e.rec.LeaseID
	} else {
		delete(d.sessions, hash)
	}
}

// liveAt reports, once every revision up to rev has been delivered
// (known), whether session hash is live as of the last delivery, holding
// secret when secret is not empty.
func (d *deliveries) liveAt(hash, secret string, rev uint64) (live, known bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.ready || d.at < rev {
		return false, false
	}
	got, ok := d.sessions[hash]
	return ok && (secret == "" || sameLease(got, secret)), true
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
