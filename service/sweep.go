package service

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// sweepParallel bounds the expiry deletes in flight at once.
const sweepParallel = 64

// sweep deletes leases whose revision has stood unchanged for TTL plus
// grace since this instance first saw it. Each delete is a compare-and-set
// on that revision, so a renewal that landed meanwhile always wins. Every
// instance sweeps; the compare-and-set lets exactly one delete succeed.
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
		for _, it := range s.tracker.popDue(time.Now(), 4096) {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func(it dueItem) {
				defer func() { <-sem; wg.Done() }()
				s.expire(ctx, it)
			}(it)
		}
	}
}

func (s *Service) expire(ctx context.Context, it dueItem) {
	defer s.lockKey(it.key)()
	o, ok := s.tracker.get(it.key)
	if !ok || o.rev != it.rev || !s.tracker.expired(o, time.Now()) {
		return // renewed, released or forgotten meanwhile
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	defer cancel()
	end := s.endMark(it.key, o.rec)
	seq, err := s.store.del(ctx, it.key, it.rev, end)
	switch {
	case err == nil:
		s.tracker.observe(it.key, entry{rev: seq, end: end})
		if strings.HasPrefix(it.key, streams.WaitKeyPrefix) {
			// A waiter whose instance stopped refreshing it: if the
			// resource is free, the next waiter may now be the head.
			enc, _, _ := strings.Cut(it.key[len(streams.WaitKeyPrefix):], ".")
			if lo, ok := s.tracker.get(streams.LeaseKeyPrefix + enc); !ok || !lo.held() {
				s.wakeHead(enc)
			}
			s.log.Info("waiter expired", "key", it.key, "owner", o.rec.Owner)
			return
		}
		s.metrics.expired.Inc()
		enc := it.key[len(streams.LeaseKeyPrefix):]
		s.wakeHead(enc)
		res, _ := streams.DecodeResource(enc)
		s.log.Info("lease expired", "resource", res, "token", o.rec.TokenAt(o.rev), "owner", o.rec.Owner)
	case errors.Is(err, errConflict):
		// Someone wrote meanwhile; learn the new revision (which schedules
		// its own expiry) or retry shortly if the write is still in flight.
		if e, rerr := s.store.read(ctx, it.key); rerr == nil && e.rev != it.rev {
			s.tracker.observe(it.key, e)
			return
		}
		s.tracker.retryAt(it, time.Now().Add(time.Second))
	default:
		s.log.Warn("expire lease", "key", it.key, "err", err)
		s.tracker.retryAt(it, time.Now().Add(time.Second))
	}
}
