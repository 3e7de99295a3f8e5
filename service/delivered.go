package service

import (
	"container/heap"
	"sync"
	"time"
)

// deliveries is what the watcher has delivered, for the decisions that
// rest on the stream's order (a grant to a session, see validInSession):
// the last revision, the sessions live as of that revision, and where
// the sessions that ended lately ended, so that a grant is judged by
// its session's life at the grant's own revision, not at the last
// delivery (a session closed between a grant and its check did not make
// the grant an orphan). It is fed by the watcher alone, never by reads or
// by this instance's own writes: what it shows live was live in the stream.
// It is not every write, though: the bucket keeps only the last record of
// each key, and a watcher that resumes from a sequence (nats.go's ordered
// consumer does, when it has lost its consumer) or lags delivers only the
// records still there, so a session opened and kept alive meanwhile is
// first delivered at its keepalive, and one ended meanwhile never shows
// live. A session it does not show live may have been live: liveAt's
// negative is proven on the stream leader (sessionOps.notLiveAt), unless
// the watcher delivered the session's end before the grant
// (endedEarlier): that end is committed, and a read of a stream leader
// cut off by a partition could still show the session live.
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
	// ended and endedBefore hold the secret and end revision of the
	// sessions whose end was delivered lately, by hash: two generations
	// of at most endedKeep each, the older dropped when the newer fills,
	// so memory stays bounded however many sessions end. A session
	// forgotten so is judged ended at every revision: a grant checked that
	// late (long after OpTimeout) is refused, never wrongly answered.
	ended, endedBefore map[string]endedSession
	// lastEnd is when the last end was noted; sessionsPeak the most live
	// sessions since that map was made (see shrink.go).
	lastEnd      time.Time
	sessionsPeak mapPeak
}

// forget drops the ended sessions once no session has ended for keep (as
// the sweep calls it), and makes the map of live sessions anew when it
// has shrunk: a churn of sessions leaves nothing behind. keep covers the
// time a grant waits for its check (OpTimeout and more): a session
// forgotten is judged ended at every revision, which refuses a grant
// checked later than that, never answers one wrongly.
func (d *deliveries) forget(now time.Time, keep time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if (d.ended != nil || d.endedBefore != nil) && now.Sub(d.lastEnd) > keep {
		d.ended, d.endedBefore = nil, nil
	}
	d.sessions = shrinkMap(d.sessions, &d.sessionsPeak)
}

// endedSession is where a session ended, for liveAt.
type endedSession struct {
	secret string
	rev    uint64
}

// endedKeep bounds each generation of deliveries' ended sessions: many
// times the sessions that end within the time a grant waits for its
// check, at the design load.
const endedKeep = 1 << 14

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
// every record again before it is ready. Where sessions ended is kept: it
// is a fact of the stream, whichever watcher delivered it.
func (d *deliveries) restart() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ready, d.at, d.sessions, d.sessionsPeak = false, 0, map[string]string{}, 0
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
	hash := sessionHashOf(key)
	if e.held() {
		d.sessions[hash] = e.rec.LeaseID
		d.sessionsPeak.note(len(d.sessions))
		return
	}
	if secret, ok := d.sessions[hash]; ok {
		delete(d.sessions, hash)
		if len(d.ended) >= endedKeep || d.ended == nil {
			d.endedBefore, d.ended = d.ended, make(map[string]endedSession, min(len(d.ended), endedKeep))
		}
		d.ended[hash] = endedSession{secret: secret, rev: e.rev}
		d.lastEnd = time.Now()
	}
}

// liveAt reports, once every revision up to rev has been delivered
// (known), whether session hash was live at revision rev, holding secret
// when secret is not empty: live as of the last delivery, or ended after
// rev. (Every grant checked here was asked for by a caller who had the
// session, so it was opened before the grant.) Not live means not shown
// live: a session whose records the watcher skipped (see deliveries) is
// not shown until its last record is delivered, if ever.
func (d *deliveries) liveAt(hash, secret string, rev uint64) (live, known bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.ready || d.at < rev {
		return false, false
	}
	if got, ok := d.sessions[hash]; ok && (secret == "" || sameLease(got, secret)) {
		return true, true
	}
	for _, gen := range []map[string]endedSession{d.ended, d.endedBefore} {
		if e, ok := gen[hash]; ok && e.rev > rev && (secret == "" || sameLease(e.secret, secret)) {
			return true, true
		}
	}
	return false, true
}

// endedEarlier reports, once every revision up to rev has been delivered,
// whether the last end of session hash that the watcher delivered (of the
// session holding secret, when secret is not empty) came before rev, no
// session of that hash live since. That end is committed in the stream,
// so a grant at rev is an orphan, known without a read.
func (d *deliveries) endedEarlier(hash, secret string, rev uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.ready || d.at < rev {
		return false
	}
	if _, live := d.sessions[hash]; live {
		return false
	}
	e, ok := d.ended[hash]
	if !ok {
		e, ok = d.endedBefore[hash]
	}
	return ok && e.rev < rev && (secret == "" || sameLease(e.secret, secret))
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
