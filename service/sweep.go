package service

import (
	"context"
	"sync"
	"time"
)

// sweepParallel bounds the expiry writes in flight at once.
const sweepParallel = 64

// sweep ends, every SweepInterval, the leases (and stale waiter records,
// and foreign values) whose revision has stood unchanged for their TTL
// plus grace since this instance first saw it (locks.expire). Due times
// come from the tracker's heap, so a sweep costs in proportion to what
// expires.
func (s *Service) sweep(ctx context.Context) {
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
				s.locks.expire(ectx, it)
			}(it)
		}
	}
}
