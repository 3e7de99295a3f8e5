package service

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// waitSteps is a waiting acquire's decisions: a single resource's
// (waiter) or a set's (setWaiter).
type waitSteps interface {
	// step makes one attempt (see waiter.step).
	step(ctx context.Context, woken bool) (resp any, done bool, err error)
	// leave ends the wait (see waiter.leave).
	leave(ctx context.Context, last error) (any, error)
	// queued reports whether the wait holds its place in the queue.
	queued() bool
	// endsAt tells the wait when it ends, before its first step: its
	// records live no longer than that plus the liveness window.
	endsAt(time.Time)
}

// singleWait is the waitSteps of one resource.
type singleWait struct{ w *waiter }

func (sw singleWait) step(ctx context.Context, woken bool) (any, bool, error) {
	resp, done, err := sw.w.step(ctx, woken)
	if resp == nil {
		return nil, done, err
	}
	return resp, done, err
}

func (sw singleWait) leave(ctx context.Context, last error) (any, error) {
	resp, err := sw.w.leave(ctx, last)
	if resp == nil {
		return nil, err
	}
	return resp, err
}

func (sw singleWait) queued() bool { return sw.w.queued.rev != 0 }

func (sw singleWait) endsAt(t time.Time) { sw.w.until = t }

// waits runs an instance's waiting acquires, each in its request's
// goroutine.
type waits struct{ *Service }

// wait serves the waiting acquire w, whose wake messages come to hash,
// for at most wait.
func (s waits) wait(w waitSteps, hash string, wait time.Duration, sl *slot) (any, error) {
	if n := s.nWaiting.Add(1); n > int64(s.cfg.MaxWaiting) {
		s.nWaiting.Add(-1)
		return nil, newOpError(streams.CodeTooManyWaiters, "this service instance serves %d waiting acquires, the cap", s.cfg.MaxWaiting)
	}
	defer s.nWaiting.Add(-1)
	wake := s.wakes.register(hash)
	defer s.wakes.unregister(hash, wake)

	deadline := time.Now().Add(wait)
	w.endsAt(deadline)
	recheck := time.NewTimer(0)
	defer recheck.Stop()
	ends := time.NewTimer(wait)
	defer ends.Stop()
	woken := false
	for {
		resp, done, err := s.waitStep(w, woken)
		if done {
			if err != nil && !errors.Is(err, errStopping) {
				// An error ends the wait: its record must not delay the
				// next claimant.
				return s.leave(w, err)
			}
			return resp, err
		}
		woken = false
		if w.queued() {
			sl.release()
		}
		next := s.cfg.Recheck
		if errors.Is(err, errBusy) && !w.queued() {
			// Not queued: the resource's line of requests was full
			// (MaxPerKey), as when many waits arrive at once. Try again
			// soon, each at a moment of its own, rather than all together
			// a re-check later.
			next = time.Millisecond + rand.N(s.cfg.Recheck/4+1)
		}
		recheck.Reset(next)
		select {
		case grant := <-wake:
			if grant != nil {
				return grant, nil // handed over: committed before it was sent
			}
			woken = true
		case <-recheck.C:
		case <-ends.C:
			return s.leave(w, err)
		case <-s.stopping:
			// Leave the record: the caller's retry on another instance
			// keeps its place.
			return nil, fmt.Errorf("%w: %w; retry with the same request_id", errUnavailable, errStopping)
		}
		if !time.Now().Before(deadline) {
			return s.leave(w, err)
		}
	}
}

// errStopping: the instance is shutting down.
var errStopping = errors.New("service instance stopping")

// waitStep runs one step of w within OpTimeout.
func (s waits) waitStep(w waitSteps, woken bool) (any, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.OpTimeout)
	defer cancel()
	return w.step(ctx, woken)
}

// leave ends w's wait within OpTimeout (see waiter.leave).
func (s waits) leave(w waitSteps, last error) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.OpTimeout)
	defer cancel()
	return w.leave(ctx, last)
}
