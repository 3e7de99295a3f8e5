package service

import (
	"context"
	"sync"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// sweepParallel bounds the expiry writes in flight at once.
const sweepParallel = 64

// sweeper is an instance's background sweep: the expiry of what has
// stood for its TTL, and the retirement of idle name records.
type sweeper struct{ *Service }

// sweep ends, every SweepInterval, the leases (and stale waiter records,
// and foreign values) whose revision has stood unchanged for their TTL
// plus grace since this instance first saw it (handoverOps.expire). Due times
// come from the tracker's heap, so a sweep costs in proportion to what
// expires.
func (s sweeper) sweep(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	sem := make(chan struct{}, sweepParallel)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.follow.deliveries.forget(time.Now(), s.tracker.window+s.cfg.QueueWait+s.cfg.OpTimeout)
		s.retireIdle(ctx)
		for _, it := range s.tracker.popDue(time.Now(), 4096) {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func(it dueItem) {
				defer func() { <-sem; wg.Done() }()
				ectx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
				defer cancel()
				s.locks.handover.expire(ectx, it)
			}(it)
		}
	}
}

// retireIdle retires the name records of the semaphores that have had no
// permit held, as this instance knows it, for the retry window (nor a
// waiter): the same proof as a grant of another kind makes
// (nameOps.retireName), so a permit held after all refuses it and one
// granted meanwhile fails it. Every instance may try; the compare-and-set
// lets one succeed.
func (s sweeper) retireIdle(ctx context.Context) {
	for _, name := range s.tracker.nameIx.idleSemaphores(time.Now(), 64) {
		key := streams.LeaseKey(name)
		o, ok := s.tracker.get(key)
		if !ok || o.sem == 0 || s.tracker.nameIx.permitLimit(name) != 0 {
			continue
		}
		if _, waited := s.tracker.head(streams.EncodeResource(streams.PermitQueue(name))); waited {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
		_, out, err := s.locks.names.retireName(rctx, name, o, 0, false)
		if out == conflicted {
			// A permit's delete marker the view knows may have left the
			// bucket (it lives for the retry window): once more, on reads.
			if o, err = s.locks.current(rctx, key, true); err == nil && o.sem != 0 {
				if _, out, err = s.locks.names.retireName(rctx, name, o, 0, true); out == conflicted {
					err = errConflict // lost a race again: logged below
				}
			}
		}
		if err != nil {
			s.log.Debug("an idle semaphore's name record not retired", "resource", name, "err", err)
		}
		cancel()
	}
}
