// Package service is the jetlock lock service: a NATS micro service named
// "jetlock" that grants exclusive leases on named resources, with state in
// a replicated JetStream key-value bucket. Package streams holds the wire
// contract; docs/protocol.md describes it for users.
//
// The package has two halves. The lock logic (locks.go, handover.go,
// waiter.go, store.go, tracker.go) decides every request by
// compare-and-set on the bucket. It is locks, a set of roles that each
// hold one kind of request and reach the others through fields: leaseOps
// (one lease: locks.go), sessionOps (sessions.go), setOps (lock sets:
// sets.go, sets_wait.go), semOps (semaphores: semaphores.go, sem_bulk.go),
// handoverOps (the end of a lease and its hand-over to a waiter:
// handover.go, waiter.go) and nameOps (the name rule, in the bucket and on
// the view, and the waiter caps: engine.go, name_index.go, caps.go); engineDeps holds
// what they share. The tracker (tracker.go) is the instance's view of the
// bucket: observations and their expiry, the waiter queues and the claim
// they leave a request, with the retry memory (retry_memory.go) and its
// indexes (sessionIndex, setIndex, nameIndex, instanceIndex, waitCaps) in
// types of their own. The transport (gate.go, request.go, waiting.go,
// wake.go, follow.go) receives requests, admits them (gate.go: the
// endpoints, the reply subject guard, the caller's origin, the gate, the
// workers, the deadlines and the fair-use limits), runs them and replies:
// request.go decodes each request and holds each operation's handler,
// which hands the decoded request to the lock logic, and the replies.
// service.go wires the two and runs them, with the background sweep
// (sweep.go); stream.go watches the bucket's stream.
//
// Every decision runs in one engine (engine.go): every grant (of a lock, a
// permit of a semaphore, a lock set), renewal, release and hand-over,
// every request about a session, and the writes of waiters. Each primitive
// supplies a read step, which gathers a snapshot of the records its
// decision rests on (on the instance's view, or fresh from the stream
// leader) and of what the view adds (the clock's reading, expiry, waiters
// ahead, the guard, room under the caps); a decider, a function of that
// snapshot and the request alone, which returns a verdict value: answer
// now with a response or a refusal, decide again on fresh reads, prove and
// answer a retry of the same request, or write a plan (a grant's writes
// are values, committed by the store as one atomic batch); and a commit
// step, which writes the plan and reports whether it committed, lost a
// race or found an earlier write of the request. One commit loop (with the
// key locks that serialise an instance's own work on a key, and the clock
// a snapshot is read at) runs the steps for every primitive and owns what
// they share: the bound of attempts, the switch to fresh reads and the
// answer when every attempt lost a race. Errors are failures and refusals;
// none of them steers the loop. The simulation in the tests runs the same
// loop and deciders against a model of the bucket.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/jetlock/jetlock/streams"
)

// Service is one jetlock service instance. Any number of instances may
// serve the same bucket at once: every decision commits by compare-and-set,
// so they never double-grant or lose a renewal. Its methods are safe for
// concurrent use.
type Service struct {
	cfg     Config
	maxBody int        // the largest request body decoded (Config.maxBody)
	nc      *nats.Conn // requests, replies, wakes, heartbeats: no JetStream rights
	storeNC *nats.Conn // the bucket and the JetStream API
	js      jetstream.JetStream
	log     *slog.Logger
	metrics *metrics
	report  *reporter
	id      string

	// The lock logic, once Run has ensured the bucket.
	tracker *tracker
	store   *store
	locks   *locks
	guard   *streamGuard
	follow  *follower

	// The transport.
	wakes           *wakes
	gate            *gate
	limits          *limits
	origins         originCache
	deadlines       *deadlines
	workers         *workers
	inflight        sync.WaitGroup
	dispatched      atomic.Int64
	nWaiting        atomic.Int64
	peerLinger      time.Duration
	peerStartLinger time.Duration // before any peer was heard

	ready    chan struct{}
	serving  atomic.Bool
	stopping chan struct{} // closed when Run begins to shut down
	done     chan struct{} // closed when Run has finished: workers exit
}

// New returns a service that answers requests on nc and keeps lock state
// in the bucket through store. The two must be different connections: a
// request names the subject its reply is published on, so nc's credentials
// should have no rights on $JS, $KV and $SYS (see deploy/), while store's
// reach the bucket and the JetStream API and carry nothing a caller chose.
// New checks cfg (returning an error wrapping ErrInvalidConfig) but
// touches nothing until Run.
func New(nc, store *nats.Conn, cfg Config) (*Service, error) {
	if nc == nil || store == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidConfig)
	}
	if nc == store {
		return nil, fmt.Errorf("%w: requests and the bucket need two connections (the request connection must not be able to write the bucket)", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(store)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	id := nuid.Next()
	m := newMetrics()
	s := &Service{
		cfg: cfg, maxBody: cfg.maxBody(), nc: nc, storeNC: store, js: js, log: log, metrics: m, id: id,
		report:     newReporter(m, cfg.Audit, log, id),
		tracker:    newTracker(cfg.ExpiryGrace, cfg.MaxTTL, cmp.Or(cfg.Bucket.RetryWindow, streams.DefaultRetryWindow)),
		deadlines:  newDeadlines(cfg.QueueWait + cfg.OpTimeout),
		peerLinger: peerLinger, peerStartLinger: peerStartLinger,
		ready:    make(chan struct{}),
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
	}
	s.tracker.announce = announcer(nc, cfg.Prefix)
	s.tracker.instances.self, s.tracker.instances.wakeRoot, s.tracker.instances.liveness = id, cfg.Prefix+".wake.", cfg.WaiterLiveness
	s.wakes = &wakes{nc: nc, prefix: cfg.Prefix + ".wake." + id + ".", log: log, sent: m.wakes.Inc, recheckEvery: cfg.WaiterLiveness / 3,
		waiting: make(map[string]chan *streams.LeaseResponse)}
	s.workers = newWorkers(s.done)
	s.limits = newLimits(cfg.OwnerRate, cfg.UserRate, cfg.TenantRates, s.report.limited)
	s.gate = &gate{limit: cfg.MaxInFlight, maxQueued: cfg.MaxQueued, maxWait: cfg.QueueWait, spawn: s.workers.spawn,
		queuedGauge: func(n int) { m.queued.Set(float64(n)) }}
	if cfg.Registerer != nil {
		if err := m.register(cfg.Registerer, newHotCollector(s.report.hot, s.tracker)); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return s, nil
}

// Ready is closed once Run has ensured the bucket and started serving.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Following reports whether the instance follows every write to the
// bucket, because another instance serves it too.
func (s *Service) Following() bool { return s.follow != nil && s.follow.following.Load() }

// Run ensures the bucket, starts the heartbeats, the lease watcher (see
// follow.go), the sweeper and the stream checks, registers the micro
// service and serves until ctx is cancelled. It then stops taking
// requests, waits for those in flight to be answered, and returns nil; any
// earlier failure is returned.
func (s *Service) Run(ctx context.Context) error {
	defer close(s.done)
	b, err := s.ensure(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // cancelled while waiting for the cluster
		}
		return err
	}
	if err := s.wire(b); err != nil {
		return err
	}
	if err := s.store.acks.start(); err != nil {
		return err
	}
	defer s.store.acks.stop() // after the requests and the background work
	bg, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	var bgWG sync.WaitGroup
	defer func() {
		stopBg()
		bgWG.Wait()
	}()
	subs, err := s.subscribe(b)
	if err != nil {
		return err
	}
	defer unsubscribe(subs)
	go s.workers.reap(workerIdle) // until s.done
	watchReady := make(chan struct{})
	s.startBackground(bg, &bgWG, b, watchReady)
	select {
	case <-watchReady:
	case <-ctx.Done():
		return nil
	}
	svc, err := s.register(b)
	if err != nil {
		return err
	}
	s.serving.Store(true)
	close(s.ready)
	s.log.Info("jetlock serving", "prefix", s.cfg.Prefix, "bucket", b.Config().Bucket, "instance", svc.Info().ID)

	<-ctx.Done()
	s.drain(svc)
	s.log.Info("jetlock stopped")
	return nil
}

// Health returns the instance's readiness as its last check saw it. It
// may be called at any time, also before Run serves (not ready: "not
// serving yet") and once Run has begun to shut down (not ready: "instance
// not serving"), so a readiness probe can call it from the start.
func (s *Service) Health() Health {
	select {
	case <-s.ready: // s.guard is set before ready is closed
	default:
		return Health{Problems: []string{"not serving yet"}}
	}
	s.guard.mu.Lock()
	h := s.guard.health
	s.guard.mu.Unlock()
	if h.Checked.IsZero() {
		h.Problems = []string{"not checked yet"}
	}
	if !s.serving.Load() && h.Ready {
		h.Ready, h.Problems = false, append(slices.Clone(h.Problems), "instance not serving")
	}
	return h
}

// startBackground starts the instance's background work on bg, each in a
// goroutine counted in wg: the heartbeat, the watcher (which closes
// watchReady once caught up), the sweep and the high-water guard.
func (s *Service) startBackground(bg context.Context, wg *sync.WaitGroup, b *streams.Bucket, watchReady chan struct{}) {
	for _, run := range []func(){
		func() { s.follow.heartbeat(bg, HeartbeatSubject(s.cfg.Prefix, b.Config().Bucket)) },
		func() { s.follow.run(bg, watchReady) },
		func() { sweeper{s}.sweep(bg) },
		func() { s.guard.run(bg, s.serving.Load, time.Second) },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); run() }()
	}
}

// drain stops the instance once its context ends: it stops taking
// requests (drains the endpoint subscriptions), ends the waits (their
// callers retry elsewhere and keep their places), then waits for every
// request in flight to be answered.
func (s *Service) drain(svc micro.Service) {
	s.serving.Store(false)
	close(s.stopping)
	if err := svc.Stop(); err != nil {
		s.log.Warn("stop micro service", "err", err)
	}
	s.awaitDrained()
}

// wire builds the lock logic on the ensured bucket b.
func (s *Service) wire(b *streams.Bucket) error {
	mgr, err := jsm.New(s.storeNC, jsm.WithTimeout(2*time.Second))
	if err != nil {
		return fmt.Errorf("jsm: %w", err)
	}
	wakeRoot := s.cfg.Prefix + ".wake."
	decode := func(key string, rev uint64, deleted bool, data []byte) entry {
		return decodeEntry(key, rev, deleted, data, wakeRoot, s.report.foreign)
	}
	s.store = newStore(s.storeNC, b.Config().Bucket, b.Config().RetryWindow)
	s.store.decode = decode
	s.store.commit = s.report.commit
	if hw, err := b.HighWater(context.Background()); err == nil {
		s.store.floor.Store(hw)
	}
	s.guard = &streamGuard{bucket: b, mgr: mgr, store: s.store, tracker: s.tracker, m: s.metrics, log: s.log,
		conns: map[string]*nats.Conn{"requests": s.nc, "store": s.storeNC}, lastErrs: map[string]error{}}
	s.store.regressed = s.guard.regressed
	s.follow = &follower{nc: s.nc, kv: b.KV, store: s.storeNC, bucket: b.Config().Bucket, tracker: s.tracker, decode: decode, log: s.log,
		gauge: func(on bool) { s.metrics.following.Set(boolGauge(on)) },
		id:    s.id, epoch: time.Now(), peerSeen: make(chan struct{}, 1), linger: s.peerLinger, startLinger: s.peerStartLinger}
	s.locks = newLocks(&engineDeps{cfg: s.cfg, log: s.log, store: s.store, tracker: s.tracker, keys: newKeyLocks(s.cfg.MaxPerKey),
		report: s.report, wakes: s.wakes, guard: s.guard, following: s.follow.following.Load, synced: &s.follow.synced,
		delivered: s.follow.delivered.Load, seen: &s.follow.deliveries})
	return nil
}

// subscribe subscribes the heartbeats and the wake messages, and checks
// that the server allowed both: a permission error on a subject the
// service needs must stop it, not leave it running as if alone.
func (s *Service) subscribe(b *streams.Bucket) ([]*nats.Subscription, error) {
	hb, err := s.nc.Subscribe(HeartbeatSubject(s.cfg.Prefix, b.Config().Bucket), s.follow.onHeartbeat)
	if err != nil {
		return nil, fmt.Errorf("subscribe heartbeat subject: %w", err)
	}
	wake, err := s.nc.Subscribe(s.wakes.prefix+"*", s.wakes.onMsg)
	if err != nil {
		hb.Unsubscribe()
		return nil, fmt.Errorf("subscribe wake subject: %w", err)
	}
	subs := []*nats.Subscription{hb, wake}
	if err := s.nc.FlushTimeout(5 * time.Second); err != nil {
		unsubscribe(subs)
		return nil, fmt.Errorf("flush subscriptions: %w", err)
	}
	if err := s.nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		unsubscribe(subs)
		return nil, fmt.Errorf("the request connection may not subscribe a subject the service needs: %w", err)
	}
	return subs, nil
}

func boolGauge(on bool) float64 {
	if on {
		return 1
	}
	return 0
}

func unsubscribe(subs []*nats.Subscription) {
	for _, sub := range subs {
		_ = sub.Unsubscribe()
	}
}

// register registers the micro service with its endpoints.
func (s *Service) register(b *streams.Bucket) (micro.Service, error) {
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:        streams.ServiceName,
		Version:     s.cfg.Version,
		Description: "jetlock: exclusive leases with fencing tokens on named resources",
		QueueGroup:  streams.QueueGroup,
		Metadata:    map[string]string{"prefix": s.cfg.Prefix, "bucket": b.Config().Bucket},
		StatsHandler: func(ep *micro.Endpoint) any {
			return s.metrics.endpointStats(ep.Subject[len(s.cfg.Prefix)+len(streams.APIVersion)+2:])
		},
	})
	if err != nil {
		return nil, fmt.Errorf("register micro service: %w", err)
	}
	if err := s.addEndpoints(svc); err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return svc, nil
}

// ensure ensures the bucket, retrying while the cluster is not ready (no
// meta leader yet, stream leader election after a restart). A bucket whose
// configuration is unsafe is an error at once; one whose stream reports a
// sequence below the high-water mark is an error once that has lasted
// HighWaterPatience. It returns ctx's error when ctx ends first.
func (s *Service) ensure(ctx context.Context) (*streams.Bucket, error) {
	backoff := 100 * time.Millisecond
	var below time.Time // when the stream was first seen below the high-water mark
	for {
		ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
		b, err := streams.Ensure(ectx, s.js, s.cfg.Bucket)
		cancel()
		if err == nil {
			return b, nil
		}
		if errors.Is(err, streams.ErrBucketConfig) || errors.Is(err, streams.ErrInvalid) {
			return nil, fmt.Errorf("ensure bucket: %w", err)
		}
		if errors.Is(err, streams.ErrBelowHighWater) {
			if below.IsZero() {
				below = time.Now()
			}
			if time.Since(below) >= s.cfg.HighWaterPatience {
				return nil, fmt.Errorf("ensure bucket: %w: for %v: %w", streams.ErrBucketConfig, s.cfg.HighWaterPatience, err)
			}
		}
		s.log.Warn("lock bucket not ready, retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// awaitDrained waits until the endpoint subscriptions have handed over
// every request they had buffered and every request in flight is answered.
// micro drains subscriptions asynchronously, so this waits for the server
// to confirm the unsubscribes (a flush) and then for dispatching to go
// quiet, at most 10s.
func (s *Service) awaitDrained() {
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = s.nc.FlushWithContext(fctx)
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		before := s.dispatched.Load()
		time.Sleep(50 * time.Millisecond)
		if s.dispatched.Load() == before {
			break
		}
	}
	s.inflight.Wait()
}
