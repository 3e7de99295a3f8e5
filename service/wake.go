package service

import (
	"log/slog"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// wakes carries wake messages to waiting requests. Each waiting request
// served here has a wake subject of its own, prefix + request hash; a wake
// message on it either carries the grant that handed the waiter the
// resource (its reply, no round trip needed) or is empty (check again).
// A wake for a request this instance serves is delivered in-process,
// without a message: on a hot lock most hand-overs are between requests
// of one instance.
// Wake subjects lie under the service's prefix: the service never
// publishes a reply there, and deploy/'s permissions let only the
// service's user publish there, so a grant on a wake subject comes from an
// instance.
type wakes struct {
	nc     *nats.Conn // the request connection
	prefix string     // "<prefix>.wake.<instance>."
	log    *slog.Logger
	sent   func()

	mu      sync.Mutex
	waiting map[string]chan *streams.LeaseResponse

	// rechecks spaces the reads from the stream leader that idle waiters
	// make without a wake: when each queue key is next due one, on this
	// instance (recheckDue).
	recheckEvery time.Duration
	recheckMu    sync.Mutex
	rechecks     map[string]time.Time
	pruneAt      time.Time
}

// recheckDue reports whether a waiter of the queue at key should check
// the lock on the stream leader now, though it was not woken: wake
// messages are at-most-once, and the tracker's view may lag after a leader
// change. One waiter of a queue is told so every recheckEvery, whatever
// the number of its waiters; what it reads brings the tracker up to date
// for all of them.
func (w *wakes) recheckDue(key string) bool {
	now := time.Now()
	w.recheckMu.Lock()
	defer w.recheckMu.Unlock()
	if w.rechecks == nil {
		w.rechecks = make(map[string]time.Time)
	}
	if now.After(w.pruneAt) {
		// Forget the queues no waiter asked about lately: the map holds
		// the queues waited on now, not every queue ever waited on.
		for k, at := range w.rechecks {
			if now.After(at) {
				delete(w.rechecks, k)
			}
		}
		w.pruneAt = now.Add(w.recheckEvery)
	}
	if at, ok := w.rechecks[key]; ok && now.Before(at) {
		return false
	}
	w.rechecks[key] = now.Add(w.recheckEvery)
	return true
}

// subject returns the wake subject of a request served here.
func (w *wakes) subject(hash string) string { return w.prefix + hash }

// register returns the channel that receives the wakes of request hash
// until unregister.
func (w *wakes) register(hash string) chan *streams.LeaseResponse {
	ch := make(chan *streams.LeaseResponse, 1)
	w.mu.Lock()
	w.waiting[hash] = ch
	w.mu.Unlock()
	return ch
}

func (w *wakes) unregister(hash string, ch chan *streams.LeaseResponse) {
	w.mu.Lock()
	if w.waiting[hash] == ch {
		delete(w.waiting, hash)
	}
	w.mu.Unlock()
}

// onMsg routes a wake message from another instance to the waiting
// request it names.
func (w *wakes) onMsg(m *nats.Msg) {
	var grant *streams.LeaseResponse
	if len(m.Data) > 0 {
		grant = new(streams.LeaseResponse)
		if err := jsonv2.Unmarshal(m.Data, grant); err != nil || grant.LeaseID == "" || grant.Token == 0 {
			w.log.Warn("malformed wake message", "subject", m.Subject, "err", err)
			return
		}
	}
	w.deliver(m.Subject[len(w.prefix):], grant)
}

// deliver hands a wake to the waiting request hash, if it still waits
// here. A grant replaces an empty wake still unread; an empty wake never
// replaces a grant.
func (w *wakes) deliver(hash string, grant *streams.LeaseResponse) {
	w.mu.Lock()
	ch := w.waiting[hash]
	w.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case ch <- grant:
		return
	default:
	}
	if grant == nil {
		return
	}
	select { // an empty wake is waiting: the grant replaces it
	case <-ch:
	default:
	}
	select {
	case ch <- grant:
	default:
	}
}

// send wakes the waiting request of subject, with grant if given: in
// process when this instance serves it, otherwise by a message to
// subject.
func (w *wakes) send(subject string, grant *streams.LeaseResponse) {
	if subject == "" {
		return
	}
	if hash, ok := strings.CutPrefix(subject, w.prefix); ok {
		w.deliver(hash, grant)
		w.sent()
		return
	}
	var body []byte
	if grant != nil {
		buf := encode(grant)
		defer buf.free()
		body = buf.b
	}
	if err := w.nc.Publish(subject, body); err != nil {
		w.log.Warn("wake waiter", "err", err)
		return
	}
	w.sent()
}
