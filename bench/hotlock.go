package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// HotlockResult is the outcome of the hotlock scenario.
type HotlockResult struct {
	Resources   int     `json:"resources"`
	Waiters     int     `json:"waiters_per_resource"`
	HoldMs      float64 `json:"hold_ms"`
	Grants      int64   `json:"grants"`
	GrantsPerS  float64 `json:"grants_per_s"`
	Releases    int64   `json:"releases"`
	Handovers   int64   `json:"handovers"`
	HandoverP50 float64 `json:"handover_p50_ms"` // release sent -> next grant of the resource received
	HandoverP99 float64 `json:"handover_p99_ms"`
	HandoverMax float64 `json:"handover_max_ms"`
	// Wake messages seen on WakeSubject, and the waiting requests the
	// service woke by its metrics (jetlock_wakes_total; null without
	// them): an instance wakes its own waiting requests in process,
	// without a message. WakesPerRelease is ServiceWakes per release, or
	// Wakes per release when the service's metrics are not read; null
	// (n/a) when there were none.
	WakeSubject     string   `json:"wake_subject"`
	Wakes           int64    `json:"wakes"`
	ServiceWakes    *int64   `json:"service_wakes"`
	WakesPerRelease *float64 `json:"wakes_per_release"`
	// Fairness: Jain's index of grants per caller (1 = perfectly even),
	// the fewest and most grants of one caller, and the fraction of grants
	// that went to a caller while another had been waiting longer.
	JainIndex      float64 `json:"jain_index"`
	MinGrants      int64   `json:"min_grants"`
	MaxGrants      int64   `json:"max_grants"`
	BypassFraction float64 `json:"bypass_fraction"`
	// HolderOverlaps counts grants that arrived while the bench still held
	// the resource under another lease (must be 0).
	HolderOverlaps int64 `json:"holder_overlaps"`
}

type hotResource struct {
	name string

	mu         sync.Mutex
	holder     int       // caller holding it, or -1
	holderReq  string    // the request id of the holder's acquire
	releasedAt time.Time // a release was sent and no grant has arrived since
	waiting    map[int]hotWait
	// cancelled holds the request ids of the waits the bench cancelled at
	// the end, and when it sent each cancel: such a cancel also ends the
	// lease if the wait was granted meanwhile (its grant reply still on
	// its way), and the resource goes to the next waiter at once.
	cancelled map[string]time.Time
}

type hotWait struct {
	since time.Time
	reqID string
}

type hotlock struct {
	e     *env
	be    *load.Service
	ph    *phase
	log   *load.GrantLog
	res   []*hotResource
	hand  *load.Recorder
	count []atomic.Int64 // grants per caller

	grants, releases, bypassed, overlaps, wakes atomic.Int64
}

// runHotlock makes many callers contend for few resources: each caller
// acquires with wait_ms, holds the lock for --hold, releases and acquires
// again at once. It measures hand-over latency (release sent to next grant
// received), wake messages per release, and fairness. It is closed-loop by
// nature: a waiting caller sends its next request only when answered.
func runHotlock(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	h := &hotlock{e: e, be: e.serviceBackend(), log: e.grantLog(), hand: load.NewRecorder("handover", 0),
		count: make([]atomic.Int64, c.hotResources*c.waiters)}
	h.ph = newPhase("hotlock", h.be, e.rq.InFlight, c.duration)
	for i := range c.hotResources {
		h.res = append(h.res, &hotResource{name: fmt.Sprintf("%shot%03d", e.names("hot"), i), holder: -1, waiting: map[int]hotWait{}, cancelled: map[string]time.Time{}})
	}
	wakeSubj, stop, err := h.countWakes()
	if err != nil {
		return err
	}
	defer stop()
	var before svcStats
	if e.svc != nil {
		before = e.svc.stats(ctx)
	}
	fmt.Fprintf(e.out, "hotlock: %d callers on each of %d resources, hold %v, wait_ms %d, for %v\n",
		c.waiters, c.hotResources, c.hold, c.wait.Milliseconds(), c.duration)
	e.measure(ctx, sum, h.ph, func() { h.run(ctx) })
	sum.use(h.ph)
	var svcWakes *int64
	if e.svc != nil && len(e.svc.metrics) > 0 {
		n := int64(*e.svc.stats(context.WithoutCancel(ctx)).wakes - *before.wakes)
		svcWakes = &n
	}
	sum.Hotlock = h.result(wakeSubj, svcWakes)
	if n := sum.Hotlock.HolderOverlaps; n > 0 {
		return fmt.Errorf("hotlock: %d grants arrived while another lease of the resource was held", n)
	}
	return sum.check(h.log)
}

// countWakes counts the messages on --wake-subject (by default the
// service's subjects but its requests and heartbeats) until stop. In the
// bench's own cluster it listens as the service's request user, the only
// one besides the service's own instances that sees them.
func (h *hotlock) countWakes() (subject string, stop func(), err error) {
	c := h.e.cfg
	subject = c.wakeSubject
	if subject == "" {
		subject = c.prefix + ".>"
	}
	skip := map[string]bool{}
	for _, op := range streams.Operations {
		skip[streams.Subject(c.prefix, op)] = true
	}
	tap, err := h.e.connect(devcluster.Service, h.e.url, 1)
	if err != nil {
		return "", nil, err
	}
	sub, err := tap[0].Subscribe(subject, func(m *nats.Msg) {
		if !skip[m.Subject] && !strings.HasPrefix(m.Subject, c.prefix+".instances.") {
			h.wakes.Add(1)
		}
	})
	if err == nil {
		err = sub.SetPendingLimits(-1, -1)
	}
	if err == nil {
		err = tap[0].Flush()
	}
	if err != nil {
		tap[0].Close()
		return "", nil, fmt.Errorf("subscribe %s: %w", subject, err)
	}
	return subject, tap[0].Close, nil
}

// run runs the callers until --duration ends, then cancels the waits
// still open, until every caller returned, so that none sits out its
// whole wait_ms.
func (h *hotlock) run(ctx context.Context) {
	c := h.e.cfg
	runWaiting(ctx, c.hotResources*c.waiters, c.duration,
		func(i int, end time.Time) { h.caller(ctx, i, h.res[i%c.hotResources], end) }, h.cancelWaits)
}

// runWaiting runs n callers, caller(i, end) each, until d has passed, then
// calls cancelWaits every half second until every caller has returned:
// a wait that began as the time ran out is cancelled too.
func runWaiting(ctx context.Context, n int, d time.Duration, caller func(i int, end time.Time), cancelWaits func()) {
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { caller(i, end) })
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-time.After(time.Until(end)):
	case <-ctx.Done():
	}
	for {
		cancelWaits()
		select {
		case <-done:
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// result summarises the run; svcWakes is the service's count of wakes
// during it, nil when its metrics are not read.
func (h *hotlock) result(wakeSubj string, svcWakes *int64) *HotlockResult {
	c := h.e.cfg
	r := &HotlockResult{Resources: c.hotResources, Waiters: c.waiters, HoldMs: float64(c.hold) / 1e6,
		Grants: h.grants.Load(), Releases: h.releases.Load(), WakeSubject: wakeSubj, Wakes: h.wakes.Load(),
		ServiceWakes: svcWakes, HolderOverlaps: h.overlaps.Load()}
	if h.ph.DurationS > 0 {
		r.GrantsPerS = round2(float64(r.Grants) / min(h.ph.DurationS, c.duration.Seconds()))
	}
	hs := h.hand.Summary(time.Second)
	r.Handovers, r.HandoverP50, r.HandoverP99, r.HandoverMax = hs.Count, hs.P50, hs.P99, hs.Max
	wakes := r.Wakes
	if svcWakes != nil {
		wakes = *svcWakes
	}
	if wakes > 0 && r.Releases > 0 {
		v := round2(float64(wakes) / float64(r.Releases))
		r.WakesPerRelease = &v
	}
	counts := make([]int64, len(h.count))
	for i := range h.count {
		counts[i] = h.count[i].Load()
	}
	r.JainIndex, r.MinGrants, r.MaxGrants = jain(counts)
	if r.Grants > 0 {
		r.BypassFraction = round2(float64(h.bypassed.Load()) / float64(r.Grants))
	}
	return r
}

// jain returns Jain's fairness index of xs, and their minimum and maximum.
func jain(xs []int64) (index float64, lo, hi int64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	var s, s2 float64
	lo, hi = xs[0], xs[0]
	for _, x := range xs {
		s += float64(x)
		s2 += float64(x) * float64(x)
		lo, hi = min(lo, x), max(hi, x)
	}
	if s2 == 0 {
		return 0, lo, hi
	}
	return round2(s * s / (float64(len(xs)) * s2)), lo, hi
}

// caller acquires, holds and releases r in a loop until end.
func (h *hotlock) caller(ctx context.Context, id int, r *hotResource, end time.Time) {
	for n := 0; time.Now().Before(end) && ctx.Err() == nil; n++ {
		reqID := fmt.Sprintf("%s-h%d-%d", h.e.runID, id, n)
		sent := time.Now()
		r.mu.Lock()
		r.waiting[id] = hotWait{since: sent, reqID: reqID}
		r.mu.Unlock()
		res, at := h.acquire(ctx, r, reqID, fmt.Sprintf("caller-%d", id), end)
		r.mu.Lock()
		delete(r.waiting, id)
		r.mu.Unlock()
		if res.Code != load.CodeOK {
			continue
		}
		g := h.granted(id, reqID, r, res, sent, at)
		select {
		case <-time.After(h.e.cfg.hold):
		case <-ctx.Done():
		}
		h.release(r, res, g, end)
	}
}

// acquire sends one logical acquire with wait_ms, and sends it again with
// the same request_id while its outcome is unknown, until end.
func (h *hotlock) acquire(ctx context.Context, r *hotResource, reqID, owner string, end time.Time) (load.Result, time.Time) {
	c := h.e.cfg
	rec := h.ph.rec.Get(load.OpWaitAcquire, 0)
	for {
		// Each caller is its own owner, as separate services would be: the
		// service caps waiters per owner.
		m := h.be.Acquire(r.name, reqID, owner, c.ttl, c.wait, 0)
		sent := time.Now()
		reply, at, err := h.e.rq.Do(context.WithoutCancel(ctx), m, c.wait+c.timeout)
		res := h.be.Parse(streams.OpAcquire, reply, err)
		if res.Code == streams.CodeLeaseLost && !at.Before(end) {
			return res, at // the answer to the bench's own cancel at the end
		}
		rec.Record(at.Sub(sent), res.Code)
		if !res.Unknown || time.Now().After(end) || ctx.Err() != nil {
			return res, at
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// granted records a grant of r to caller id's acquire reqID.
func (h *hotlock) granted(id int, reqID string, r *hotResource, res load.Result, sent, at time.Time) *load.Grant {
	h.grants.Add(1)
	h.count[id].Add(1)
	g := h.log.Granted(r.name, res.Token, res.Lease, sent, at, h.e.cfg.ttl)
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.cancelled[reqID]; ok {
		h.log.ReleasedAt(g, c) // the lease may have ended when the cancel was sent
	}
	if _, ended := r.cancelled[r.holderReq]; r.holder >= 0 && !ended {
		h.overlaps.Add(1)
	}
	for other, w := range r.waiting {
		if other != id && w.since.Before(sent) {
			h.bypassed.Add(1)
			break
		}
	}
	if !r.releasedAt.IsZero() {
		h.hand.Record(at.Sub(r.releasedAt), load.CodeOK)
		r.releasedAt = time.Time{}
	}
	r.holder, r.holderReq = id, reqID
	return g
}

// release releases r's lease, retrying (it is idempotent) while the
// outcome is unknown. After end, a lease already gone is no error: the
// bench's cancel of a wait that was granted meanwhile released it.
func (h *hotlock) release(r *hotResource, res load.Result, g *load.Grant, end time.Time) {
	now := time.Now()
	r.mu.Lock()
	r.holder, r.releasedAt = -1, now
	r.mu.Unlock()
	h.log.ReleasedAt(g, now)
	h.releases.Add(1)
	h.e.releaseRetrying(h.be, h.ph.rec.Get(load.OpRelease, 0), func() *nats.Msg { return h.be.Release(r.name, res.Lease, 0) }, end)
}

// releaseRetrying sends the release msg builds, and again (a release is
// idempotent) up to --retries times while its outcome is unknown,
// recording each answer in rec. Before end, an answer released:false is
// an error (CodeReleasedFalse); after it, a lease already gone is none:
// the bench's cancel of a wait that was granted meanwhile released it.
func (e *env) releaseRetrying(be *load.Service, rec *load.Recorder, msg func() *nats.Msg, end time.Time) {
	for range e.cfg.retries + 1 {
		sent := time.Now()
		reply, at, err := e.rq.Do(context.Background(), msg(), e.cfg.timeout)
		rr := be.Parse(streams.OpRelease, reply, err)
		code := rr.Code
		if code == load.CodeOK && !rr.Released && at.Before(end) {
			code = load.CodeReleasedFalse
		}
		rec.Record(at.Sub(sent), code)
		if !rr.Unknown {
			return
		}
	}
}

// cancelWaits cancels every wait still open, so that callers return.
func (h *hotlock) cancelWaits() {
	var wg sync.WaitGroup
	for _, r := range h.res {
		r.mu.Lock()
		for id, w := range r.waiting {
			r.cancelled[w.reqID] = time.Now()
			wg.Go(func() {
				m := h.be.Msg(streams.OpCancel, &streams.CancelRequest{Resource: r.name, RequestID: w.reqID, Owner: fmt.Sprintf("caller-%d", id)})
				_, _, _ = h.e.rq.Do(context.Background(), m, h.e.cfg.timeout)
			})
		}
		r.mu.Unlock()
	}
	wg.Wait()
}

func printHotlock(w io.Writer, r *HotlockResult) {
	fmt.Fprintf(w, "\n== hotlock: %d callers on each of %d resources, hold %.0fms ==\n", r.Waiters, r.Resources, r.HoldMs)
	fmt.Fprintf(w, "grants %d (%.0f/s), releases %d; hand-over (release sent -> next grant) p50 %s p99 %s max %s over %d hand-overs\n",
		r.Grants, r.GrantsPerS, r.Releases, fmtMs(r.HandoverP50), fmtMs(r.HandoverP99), fmtMs(r.HandoverMax), r.Handovers)
	switch {
	case r.ServiceWakes != nil && r.WakesPerRelease != nil:
		fmt.Fprintf(w, "wakes: %d by the service (%d messages on %s), %.2f per release\n", *r.ServiceWakes, r.Wakes, r.WakeSubject, *r.WakesPerRelease)
	case r.WakesPerRelease != nil:
		fmt.Fprintf(w, "wakes: %d on %s, %.2f per release\n", r.Wakes, r.WakeSubject, *r.WakesPerRelease)
	default:
		fmt.Fprintf(w, "wakes per release: n/a (no wake messages seen on %s)\n", r.WakeSubject)
	}
	fmt.Fprintf(w, "fairness: Jain index %.2f, grants per caller %d..%d, %.0f%% of grants bypassed a caller waiting longer\n",
		r.JainIndex, r.MinGrants, r.MaxGrants, 100*r.BypassFraction)
	fmt.Fprintf(w, "grants that arrived while another lease was held: %d\n", r.HolderOverlaps)
}
