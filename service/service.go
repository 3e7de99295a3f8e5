// Package service is the jetlock lock service: a NATS micro service named
// "jetlock" that grants exclusive leases on named resources, with state in
// a replicated JetStream key-value bucket. See ../streams for the wire
// contract and DESIGN.md for the invariants it keeps.
package service

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/jetlock/jetlock/streams"
)

const lockStripes = 8192

// Service is one jetlock service instance. Any number of instances may
// serve the same bucket at once: every decision commits by compare-and-set,
// so they never double-grant or lose a renewal.
type Service struct {
	cfg     Config
	nc      *nats.Conn          // requests, replies, wakes, heartbeats: no JetStream rights
	storeNC *nats.Conn          // the bucket and the JetStream API
	js      jetstream.JetStream // on storeNC
	log     *slog.Logger
	metrics *metrics

	bucket  *streams.Bucket
	store   *store
	tracker *tracker

	seed    maphash.Seed
	stripes [lockStripes]sync.Mutex

	gate       *gate
	inflight   sync.WaitGroup
	dispatched atomic.Int64
	ready      chan struct{}
	stopping   chan struct{} // closed when Run begins to shut down
	work       chan func()   // hands a request to an idle worker
	done       chan struct{} // closed when Run has finished: workers exit

	// wakePrefix + request hash is the wake subject of a request waiting
	// on this instance; waiting maps the hash to its waiter.
	wakePrefix string
	waitMu     sync.Mutex
	waiting    map[string]chan struct{}
	nWaiting   atomic.Int64
	// watchSynced is set once the watcher has delivered every existing
	// record: from then on a key the tracker does not know was never
	// written (or is being written just now, or by an instance not yet
	// heard of, which compare-and-set catches).
	watchSynced atomic.Bool

	// id names the instance in heartbeats and wake subjects; lastPeer is
	// when another instance was last heard (nanoseconds since epoch); see
	// follow.go.
	id         string
	epoch      time.Time
	lastPeer   atomic.Int64
	peerSeen   chan struct{}
	peerLinger time.Duration
	following  atomic.Bool

	workerIdle time.Duration // see workerIdle
	deadlines  *deadlines    // of the requests' store work
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
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	id := nuid.Next()
	s := &Service{
		cfg:     cfg,
		nc:      nc,
		storeNC: store,
		js:      js,
		log:     log,
		metrics: m,
		tracker: newTracker(cfg.ExpiryGrace, cmp.Or(cfg.Bucket.RetryWindow, streams.DefaultRetryWindow)),
		seed:    maphash.MakeSeed(),
		ready:   make(chan struct{}),

		stopping:   make(chan struct{}),
		work:       make(chan func()),
		done:       make(chan struct{}),
		wakePrefix: cfg.Prefix + ".wake." + id + ".",
		waiting:    make(map[string]chan struct{}),
		id:         id,
		peerSeen:   make(chan struct{}, 1),
		peerLinger: peerLinger,
		workerIdle: workerIdle,
		deadlines:  newDeadlines(cfg.QueueWait + cfg.OpTimeout),
	}
	s.gate = &gate{
		limit:       cfg.MaxInFlight,
		maxQueued:   cfg.MaxQueued,
		maxWait:     cfg.QueueWait,
		spawn:       s.spawn,
		queuedGauge: func(n int) { m.queued.Set(float64(n)) },
	}
	return s, nil
}

// Ready is closed once Run has ensured the bucket and started serving.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run ensures the bucket, starts the heartbeats, the lease watcher (see
// follow) and the sweeper, registers the micro service and serves until
// ctx is cancelled. It then stops taking requests, waits for those in
// flight to be answered, and returns nil; any earlier failure is returned.
func (s *Service) Run(ctx context.Context) error {
	defer close(s.done)
	b, err := s.ensure(ctx)
	if err != nil {
		return fmt.Errorf("ensure bucket: %w", err)
	}
	if b == nil {
		return nil // cancelled while waiting for the cluster
	}
	s.bucket = b
	s.store = newStore(s.storeNC, b.Config().Bucket, b.Config().RetryWindow)

	bg, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	var bgWG sync.WaitGroup
	defer func() {
		stopBg()
		bgWG.Wait()
	}()
	// Hear the other instances before following starts, and be heard.
	s.epoch = time.Now()
	hbSubj := HeartbeatSubject(s.cfg.Prefix, b.Config().Bucket)
	hbSub, err := s.nc.Subscribe(hbSubj, s.onHeartbeat)
	if err != nil {
		return fmt.Errorf("subscribe heartbeat subject: %w", err)
	}
	defer hbSub.Unsubscribe()
	watchReady := make(chan struct{})
	bgWG.Add(4)
	go func() { defer bgWG.Done(); s.heartbeat(bg, hbSubj) }()
	go func() { defer bgWG.Done(); s.follow(bg, watchReady) }()
	go func() { defer bgWG.Done(); s.sweep(bg) }()
	go func() { defer bgWG.Done(); s.recordHighWater(bg) }()
	select {
	case <-watchReady:
	case <-ctx.Done():
		return nil
	}

	wakeSub, err := s.nc.Subscribe(s.wakePrefix+"*", s.onWake)
	if err != nil {
		return fmt.Errorf("subscribe wake subject: %w", err)
	}
	defer wakeSub.Unsubscribe()

	svc, err := micro.AddService(s.nc, micro.Config{
		Name:        streams.ServiceName,
		Version:     s.cfg.Version,
		Description: "jetlock: exclusive leases with fencing tokens on named resources",
		QueueGroup:  streams.QueueGroup,
		Metadata:    map[string]string{"prefix": s.cfg.Prefix, "bucket": b.Config().Bucket},
		StatsHandler: func(ep *micro.Endpoint) any {
			return s.metrics.endpointStats(ep.Name)
		},
	})
	if err != nil {
		return fmt.Errorf("register micro service: %w", err)
	}
	grp := svc.AddGroup(s.cfg.Prefix + "." + streams.APIVersion)
	for _, op := range streams.Operations {
		// micro endpoint names allow no dots: "admin.revoke" is endpoint
		// admin_revoke on subject <prefix>.v1.admin.revoke.
		name := strings.ReplaceAll(op, ".", "_")
		if err := grp.AddEndpoint(name, micro.HandlerFunc(func(r micro.Request) { s.dispatch(op, r) }), micro.WithEndpointSubject(op)); err != nil {
			svc.Stop()
			return fmt.Errorf("add endpoint %s: %w", op, err)
		}
	}
	close(s.ready)
	s.log.Info("jetlock serving", "prefix", s.cfg.Prefix, "bucket", b.Config().Bucket, "instance", svc.Info().ID)

	<-ctx.Done()
	// Stop taking requests (drains the endpoint subscriptions), end the
	// waits (their callers retry elsewhere and keep their places), then wait
	// for every request in flight to be answered.
	close(s.stopping)
	if err := svc.Stop(); err != nil {
		s.log.Warn("stop micro service", "err", err)
	}
	s.awaitDrained()
	s.log.Info("jetlock stopped")
	return nil
}

// ensure ensures the bucket, retrying while the cluster is not ready (no
// meta leader yet, stream leader election after a restart). A bucket whose
// configuration is unsafe is an error at once; one whose stream reports a
// sequence below the high-water mark is an error once that has lasted
// HighWaterPatience. It returns nil, nil when ctx ends first.
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
			return nil, err
		}
		if errors.Is(err, streams.ErrBelowHighWater) {
			if below.IsZero() {
				below = time.Now()
			}
			if time.Since(below) >= s.cfg.HighWaterPatience {
				return nil, fmt.Errorf("%w: for %v: %w", streams.ErrBucketConfig, s.cfg.HighWaterPatience, err)
			}
		}
		s.log.Warn("lock bucket not ready, retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil, nil
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

// dispatch answers a request in a worker goroutine, so that one slow store
// round trip never holds up the subscription. The gate bounds the requests
// processed at once (MaxInFlight) and queues the next MaxQueued; beyond
// those, or after QueueWait in the queue, the service sheds load: it answers
// unavailable rather than letting requests queue until their callers have
// given up.
func (s *Service) dispatch(op string, r micro.Request) {
	s.dispatched.Add(1)
	s.inflight.Add(1)
	received := time.Now()
	s.gate.enter(pending{
		at: received,
		run: func(sl *slot) {
			defer func() {
				sl.release()
				s.inflight.Done()
			}()
			resp, err := s.handle(op, r.Data(), received, sl)
			code := ""
			if err != nil {
				oe := toOpError(err)
				code = oe.code
				if oe.code == streams.CodeInternal {
					s.log.Error("internal error", "op", op, "err", err)
				}
				s.replyError(r, oe)
			} else {
				s.replyJSON(r, resp)
			}
			s.metrics.observe(op, code, time.Since(received))
		},
		shed: func(reason string, waited time.Duration) {
			defer s.inflight.Done()
			var oe *opError
			if reason == shedWaited {
				oe = newOpError(streams.CodeUnavailable, "service overloaded: the request waited %v for one of %d places; retry with backoff", waited.Round(time.Millisecond), s.cfg.MaxInFlight)
			} else {
				oe = newOpError(streams.CodeUnavailable, "service overloaded: %d requests in progress and %d queued; retry with backoff", s.cfg.MaxInFlight, s.cfg.MaxQueued)
			}
			s.replyError(r, oe)
			s.metrics.shed(op, reason, waited)
		},
	})
}

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
// not re-armed after every request (a timer reset per request cost 3.7 %
// of the bench process's CPU at the design load): it ticks every
// workerIdle, and the worker exits at a tick if it ran nothing since the
// one before.
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

// handle decodes and processes one request received at received; its
// store work must end within QueueWait+OpTimeout of that.
func (s *Service) handle(op string, data []byte, received time.Time, sl *slot) (any, error) {
	ctx := s.deadlines.get(received)
	switch op {
	case streams.OpAcquire:
		var req streams.AcquireRequest
		if err := streams.Decode(data, &req); err != nil {
			return nil, err
		}
		return s.acquire(ctx, &req, sl)
	case streams.OpRenew:
		var req streams.RenewRequest
		if err := streams.Decode(data, &req); err != nil {
			return nil, err
		}
		return s.renew(ctx, &req)
	case streams.OpRelease:
		var req streams.ReleaseRequest
		if err := streams.Decode(data, &req); err != nil {
			return nil, err
		}
		return s.release(ctx, &req)
	case streams.OpCancel:
		var req streams.CancelRequest
		if err := streams.Decode(data, &req); err != nil {
			return nil, err
		}
		return s.cancel(ctx, &req)
	case streams.OpStatus:
		var req streams.StatusRequest
		if err := streams.Decode(data, &req); err != nil {
			return nil, err
		}
		return s.status(ctx, &req)
	}
	return nil, fmt.Errorf("unknown operation %q", op)
}

// replyJSON and replyError answer on the request's reply subject directly.
// They run in the request's own goroutine, after micro's handler has
// returned; micro's Respond and Error record the outcome in the request for
// its statistics without a lock, which would race with micro reading it.
// The price: micro's error counts stay zero (the Prometheus metrics and the
// endpoint stats data count results).
func (s *Service) replyJSON(r micro.Request, v any) {
	if a, ok := v.(appender); ok {
		buf := encode(a)
		defer buf.free()
		s.reply(r, &nats.Msg{Subject: r.Reply(), Data: buf.b})
		return
	}
	body, err := marshal(v)
	if err != nil {
		s.replyError(r, newOpError(streams.CodeInternal, "encode reply: %v", err))
		return
	}
	s.reply(r, &nats.Msg{Subject: r.Reply(), Data: body})
}

func (s *Service) replyError(r micro.Request, oe *opError) {
	body, _ := json.Marshal(streams.ErrorResponse{Error: streams.ErrorDetail{Code: oe.code, Message: oe.msg, Holder: oe.holder}})
	m := &nats.Msg{Subject: r.Reply(), Data: body, Header: nats.Header{}}
	m.Header.Set(streams.HeaderError, oe.msg)
	m.Header.Set(streams.HeaderErrorCode, strconv.Itoa(streams.StatusCode(oe.code)))
	s.reply(r, m)
}

func (s *Service) reply(r micro.Request, m *nats.Msg) {
	if m.Subject == "" {
		return // a request without a reply subject (a plain publish)
	}
	if err := s.nc.PublishMsg(m); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		s.log.Warn("reply failed", "err", err)
	}
}

// lockKey serialises this instance's work on one key, so that its own
// requests do not race each other's compare-and-set. Instances still race
// each other; compare-and-set decides those races.
func (s *Service) lockKey(key string) func() {
	m := &s.stripes[maphash.String(s.seed, key)%lockStripes]
	m.Lock()
	return m.Unlock
}

// watch follows every lease and waiter write in the bucket and feeds the
// tracker, so that any instance expires leases granted by instances that
// died. It calls synced once it has delivered every existing record.
func (s *Service) watch(ctx context.Context, synced func()) error {
	w, err := s.bucket.KV.WatchFiltered(ctx, []string{streams.LeaseKeyPrefix + ">", streams.WaitKeyPrefix + ">"})
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
					synced()
				}
				continue
			}
			if o, ok := s.tracker.get(kve.Key()); ok && o.rev >= kve.Revision() {
				continue // this instance's own write, already observed
			}
			e := entry{rev: kve.Revision()}
			if kve.Operation() == jetstream.KeyValueDelete {
				e.end = streams.DecodeEndMark(kve.Value())
			}
			if kve.Operation() == jetstream.KeyValuePut {
				rec, err := streams.DecodeRecord(kve.Value())
				if err != nil {
					s.log.Error("corrupt lease record", "key", kve.Key(), "rev", kve.Revision(), "err", err)
					continue
				}
				e.rec = rec
			}
			s.tracker.observe(kve.Key(), e)
		}
	}
}

// recordHighWater raises the recorded token high-water mark every second,
// so that a bucket recreated after loss never hands out smaller tokens.
func (s *Service) recordHighWater(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var recorded uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hw := s.tracker.maxRev()
		if hw <= recorded {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := s.bucket.RecordHighWater(rctx, hw)
		cancel()
		if err != nil {
			s.log.Warn("record high-water mark", "err", err)
			continue
		}
		recorded = hw
	}
}
