package service

import (
	"container/heap"
	"sync"
	"time"
)

// Reasons a request is shed, the label of jetlock_requests_shed_total.
const (
	shedQueueFull = "queue_full" // MaxQueued requests were already waiting
	shedWaited    = "waited"     // it waited longer than QueueWait for its turn
	shedUrgent    = "renewals"   // renewals and releases were waiting: they go first
)

// gate admits requests for processing: at most limit at once; beyond that
// up to maxQueued wait in arrival order. A request whose turn comes after it
// has waited longer than maxWait is shed then, before it has done any store
// work, so that under overload the stream serves only requests whose callers
// are still waiting, and the queue in front of it drains at once.
//
// The queue is what lets a busy instance ride out a stall of its stream (a
// slow fsync, a paused virtual machine) without shedding, while the bound on
// requests processed at once keeps the stream's own queue short: a request
// that times out inside the stream has used it for nothing.
//
// Renewals and releases are urgent: they wait in a queue of their own,
// ordered by when their lease would expire (the closest first), and every
// free place goes to them before any other request. While any of them
// wait, a new request of another kind is shed at once rather than queued:
// under saturation the leases already held are kept, and new work is
// turned away early with a retry_after_ms, before it has cost anything.
type gate struct {
	limit, maxQueued int
	maxWait          time.Duration
	spawn            func(func())
	queuedGauge      func(int) // reports the queue length, or nil

	mu      sync.Mutex
	running int
	queue   []pending // queue[head:] wait, oldest first
	head    int
	urgent  urgentQueue
}

// pending is a request waiting for its turn.
type pending struct {
	at   time.Time   // receipt
	run  func(*slot) // processes it; must release the slot
	shed func(reason string, waited time.Duration)
	// urgent marks a renewal or release, due when its lease expires.
	urgent bool
	due    time.Time
}

// slot is a request's place among those processed at once. A waiting
// acquire gives it back while it waits.
type slot struct {
	once sync.Once
	g    *gate
}

func (sl *slot) release() { sl.once.Do(sl.g.leave) }

// enter runs p at once (through spawn) if fewer than limit requests are
// being processed, queues it if fewer than maxQueued wait, and otherwise
// sheds it.
func (g *gate) enter(p pending) {
	g.mu.Lock()
	switch {
	case g.running < g.limit && (p.urgent || len(g.urgent) == 0):
		g.running++
		g.mu.Unlock()
		g.start(p)
	case p.urgent && len(g.urgent) < max(g.maxQueued, 1):
		heap.Push(&g.urgent, p)
		g.report()
		g.mu.Unlock()
	case p.urgent:
		g.mu.Unlock()
		p.shed(shedQueueFull, 0)
	case len(g.urgent) > 0:
		g.mu.Unlock()
		p.shed(shedUrgent, 0)
	case len(g.queue)-g.head < g.maxQueued:
		g.queue = append(g.queue, p)
		g.report()
		g.mu.Unlock()
	default:
		g.mu.Unlock()
		p.shed(shedQueueFull, 0)
	}
}

func (g *gate) start(p pending) {
	g.spawn(func() { p.run(&slot{g: g}) })
}

// leave hands a finished request's place to the most urgent queued
// renewal or release, or else to the oldest queued request, that has not
// waited too long, shedding those that have.
func (g *gate) leave() {
	now := time.Now()
	var late []pending
	var next pending
	found := false
	g.mu.Lock()
	for len(g.urgent) > 0 && !found {
		p := heap.Pop(&g.urgent).(pending)
		if now.Sub(p.at) > g.maxWait {
			late = append(late, p)
		} else {
			next, found = p, true
		}
	}
	for g.head < len(g.queue) && !found {
		p := g.queue[g.head]
		g.queue[g.head] = pending{}
		g.head++
		if now.Sub(p.at) > g.maxWait {
			late = append(late, p)
		} else {
			next, found = p, true
		}
	}
	switch {
	case g.head == len(g.queue):
		g.queue, g.head = g.queue[:0], 0
	case g.head >= 1024 && 2*g.head >= len(g.queue):
		// Reuse the front half of the backing array.
		n := copy(g.queue, g.queue[g.head:])
		clear(g.queue[n:])
		g.queue, g.head = g.queue[:n], 0
	}
	if !found {
		g.running--
	}
	if len(late) > 0 || found {
		g.report()
	}
	g.mu.Unlock()
	for _, p := range late {
		p.shed(shedWaited, now.Sub(p.at))
	}
	if found {
		g.start(next)
	}
}

// report passes the queue length to queuedGauge; g.mu is held.
func (g *gate) report() {
	if g.queuedGauge != nil {
		g.queuedGauge(len(g.queue) - g.head + len(g.urgent))
	}
}

// load returns the requests being processed and those waiting.
func (g *gate) load() (running, queued int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running, len(g.queue) - g.head + len(g.urgent)
}

// urgentQueue is a heap of urgent requests, the earliest due first (in
// arrival order among equals).
type urgentQueue []pending

func (q urgentQueue) Len() int { return len(q) }
func (q urgentQueue) Less(i, j int) bool {
	if !q[i].due.Equal(q[j].due) {
		return q[i].due.Before(q[j].due)
	}
	return q[i].at.Before(q[j].at)
}
func (q urgentQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *urgentQueue) Push(x any)   { *q = append(*q, x.(pending)) }
func (q *urgentQueue) Pop() any {
	old := *q
	p := old[len(old)-1]
	old[len(old)-1] = pending{}
	*q = old[:len(old)-1]
	return p
}
