package service

import (
	"slices"
	"sync"
	"time"
)

// workerIdle is how long a worker waits for another request before it
// exits: between one and two times this.
const workerIdle = 10 * time.Second

// workers runs requests on goroutines kept for the next request, because
// a fresh goroutine grows its stack several times over during a request,
// copying it each time.
//
// The idle workers form a stack: a request goes to the worker that became
// idle last. Handed out in turn instead, every worker that a burst once
// created would stay in use, and the collector, which shrinks the stacks
// of parked goroutines at each cycle, would have each of them grow its
// stack again on its next request; handed out last-in first-out, only as
// many workers as the load needs stay in use, and the rest exit.
type workers struct {
	done <-chan struct{} // closed when the service has finished: workers exit

	mu   sync.Mutex
	idle []*worker // idle[len-1] became idle last
	tick uint64    // periods of idle seen by reap
}

// worker is one worker goroutine; it receives its next request on next, or
// nil when it is to exit.
type worker struct {
	next chan func()
	tick uint64 // the pool's tick when it last became idle
}

// newWorkers returns a pool whose workers exit when done is closed, and,
// while reap runs, after one to two idle periods without a request.
func newWorkers(done <-chan struct{}) *workers {
	return &workers{done: done}
}

// spawn runs f on the worker that became idle last, or on a new one.
func (p *workers) spawn(f func()) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.next <- f // buffered: only spawn sends, to a worker it took off idle
		return
	}
	p.mu.Unlock()
	go p.run(&worker{next: make(chan func(), 1)}, f)
}

// run runs f and then the requests spawn hands w.
func (p *workers) run(w *worker, f func()) {
	for f != nil {
		f()
		p.mu.Lock()
		w.tick = p.tick
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		select {
		case f = <-w.next:
		case <-p.done:
			if p.remove(w) {
				return
			}
			// spawn took it off idle and is handing it a request, or
			// reap did, just before done, and is telling it to exit.
			f = <-w.next
		}
	}
}

// remove takes w off the idle stack, and reports whether it was there.
func (p *workers) remove(w *worker) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.Index(p.idle, w)
	if i < 0 {
		return false
	}
	p.idle = slices.Delete(p.idle, i, i+1)
	return true
}

// reap tells the workers that stayed idle for a whole period to exit,
// until done is closed. The longest idle are at the bottom of the stack,
// so it takes them from there. It needs no timer per request: a worker's
// idle start is the tick it became idle in.
func (p *workers) reap(period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-p.done:
			return
		}
		p.mu.Lock()
		n := 0
		for n < len(p.idle) && p.idle[n].tick < p.tick {
			p.idle[n].next <- nil
			n++
		}
		p.idle = slices.Delete(p.idle, 0, n)
		p.tick++
		p.mu.Unlock()
	}
}
