package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// Waiting. A waiting acquire that finds the resource held queues a waiter
// record in the bucket at key streams.WaitKey(resource, hash); its ticket
// is the revision that created it, so FIFO order is ticket order, and a
// retry of the same request id finds the same record and keeps its place.
// The record names the wake subject of the serving instance and request.
// Whoever frees the resource (release, expiry, cancel) publishes one
// message to the head waiter's wake subject, so a release wakes only the
// next in line. Wake messages are at-most-once, so every waiter also
// re-checks on a timer. The serving instance rewrites the record every
// third of its liveness window; the sweeper removes a record left
// unrefreshed, so a waiter whose instance died frees its place within
// seconds.

// wakeSubject returns the wake subject of a request served here.
func (s *Service) wakeSubject(hash string) string { return s.wakePrefix + hash }

// onWake routes a wake message to the waiting request it names.
func (s *Service) onWake(m *nats.Msg) {
	hash := m.Subject[len(s.wakePrefix):]
	s.waitMu.Lock()
	ch := s.waiting[hash]
	s.waitMu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// wakeHead wakes the head waiter of the resource whose encoded name is enc,
// if there is one. It is called after the resource became free.
func (s *Service) wakeHead(enc string) {
	w, ok := s.tracker.head(enc, "")
	if !ok || w.wake == "" {
		return
	}
	s.log.Debug("wake head", "resource", enc, "request_id", w.requestID, "ticket", w.ticket)
	if err := s.nc.Publish(w.wake, nil); err != nil {
		s.log.Warn("wake waiter", "err", err)
		return
	}
	s.metrics.wakes.Inc()
}

// mayClaim reports whether request hash may take the free (or expired)
// resource observed in o. The waiter k places behind the head may claim
// once the resource has been free, with no waiter leaving the queue, for k
// reservation periods: the head claims at once, a dead head delays the
// next by one period, and skips keep ticket order too. A request that is
// not queued counts as behind every waiter. It also returns the number of
// waiters ahead of hash.
func (s *Service) mayClaim(enc, hash string, o observation) (bool, int) {
	ahead, left := s.tracker.ahead(enc, hash)
	if ahead == 0 {
		return true, 0
	}
	since := o.seen
	if o.held() {
		since = s.tracker.deadline(&o)
	}
	if left.After(since) {
		since = left
	}
	return time.Since(since) > time.Duration(ahead)*s.cfg.Reservation, ahead
}

// acquireWaiting serves an acquire with wait_ms > 0. The caller has
// validated req.
func (s *Service) acquireWaiting(req *streams.AcquireRequest, key, hash string, ttl, wait time.Duration, sl *slot) (*streams.LeaseResponse, error) {
	if n := s.nWaiting.Add(1); n > int64(s.cfg.MaxWaiting) {
		s.nWaiting.Add(-1)
		return nil, newOpError(streams.CodeTooManyWaiters, "this service instance serves %d waiting acquires, the cap", s.cfg.MaxWaiting)
	}
	defer s.nWaiting.Add(-1)
	deadline := time.Now().Add(wait)
	wkey := streams.WaitKey(req.Resource, hash)
	wake := make(chan struct{}, 1)
	s.waitMu.Lock()
	s.waiting[hash] = wake
	s.waitMu.Unlock()
	defer func() {
		s.waitMu.Lock()
		if s.waiting[hash] == wake {
			delete(s.waiting, hash)
		}
		s.waitMu.Unlock()
	}()

	var (
		queued   observation // our waiter record once queued
		refresh  time.Time
		lastErr  error
		grantTTL = ttl
	)
	recheck := time.NewTimer(0)
	defer recheck.Stop()
	ends := time.NewTimer(wait)
	defer ends.Stop()
	woken := false
	for {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.OpTimeout)
		resp, err, done := s.waitStep(ctx, req, key, wkey, hash, grantTTL, woken, &queued, &refresh)
		cancel()
		woken = false
		if done {
			return resp, err
		}
		lastErr = err
		grantTTL = min(ttl, s.cfg.HandoverTTL)
		if queued.rev != 0 {
			// Waiting costs no store work: give the in-flight slot back.
			sl.release()
		}

		if queued.rec != nil {
			s.log.Debug("waiting", "resource", req.Resource, "request_id", req.RequestID, "ticket", queued.rec.TokenAt(queued.rev), "answer", err)
		}
		recheck.Reset(s.cfg.Recheck)
		select {
		case <-wake:
			woken = true
		case <-recheck.C:
		case <-ends.C:
			return nil, s.leaveQueue(req, wkey, queued, lastErr)
		case <-s.stopping:
			// Leave the record: the caller's retry on another instance
			// keeps its place.
			return nil, fmt.Errorf("%w: service instance stopping; retry with the same request_id", errUnavailable)
		}
		if !time.Now().Before(deadline) {
			return nil, s.leaveQueue(req, wkey, queued, lastErr)
		}
	}
}

// waitStep makes one attempt for a waiting acquire: claim if allowed,
// otherwise queue or refresh the waiter record. done reports a final
// answer in resp and err; otherwise err is the "locked" answer to give if
// the wait ends now.
//
// A woken waiter, and every waiter when its record is due for refresh,
// that finds the lock held in the tracker decides on a read from the
// stream leader: after a leader change the watcher behind the tracker can
// lag by seconds (over 5 s was seen after a partition healed), and a
// waiter that trusted it would sit out the release it was woken for. When
// the tracker already shows the lock free (the release went through this
// instance, or the watcher has seen it), no read is needed.
func (s *Service) waitStep(ctx context.Context, req *streams.AcquireRequest, key, wkey, hash string, ttl time.Duration, woken bool, queued *observation, refresh *time.Time) (resp *streams.LeaseResponse, err error, done bool) {
	defer s.lockKey(key)()
	fresh := false
	if queued.rev != 0 {
		// Our record gone: cancelled (stop, never queue again behind the
		// cancel), taken over by a retry elsewhere (stop; that one serves
		// the caller), or removed because this instance could not refresh
		// it in time (queue again, at the end).
		if o, ok := s.tracker.get(wkey); ok && o.rev > queued.rev && (!o.held() || o.rec.Wake != s.wakeSubject(hash)) {
			if o.held() {
				return nil, newOpError(streams.CodeLeaseLost, "the waiting acquire was taken over by a retry"), true
			}
			cancelled, err := s.wasCancelled(ctx, hash)
			if err != nil {
				return nil, err, true
			}
			if cancelled {
				return nil, newOpError(streams.CodeLeaseLost, "the waiting acquire was cancelled"), true
			}
			*queued = observation{}
		}
		// Skip the store while the tracker says the lock is held, unless
		// woken or due to refresh: then read it from the stream leader.
		if o, ok := s.tracker.get(key); ok && o.held() && !s.tracker.expired(o, time.Now()) && o.rec.RequestID != req.RequestID {
			if !woken && time.Now().Before(*refresh) {
				return nil, lockedError(o), false
			}
			fresh = true
		}
	}
	resp, err = s.tryGrant(ctx, req, key, hash, ttl, fresh)
	var oe *opError
	if err == nil || !errors.As(err, &oe) || oe.code != streams.CodeLocked {
		if err == nil && queued.rev != 0 {
			if _, derr := s.deleteKey(ctx, wkey); derr != nil {
				s.log.Warn("remove granted waiter", "resource", req.Resource, "err", derr)
			}
		}
		return resp, err, true
	}
	if queued.rev == 0 || !time.Now().Before(*refresh) {
		o, qerr := s.enqueue(ctx, req, wkey, hash, queued.rev)
		if qerr != nil {
			var qe *opError
			if errors.As(qerr, &qe) {
				return nil, qerr, true
			}
			s.log.Warn("queue waiter", "resource", req.Resource, "err", qerr)
			return nil, err, false
		}
		*queued = o
		*refresh = time.Now().Add(s.cfg.WaiterLiveness / 3)
	}
	return nil, err, false
}

// enqueue creates the waiter record, or rewrites it (same ticket) to
// refresh its liveness and point it at this instance. The caller holds the
// lease key's stripe lock; waiter keys are written only under it.
func (s *Service) enqueue(ctx context.Context, req *streams.AcquireRequest, wkey, hash string, mine uint64) (observation, error) {
	fresh := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		o, err := s.current(ctx, wkey, fresh)
		if err != nil {
			return observation{}, err
		}
		if mine != 0 && (!o.held() || o.rev != mine && o.rec.Wake != s.wakeSubject(hash)) {
			if !fresh {
				fresh = true
				continue
			}
			if o.held() {
				return observation{}, newOpError(streams.CodeLeaseLost, "the waiting acquire was taken over by a retry")
			}
			cancelled, err := s.wasCancelled(ctx, hash)
			if err != nil {
				return observation{}, err
			}
			if cancelled {
				return observation{}, newOpError(streams.CodeLeaseLost, "the waiting acquire was cancelled")
			}
			mine = 0 // removed while this instance could not refresh it: queue again
		}
		now := s.cfg.Clock.Now()
		rec := &streams.Record{
			Owner: req.Owner, RequestID: req.RequestID, TTLms: s.cfg.WaiterLiveness.Milliseconds(),
			GrantedAt: streams.FormatTime(now), Wake: s.wakeSubject(hash),
		}
		if o.held() {
			rec.Token = o.rec.TokenAt(o.rev) // keep the ticket
			rec.GrantedAt = o.rec.GrantedAt
		} else {
			n, owned := s.tracker.waiterCounts(streams.EncodeResource(req.Resource), req.Owner)
			if n >= s.cfg.MaxWaitersPerResource {
				return observation{}, newOpError(streams.CodeTooManyWaiters, "resource has %d waiters, the cap", n)
			}
			if req.Owner != "" && owned >= s.cfg.MaxWaitersPerOwner {
				return observation{}, newOpError(streams.CodeTooManyWaiters, "owner %q has %d waiters, the cap", req.Owner, owned)
			}
		}
		rec.RenewedAt = streams.FormatTime(now)
		rec.ExpiresAt = streams.FormatTime(now.Add(s.cfg.WaiterLiveness))
		seq, _, err := s.store.put(ctx, wkey, rec, o.rev, "")
		if errors.Is(err, errConflict) {
			fresh = true
			continue
		}
		if err != nil {
			s.tracker.forget(wkey)
			return observation{}, err
		}
		return s.tracker.observe(wkey, entry{rev: seq, rec: rec}), nil
	}
	return observation{}, fmt.Errorf("%w: %d attempts lost to concurrent writers", errConflict, maxAttempts)
}

// wasCancelled reports whether the request named by hash was cancelled
// within the retry window: its cancel tombstone exists (read from the
// stream leader).
func (s *Service) wasCancelled(ctx context.Context, hash string) (bool, error) {
	e, err := s.store.read(ctx, "cancel."+hash)
	if err != nil {
		return false, err
	}
	return e.held(), nil
}

// leaveQueue ends a wait that ran out: it removes the waiter record and,
// if the resource is free, wakes the next waiter (this one may have been
// the head). It returns the "locked" answer.
func (s *Service) leaveQueue(req *streams.AcquireRequest, wkey string, queued observation, lastErr error) error {
	key := streams.LeaseKey(req.Resource)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.OpTimeout)
	defer cancel()
	defer s.lockKey(key)()
	if queued.rev != 0 {
		if _, err := s.deleteKey(ctx, wkey); err != nil {
			s.log.Warn("remove waiter", "resource", req.Resource, "err", err)
		}
		if o, ok := s.tracker.get(key); ok && !o.held() {
			s.wakeHead(streams.EncodeResource(req.Resource))
		}
	}
	if lastErr == nil {
		lastErr = newOpError(streams.CodeLocked, "wait ended")
	}
	return lastErr
}

// deleteKey deletes whatever record is at key (a waiter record) by
// compare-and-set, and reports whether there was one.
func (s *Service) deleteKey(ctx context.Context, key string) (bool, error) {
	return s.deleteIf(ctx, key, func(*streams.Record) bool { return true })
}
