package service

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Following the bucket. An instance learns of its own writes from their
// acknowledgements. The writes of other instances serving the same bucket
// it learns by following the bucket with a watcher: that is how it expires
// the leases of an instance that died, keeps the waiter queues in order
// and keeps its view of who holds what fresh. The watcher costs the stream
// leader one delivery per commit, and this instance the handling of each;
// measured at the design load on two cores, a lone instance that followed
// had zero errors in 3 of 10 runs, one that did not in 14 of 15.
//
// An instance that is alone needs none of it. So every instance announces
// itself on a heartbeat subject every peerInterval, and follows the bucket
// only while another instance has been heard within peerLinger. Every
// decision commits by compare-and-set either way; what an instance that
// does not follow misses makes its view staler, never a decision wrong.
// When another instance appears, the watcher starts again and first
// delivers the last write of every key, so nothing written meanwhile is
// missed.
const (
	peerInterval = time.Second
	peerLinger   = 5 * time.Second

	followRetry    = 100 * time.Millisecond // first wait before a failed watcher starts again
	followRetryMax = 2 * time.Second
)

// HeartbeatSubject is the subject on which the instances serving bucket
// under prefix announce themselves. It lies under the prefix, whose
// subjects the service never publishes a reply on, so no caller can fake
// an instance.
func HeartbeatSubject(prefix, bucket string) string { return prefix + ".instances." + bucket }

// heartbeat announces this instance every peerInterval until ctx ends.
func (s *Service) heartbeat(ctx context.Context, subj string) {
	t := time.NewTicker(peerInterval)
	defer t.Stop()
	for {
		if err := s.nc.Publish(subj, []byte(s.id)); err != nil && ctx.Err() == nil {
			s.log.Debug("heartbeat", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// onHeartbeat notes another instance.
func (s *Service) onHeartbeat(m *nats.Msg) {
	if string(m.Data) == s.id {
		return
	}
	s.lastPeer.Store(time.Since(s.epoch).Nanoseconds())
	select {
	case s.peerSeen <- struct{}{}:
	default:
	}
}

// alone reports how long no other instance has been heard (or, before
// any was, since Run began).
func (s *Service) alone() time.Duration {
	return time.Since(s.epoch) - time.Duration(s.lastPeer.Load())
}

// Following reports whether the instance follows every write to the
// bucket, because another instance serves it too.
func (s *Service) Following() bool { return s.following.Load() }

// follow runs the watcher while another instance serves the bucket, and
// from Run's start until it has been alone for peerLinger. It closes ready
// once the first watcher has delivered every existing record. A watcher
// that fails (it cannot be created while the stream has no leader, as
// right after a partition heals) is started again after a backoff; the
// instance serves on meanwhile, on compare-and-set as ever.
func (s *Service) follow(ctx context.Context, ready chan<- struct{}) {
	var once sync.Once
	check := time.NewTicker(peerInterval / 4)
	defer check.Stop()
	backoff := followRetry
	for {
		var synced atomic.Bool // this watcher has delivered every existing record
		wctx, stop := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			errc <- s.watch(wctx, func() {
				synced.Store(true)
				once.Do(func() {
					s.watchSynced.Store(true)
					close(ready)
				})
			})
		}()
		s.setFollowing(true)
		alone := false
	watching:
		for {
			select {
			case <-ctx.Done():
				stop()
				<-errc
				return
			case err := <-errc:
				stop()
				if ctx.Err() != nil {
					return
				}
				s.log.Warn("lease watcher failed; starting it again", "err", err, "in", backoff)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, followRetryMax)
				break watching
			case <-check.C:
				if !synced.Load() {
					continue
				}
				backoff = followRetry
				if s.alone() >= s.peerLinger {
					stop()
					<-errc
					alone = true
					break watching
				}
			}
		}
		if !alone {
			continue
		}
		s.setFollowing(false)
		select { // a heartbeat that came while following is not news
		case <-s.peerSeen:
		default:
		}
		select {
		case <-ctx.Done():
			return
		case <-s.peerSeen:
		}
	}
}

func (s *Service) setFollowing(on bool) {
	if s.following.Swap(on) == on {
		return
	}
	if on {
		s.metrics.following.Set(1)
		s.log.Info("following every write to the bucket", "reason", "another instance serves it, or just started")
	} else {
		s.metrics.following.Set(0)
		s.log.Info("alone: no longer following the bucket's writes", "alone_for", s.alone().Round(time.Millisecond))
	}
}
