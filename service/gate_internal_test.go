package service

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// gateLog records what a gate did with the requests it was given.
type gateLog struct {
	mu      sync.Mutex
	started []string
	shed    []string // name:reason
	slots   map[string]*slot
}

func newGateLog() *gateLog {
	return &gateLog{slots: map[string]*slot{}}
}

// pending returns a request named name, received at at, whose processing
// only records its slot: the test releases it.
func (l *gateLog) pending(name string, at time.Time) pending {
	return pending{
		at: at,
		run: func(sl *slot) {
			l.mu.Lock()
			l.started = append(l.started, name)
			l.slots[name] = sl
			l.mu.Unlock()
		},
		shed: func(reason string, _ time.Duration) {
			l.mu.Lock()
			l.shed = append(l.shed, name+":"+reason)
			l.mu.Unlock()
		},
	}
}

func (l *gateLog) finish(name string) {
	l.mu.Lock()
	sl := l.slots[name]
	l.mu.Unlock()
	sl.release()
}

func (l *gateLog) state() (started, shed []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.started), slices.Clone(l.shed)
}

// spawnNow runs f in the caller's goroutine, so that the order of starts is
// the order the gate chose.
func spawnNow(f func()) { f() }

// Beyond limit the gate queues requests and starts them in arrival order as
// places free; beyond the queue it sheds at once.
func TestGateQueuesInArrivalOrder(t *testing.T) {
	l := newGateLog()
	var gauge []int
	g := &gate{limit: 2, maxQueued: 3, maxWait: time.Hour, spawn: spawnNow, queuedGauge: func(n int) { gauge = append(gauge, n) }}
	now := time.Now()
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		g.enter(l.pending(n, now))
	}
	started, shed := l.state()
	if !slices.Equal(started, []string{"a", "b"}) || !slices.Equal(shed, []string{"f:" + shedQueueFull}) {
		t.Fatalf("after six arrivals: started %v, shed %v; want a b started and f shed (queue full)", started, shed)
	}
	if r, q := g.load(); r != 2 || q != 3 {
		t.Fatalf("load %d running %d queued, want 2 and 3", r, q)
	}
	l.finish("b")
	l.finish("a")
	l.finish("c")
	started, _ = l.state()
	if !slices.Equal(started, []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("started %v, want the queued ones in arrival order c d e", started)
	}
	l.finish("c") // a second release of one slot changes nothing
	if r, q := g.load(); r != 2 || q != 0 {
		t.Fatalf("load %d running %d queued, want 2 (d, e) and 0", r, q)
	}
	l.finish("d")
	l.finish("e")
	if r, q := g.load(); r != 0 || q != 0 {
		t.Fatalf("load after all finished: %d running %d queued, want 0 and 0", r, q)
	}
	if !slices.Equal(gauge, []int{1, 2, 3, 2, 1, 0}) {
		t.Fatalf("queue gauge went %v, want 1 2 3 2 1 0", gauge)
	}
}

// A request whose turn comes after it waited longer than maxWait is shed
// then, without running, and its place goes to the next in line.
func TestGateShedsRequestsThatWaitedTooLong(t *testing.T) {
	l := newGateLog()
	g := &gate{limit: 1, maxQueued: 10, maxWait: time.Second, spawn: spawnNow}
	now := time.Now()
	g.enter(l.pending("a", now))
	g.enter(l.pending("old1", now.Add(-2*time.Second)))
	g.enter(l.pending("old2", now.Add(-1500*time.Millisecond)))
	g.enter(l.pending("fresh", now))
	l.finish("a")
	started, shed := l.state()
	if !slices.Equal(started, []string{"a", "fresh"}) || !slices.Equal(shed, []string{"old1:" + shedWaited, "old2:" + shedWaited}) {
		t.Fatalf("started %v, shed %v; want fresh to run after a, and both old ones shed for waiting", started, shed)
	}
	// With nothing left to run, the place is given back.
	g.enter(l.pending("late", now.Add(-time.Minute)))
	l.finish("fresh")
	if r, q := g.load(); r != 0 || q != 0 {
		t.Fatalf("load %d running %d queued, want 0 and 0", r, q)
	}
	if _, shed = l.state(); !slices.Contains(shed, "late:"+shedWaited) {
		t.Fatalf("shed %v: the late request should be among them", shed)
	}
}

// With no queue the gate sheds every request beyond limit, as the service
// did before it had a queue.
func TestGateWithoutQueue(t *testing.T) {
	l := newGateLog()
	g := &gate{limit: 1, maxQueued: 0, maxWait: time.Second, spawn: spawnNow}
	g.enter(l.pending("a", time.Now()))
	g.enter(l.pending("b", time.Now()))
	if started, shed := l.state(); !slices.Equal(started, []string{"a"}) || !slices.Equal(shed, []string{"b:" + shedQueueFull}) {
		t.Fatalf("started %v, shed %v", started, shed)
	}
}

// In a queue that never empties the backing array is reused, not grown
// with every request that ever passed through.
func TestGateQueueCompacts(t *testing.T) {
	l := newGateLog()
	g := &gate{limit: 1, maxQueued: 100, maxWait: time.Hour, spawn: spawnNow}
	now := time.Now()
	name := func(i int) string { return "r" + strconv.Itoa(i) }
	for i := range 51 {
		g.enter(l.pending(name(i), now)) // r0 runs, 50 wait
	}
	for i := 51; i < 10051; i++ {
		g.enter(l.pending(name(i), now))
		l.finish(name(i - 51)) // the oldest running finishes; the next starts
		if r, q := g.load(); r != 1 || q != 50 {
			t.Fatalf("after %d arrivals: %d running, %d queued; want 1 and 50", i+1, r, q)
		}
	}
	g.mu.Lock()
	capacity := cap(g.queue)
	g.mu.Unlock()
	if capacity > 4096 {
		t.Fatalf("queue array has room for %d after 10,000 passed with 50 waiting: it is not reused", capacity)
	}
	started, _ := l.state()
	for i, n := range started {
		if n != name(i) {
			t.Fatalf("start %d was %s, want %s: arrival order lost", i, n, name(i))
		}
	}
}

// Renewals and releases go first, the lease closest to expiry first, and
// while any wait a new request of another kind is shed at once; one queued
// earlier still runs after them.
func TestGateServesRenewalsFirstByExpiry(t *testing.T) {
	l := newGateLog()
	g := &gate{limit: 1, maxQueued: 10, maxWait: time.Minute, spawn: spawnNow}
	now := time.Now()
	urgent := func(name string, due time.Duration) pending {
		p := l.pending(name, now)
		p.urgent, p.due = true, now.Add(due)
		return p
	}
	g.enter(l.pending("running", now))
	g.enter(l.pending("acquire-before", now))
	g.enter(urgent("renew-late", 20*time.Second))
	g.enter(urgent("renew-soon", 2*time.Second))
	g.enter(urgent("release", 10*time.Second))
	g.enter(l.pending("acquire-after", now))
	for _, name := range []string{"running", "renew-soon", "release", "renew-late"} {
		l.finish(name)
	}
	started, shed := l.state()
	want := []string{"running", "renew-soon", "release", "renew-late", "acquire-before"}
	if !slices.Equal(started, want) {
		t.Fatalf("started %v, want %v", started, want)
	}
	if !slices.Equal(shed, []string{"acquire-after:" + shedUrgent}) {
		t.Fatalf("shed %v, want the acquire that came while renewals waited", shed)
	}
	if running, queued := g.load(); running != 1 || queued != 0 {
		t.Fatalf("load %d running, %d queued", running, queued)
	}
}

// A request's context ends budget to budget+deadlineStep after its
// receipt, requests received together share one, and one received
// earlier (it waited in the queue) ends earlier.
func TestDeadlines(t *testing.T) {
	const budget = 200 * time.Millisecond
	d := newDeadlines(budget)
	start := time.Now()
	ctx := d.get(start)
	dl, ok := ctx.Deadline()
	if !ok {
		t.Fatal("no deadline")
	}
	if dl.Before(start.Add(budget)) || dl.After(start.Add(budget+deadlineStep)) {
		t.Fatalf("deadline %v after receipt, want %v to %v", dl.Sub(start), budget, budget+deadlineStep)
	}

	// A request that waited 150ms keeps only the rest of the budget.
	waited := start.Add(-150 * time.Millisecond)
	early, _ := d.get(waited).Deadline()
	if early.Before(waited.Add(budget)) || early.After(waited.Add(budget+deadlineStep)) {
		t.Fatalf("deadline of a request received 150ms earlier: %v after its receipt, want %v to %v", early.Sub(waited), budget, budget+deadlineStep)
	}

	distinct := map[context.Context]bool{}
	for range 1000 {
		distinct[d.get(time.Now())] = true
	}
	if elapsed := time.Since(start); len(distinct) > int(elapsed/deadlineStep)+2 {
		t.Fatalf("%d contexts for 1000 requests in %v, want one per %v step", len(distinct), elapsed, deadlineStep)
	}
	// Around a step's end requests are handled slightly out of receipt
	// order: the previous step's context is still shared.
	now := time.Now()
	a, b := d.get(now), d.get(now.Add(deadlineStep))
	if a2, b2 := d.get(now), d.get(now.Add(deadlineStep)); a2 != a || b2 != b || a == b {
		t.Fatal("two adjacent steps asked for alternately do not keep one context each")
	}

	<-ctx.Done()
	if took := time.Since(start); took < budget {
		t.Fatalf("ended after %v, before its budget %v", took, budget)
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("ended with %v", ctx.Err())
	}
	if late := d.get(time.Now()); late == ctx {
		t.Fatal("a request after the deadline got the ended context")
	}
}
