package service

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/streams"
)

// Following the bucket. An instance learns of its own writes from their
// acknowledgements. The writes of other instances serving the same bucket
// it learns by following the bucket with a watcher: that is how it expires
// the leases of an instance that died, keeps the waiter queues in order
// and keeps its view of who holds what fresh. The watcher costs the stream
// leader one delivery per commit, and this instance the handling of each,
// which on a small machine is the difference between keeping up with the
// design load and shedding (see docs/capacity.md).
//
// An instance that is alone needs none of it. So every instance announces
// itself on a heartbeat subject every peerInterval, and follows the bucket
// only while another instance has been heard within peerLinger. Every
// decision commits by compare-and-set either way; what an instance that
// does not follow misses makes its view staler, never a decision wrong.
// When another instance appears, the watcher starts again and first
// reads every record, so nothing written meanwhile is missed.
//
// That first read costs the cluster a pass over the whole bucket, beside
// the load. In a rolling restart of the instances, each peer is gone for
// the seconds its restart takes: an instance that stopped following at
// once would read the bucket again just as the restarted one reads it for
// its own first sync, two passes together on a busy cluster (a window of
// many seconds without grants, measured). So peerLinger outlasts any
// restart: an instance stops following only once its peers have been
// gone for good. An instance that has heard no peer since it started
// waits only peerStartLinger (a lone deployment goes alone soon after
// its start, as it always did).
const (
	peerInterval    = time.Second
	peerLinger      = 2 * time.Minute
	peerStartLinger = 5 * time.Second

	followRetry    = 100 * time.Millisecond // first wait before a failed watcher starts again
	followRetryMax = 2 * time.Second
)

// HeartbeatSubject is the subject on which the instances serving bucket
// under prefix announce themselves. It lies under the prefix, whose
// subjects the service never publishes a reply on, so no caller can fake
// an instance.
func HeartbeatSubject(prefix, bucket string) string { return prefix + ".instances." + bucket }

// follower announces this instance, hears the others, and follows the
// bucket's writes into the tracker while others serve it too.
type follower struct {
	nc *nats.Conn // the request connection: heartbeats
	kv jetstream.KeyValue
	// store and bucket are the store connection and the bucket's name, for
	// the first read of every record (scanBucket).
	store   *nats.Conn
	bucket  string
	tracker *tracker
	decode  func(key string, rev uint64, deleted bool, data []byte) entry
	log     *slog.Logger
	gauge   func(on bool)

	id        string
	epoch     time.Time
	lastPeer  atomic.Int64 // when another instance was last heard, ns since epoch
	heardPeer atomic.Bool  // another instance was heard since Run began
	peerSeen  chan struct{}
	linger    time.Duration
	// startLinger replaces linger until another instance is heard.
	startLinger time.Duration
	following   atomic.Bool
	// delivered is the revision of the last write the watcher delivered
	// (writes reach it in commit order): once it is at or past a
	// revision, the tracker knows the last write before it of every key
	// (a write superseded before the watcher reached it, as after its
	// consumer is lost and made again, is never delivered; see deliveries).
	delivered atomic.Uint64
	// deliveries wakes the requests that wait for a revision's delivery.
	deliveries deliveries
	// synced is set once the watcher has delivered every existing record:
	// from then on a key the tracker does not know was never written (or
	// is being written just now, or by an instance not yet heard of, which
	// compare-and-set catches).
	synced atomic.Bool
}

// heartbeat announces this instance every peerInterval until ctx ends.
func (f *follower) heartbeat(ctx context.Context, subj string) {
	t := time.NewTicker(peerInterval)
	defer t.Stop()
	for {
		if err := f.nc.Publish(subj, []byte(f.id)); err != nil && ctx.Err() == nil {
			f.log.Debug("heartbeat", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// onHeartbeat notes another instance: that one serves the bucket too,
// and that its waiters live (see instances.go).
func (f *follower) onHeartbeat(m *nats.Msg) {
	if string(m.Data) == f.id {
		return
	}
	f.tracker.instances.heard(string(m.Data))
	f.lastPeer.Store(time.Since(f.epoch).Nanoseconds())
	f.heardPeer.Store(true)
	select {
	case f.peerSeen <- struct{}{}:
	default:
	}
}

// alone reports how long no other instance has been heard (or, before
// any was, since Run began).
func (f *follower) alone() time.Duration {
	return time.Since(f.epoch) - time.Duration(f.lastPeer.Load())
}

// lingered reports whether the instance has been alone long enough to
// stop following: linger once a peer was heard, startLinger before.
func (f *follower) lingered() bool {
	linger := f.linger
	if !f.heardPeer.Load() {
		linger = f.startLinger
	}
	return f.alone() >= linger
}

// run runs the watcher while another instance serves the bucket, and from
// Run's start until it has been alone for linger. It closes ready once the
// first watcher has delivered every existing record. A watcher that fails
// (it cannot be created while the stream has no leader, as right after a
// partition heals) is started again after a backoff; the instance serves
// on meanwhile, on compare-and-set as ever.
func (f *follower) run(ctx context.Context, ready chan<- struct{}) {
	var once sync.Once
	check := time.NewTicker(peerInterval / 4)
	defer check.Stop()
	backoff := followRetry
	for {
		alone, caughtUp, err := f.followOnce(ctx, check.C, func() {
			once.Do(func() {
				f.synced.Store(true)
				close(ready)
			})
		})
		if caughtUp {
			backoff = followRetry
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			f.log.Warn("lease watcher failed; starting it again", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, followRetryMax)
			continue
		case !alone:
			continue
		}
		f.setFollowing(false)
		select { // a heartbeat that came while following is not news
		case <-f.peerSeen:
		default:
		}
		select {
		case <-ctx.Done():
			return
		case <-f.peerSeen:
		}
	}
}

// followOnce runs one watcher until it fails (the error), ctx ends, or the
// instance has been alone for linger (alone). caughtUp reports whether the
// watcher delivered every existing record before it ended.
func (f *follower) followOnce(ctx context.Context, check <-chan time.Time, synced func()) (alone, caughtUp bool, err error) {
	var done atomic.Bool // this watcher has delivered every existing record
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	go func() {
		errc <- f.watch(wctx, func() {
			done.Store(true)
			synced()
		})
	}()
	f.setFollowing(true)
	for {
		select {
		case <-ctx.Done():
			stop()
			<-errc
			return false, done.Load(), nil
		case err := <-errc:
			return false, done.Load(), err
		case <-check:
			if done.Load() && f.lingered() {
				stop()
				<-errc
				return true, true, nil
			}
		}
	}
}

func (f *follower) setFollowing(on bool) {
	if f.following.Swap(on) == on {
		return
	}
	f.gauge(on)
	if on {
		f.log.Info("following every write to the bucket", "reason", "another instance serves it, or just started")
	} else {
		f.log.Info("alone: no longer following the bucket's writes", "alone_for", f.alone().Round(time.Millisecond))
	}
}

// watchedPrefixes are the keys the follower follows: leases, waiters and
// sessions.
var watchedPrefixes = []string{streams.LeaseKeyPrefix, streams.WaitKeyPrefix, streams.SessionKeyPrefix}

// watch follows every lease and waiter write in the bucket and feeds the
// tracker, so that any instance expires leases granted by instances that
// died. It first reads every existing record (scanBucket), then watches
// the writes after the last of them, and calls synced once it has
// delivered every record that existed when the watcher started.
func (f *follower) watch(ctx context.Context, synced func()) error {
	f.deliveries.restart()
	defer f.deliveries.stopped()
	start, records := time.Now(), 0
	last, err := scanBucket(ctx, f.store, f.bucket, watchedPrefixes, func(r scanned) {
		records++
		f.deliver(r.key, r.rev, r.deleted, r.data, true)
	})
	if err != nil {
		return err
	}
	scannedIn, scannedTo := time.Since(start), last
	w, err := watchAfter(ctx, f.kv, last)
	if err != nil {
		return err
	}
	defer w.Stop()
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case kve, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("watcher closed")
			}
			if kve == nil {
				if initial {
					initial = false
					f.tracker.sessionIx.orphansDue(time.Now())
					f.deliveries.caughtUp()
					f.caughtUpTo(last)
					f.log.Info("view in sync with the bucket", "records", records, "read_in", scannedIn.Round(time.Millisecond),
						"writes_after", last-scannedTo, "in", time.Since(start).Round(time.Millisecond))
					synced()
				}
				continue
			}
			f.deliver(kve.Key(), kve.Revision(), kve.Operation() != jetstream.KeyValuePut, kve.Value(), initial)
			last = max(last, kve.Revision())
		}
	}
}

// watchAfter watches every write to kv after revision rev. Its consumer
// follows every key; deliver drops what lies outside watchedPrefixes
// (today nothing does). A consumer filtered on the stream's whole subject
// reads the stream in order; one with several filters (WatchFiltered)
// makes the server look up, for each message it delivers while it is
// behind, every subject of the message block in its subject tree, under
// the block's lock: after a node's restart, such a consumer catching up on
// the stream leader held the leader's CPU and its writes for many seconds,
// and nothing was granted meanwhile (docs/capacity.md, appendix I).
func watchAfter(ctx context.Context, kv jetstream.KeyValue, rev uint64) (jetstream.KeyWatcher, error) {
	return kv.Watch(ctx, ">", jetstream.ResumeFromRevision(rev+1))
}

// deliver feeds one record the watcher delivered to the view. During the
// initial delivery (the records read by scanBucket, then the writes
// committed before the watcher started, in revision order) the records
// delivered so far are not yet the state as of the last of them, since a
// key written later is still to come: no revision counts as delivered
// until the whole of it has been (caughtUpTo).
func (f *follower) deliver(key string, rev uint64, deleted bool, value []byte, initial bool) {
	if isSessionKey(key) {
		f.deliveries.session(key, f.decode(key, rev, deleted, value))
	}
	// A key outside watchedPrefixes (put by hand) is no record of the
	// service's: nothing to observe, but its revision is delivered.
	if hasAnyPrefix(key, watchedPrefixes) {
		if o, ok := f.tracker.get(key); !ok || o.rev < rev {
			f.tracker.observe(key, f.decode(key, rev, deleted, value))
		} // else: this instance's own write, already observed
	}
	if !initial {
		f.delivered.Store(rev)
		f.deliveries.delivered(rev)
	}
}

// caughtUpTo notes that the initial delivery, whose last record was at
// rev, is complete: the view is then the state as of rev, and a request
// that waits for a revision up to it need not wait for a later write
// (after a restart in a quiet bucket, none may come for long).
func (f *follower) caughtUpTo(rev uint64) {
	if rev == 0 {
		return
	}
	if rev > f.delivered.Load() {
		f.delivered.Store(rev)
	}
	f.deliveries.delivered(rev)
}
