package service

import "time"

// workerIdle is how long a worker waits for another request before it
// exits: between one and two times this.
const workerIdle = 10 * time.Second

// spawn runs f on an idle worker goroutine, or on a new one. Workers are
// kept for the next request because a fresh goroutine grows its stack
// several times over during a request, copying it each time.
func (s *Service) spawn(f func()) {
	select {
	case s.work <- f:
	default:
		go s.worker(f)
	}
}

// worker runs f and then the requests spawn hands it. Its idle timer is
// not re-armed after every request (a timer reset per request is a
// measurable share of the service's CPU at the design load): it ticks
// every workerIdle, and the worker exits at a tick if it ran nothing since
// the one before.
func (s *Service) worker(f func()) {
	idle := time.NewTicker(s.workerIdle)
	defer idle.Stop()
	for {
		f()
		ran := true
		for f = nil; f == nil; {
			select {
			case f = <-s.work:
			case <-idle.C:
				if !ran {
					return
				}
				ran = false
			case <-s.done:
				return
			}
		}
	}
}
