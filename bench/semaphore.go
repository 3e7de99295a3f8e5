package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/streams"
)

// SemaphoreResult is the outcome of the semaphore scenario.
type SemaphoreResult struct {
	Semaphores int     `json:"semaphores"`
	Waiters    int     `json:"waiters_per_semaphore"`
	Limit      int     `json:"limit"`
	HoldMs     float64 `json:"hold_ms"`
	WaitMs     float64 `json:"wait_ms"`
	Grants     int64   `json:"grants"`
	GrantsPerS float64 `json:"grants_per_s"`
	Releases   int64   `json:"releases"`
	// Wait: a waiting acquire's request sent -> its grant received (the
	// first send of a request retried with the same request_id).
	WaitP50 float64 `json:"wait_p50_ms"`
	WaitP99 float64 `json:"wait_p99_ms"`
	WaitMax float64 `json:"wait_max_ms"`
	// Hand-over: the release of a permit sent -> the next grant of that
	// permit received (a release hands its permit to the next waiter).
	Handovers    int64            `json:"handovers"`
	HandoverP50  float64          `json:"handover_p50_ms"`
	HandoverP99  float64          `json:"handover_p99_ms"`
	HandoverMax  float64          `json:"handover_max_ms"`
	Errors       int64            `json:"errors"`
	ErrorsByCode map[string]int64 `json:"errors_by_code"`
	// MaxHeld is the most permits of one semaphore held at once, by the
	// spans of the grants (each from its grant's reply to its release's
	// send, within what the service held), per semaphore in
	// MaxHeldBySemaphore; OverLimit counts the semaphores where it
	// exceeded the limit (must be 0).
	MaxHeld            int   `json:"max_held"`
	MaxHeldBySemaphore []int `json:"max_held_by_semaphore"`
	OverLimit          int   `json:"over_limit"`
}

// semaphore is one contended semaphore and what the bench saw of it.
type semaphore struct {
	name string

	mu         sync.Mutex
	releasedAt map[int]time.Time // a permit's release was sent and no grant of it has arrived since
	waiting    map[int]string    // caller -> request id of its open wait
	// cancelled holds the request ids of the waits the bench cancelled at
	// the end, and when each cancel was sent: it ends the permit if the
	// wait was granted meanwhile.
	cancelled map[string]time.Time
	spans     []load.Span
}

type semRun struct {
	e    *env
	be   *load.Service
	ph   *phase
	log  *load.GrantLog
	sems []*semaphore
	hand *load.Recorder

	grants, releases atomic.Int64
}

// runSemaphore makes --waiters callers on each of --hot-resources
// semaphores of --limit permits acquire a permit with wait_ms (--wait),
// hold it --hold, release it and acquire again, for --duration. Each
// permit is a lease of its own key (name#k) with tokens of its own, which
// the double-grant check checks; and the spans of the grants show how
// many permits of one semaphore were held at once (at most the limit).
func runSemaphore(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	s := &semRun{e: e, be: e.serviceBackend(), log: e.grantLog(), hand: load.NewRecorder("handover", 0)}
	s.ph = newPhase("semaphore", s.be, e.rq.InFlight, c.duration)
	for i := range c.hotResources {
		s.sems = append(s.sems, &semaphore{name: fmt.Sprintf("%ssem%03d", e.names("semaphore"), i), releasedAt: map[int]time.Time{},
			waiting: map[int]string{}, cancelled: map[string]time.Time{}})
	}
	fmt.Fprintf(e.out, "semaphore: %d callers on each of %d semaphores of %d permits, hold %v, wait_ms %d, for %v\n",
		c.waiters, c.hotResources, c.limit, c.hold, c.wait.Milliseconds(), c.duration)
	e.measure(ctx, sum, s.ph, func() { s.run(ctx) })
	sum.use(s.ph)
	r := s.result()
	sum.Semaphore = r
	err := sum.check(s.log)
	if r.OverLimit > 0 {
		return fmt.Errorf("semaphore: %d semaphores had more than %d permits held at once (at most %d)", r.OverLimit, r.Limit, r.MaxHeld)
	}
	return err
}

// run runs the callers until --duration ends, then cancels the waits
// still open until every caller returned.
func (s *semRun) run(ctx context.Context) {
	c := s.e.cfg
	runWaiting(ctx, c.hotResources*c.waiters, c.duration,
		func(i int, end time.Time) { s.caller(ctx, i, s.sems[i%c.hotResources], end) }, s.cancelWaits)
}

// caller acquires a permit of sm, holds and releases it, until end.
func (s *semRun) caller(ctx context.Context, id int, sm *semaphore, end time.Time) {
	c := s.e.cfg
	for n := 0; time.Now().Before(end) && ctx.Err() == nil; n++ {
		reqID := fmt.Sprintf("%s-p%d-%d", s.e.runID, id, n)
		sm.mu.Lock()
		sm.waiting[id] = reqID
		sm.mu.Unlock()
		res, g, sent, at := s.acquire(ctx, sm, reqID, fmt.Sprintf("caller-%d", id), end)
		sm.mu.Lock()
		delete(sm.waiting, id)
		sm.mu.Unlock()
		if res.Code != load.CodeOK {
			time.Sleep(10 * time.Millisecond) // no tight loop on a persistent error
			continue
		}
		if g.Permit < 1 || g.Permit > c.limit {
			// A permit the bench cannot release: the cancel gives it back.
			s.ph.rec.Get(opBadGrant, 0).Fail(streams.CodeInternal)
			_, _, _ = s.e.rq.Do(context.WithoutCancel(ctx), s.be.CancelPermit(sm.name, c.limit, reqID, fmt.Sprintf("caller-%d", id)), c.timeout)
			continue
		}
		lg := s.granted(sm, reqID, res, g, sent, at, end)
		select {
		case <-time.After(c.hold):
		case <-ctx.Done():
		}
		s.release(sm, reqID, res, g, lg, at, end)
	}
}

// acquire sends one logical waiting acquire of a permit, and sends it
// again with the same request_id while its outcome is unknown, until end.
// It returns when the first request was sent and when the answer came.
func (s *semRun) acquire(ctx context.Context, sm *semaphore, reqID, owner string, end time.Time) (load.Result, load.GrantReply, time.Time, time.Time) {
	c := s.e.cfg
	rec := s.ph.rec.Get(load.OpWaitAcquire, 0)
	first := time.Now()
	for {
		// Each caller is its own owner, as separate services would be.
		m := s.be.AcquirePermit(sm.name, reqID, owner, c.limit, c.ttl, c.wait)
		sent := time.Now()
		reply, at, err := s.e.rq.Do(context.WithoutCancel(ctx), m, c.wait+c.timeout)
		res, g := s.be.ParseGrant(reply, err)
		if res.Code == streams.CodeLeaseLost && !at.Before(end) {
			return res, g, first, at // the answer to the bench's own cancel at the end
		}
		rec.Record(at.Sub(sent), res.Code)
		if !res.Unknown || time.Now().After(end) || ctx.Err() != nil {
			return res, g, first, at
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// granted records a grant of permit g.Permit of sm to the acquire reqID.
func (s *semRun) granted(sm *semaphore, reqID string, res load.Result, g load.GrantReply, sent, at, end time.Time) *load.Grant {
	s.grants.Add(1)
	lg := s.log.Granted(streams.PermitResource(sm.name, g.Permit), res.Token, res.Lease, sent, at, g.TTL())
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if c, ok := sm.cancelled[reqID]; ok {
		s.log.ReleasedAt(lg, c) // the permit may have ended when the cancel was sent
	}
	if t := sm.releasedAt[g.Permit]; !t.IsZero() {
		if at.Before(end) {
			s.hand.Record(at.Sub(t), load.CodeOK)
		}
		delete(sm.releasedAt, g.Permit)
	}
	return lg
}

// release releases the permit, retrying (it is idempotent) while the
// outcome is unknown, and records the grant's span: from its reply to the
// release's send, or to the bench's cancel of its wait if that came
// first. After end, a permit already gone is no error: the bench's cancel
// of a wait granted meanwhile released it.
func (s *semRun) release(sm *semaphore, reqID string, res load.Result, g load.GrantReply, lg *load.Grant, at, end time.Time) {
	now := time.Now()
	sm.mu.Lock()
	sm.releasedAt[g.Permit] = now
	to := now
	if t, ok := sm.cancelled[reqID]; ok && t.Before(to) {
		to = t
	}
	sm.spans = append(sm.spans, load.Span{From: at, To: to})
	sm.mu.Unlock()
	s.log.ReleasedAt(lg, now)
	s.releases.Add(1)
	s.e.releaseRetrying(s.be, s.ph.rec.Get(load.OpRelease, 0), func() *nats.Msg { return s.be.ReleasePermit(sm.name, g.Permit, res.Lease) }, end)
}

// cancelWaits cancels every wait still open, so that callers return.
func (s *semRun) cancelWaits() {
	c := s.e.cfg
	var wg sync.WaitGroup
	for _, sm := range s.sems {
		sm.mu.Lock()
		for id, reqID := range sm.waiting {
			sm.cancelled[reqID] = time.Now()
			wg.Go(func() {
				_, _, _ = s.e.rq.Do(context.Background(), s.be.CancelPermit(sm.name, c.limit, reqID, fmt.Sprintf("caller-%d", id)), c.timeout)
			})
		}
		sm.mu.Unlock()
	}
	wg.Wait()
}

// result summarises the run.
func (s *semRun) result() *SemaphoreResult {
	c := s.e.cfg
	r := &SemaphoreResult{Semaphores: c.hotResources, Waiters: c.waiters, Limit: c.limit, HoldMs: float64(c.hold) / 1e6,
		WaitMs: float64(c.wait.Milliseconds()), Grants: s.grants.Load(), Releases: s.releases.Load(), ErrorsByCode: map[string]int64{}}
	if s.ph.DurationS > 0 {
		r.GrantsPerS = round2(float64(r.Grants) / min(s.ph.DurationS, c.duration.Seconds()))
	}
	wait := s.ph.Ops[load.OpWaitAcquire]
	r.WaitP50, r.WaitP99, r.WaitMax = wait.P50, wait.P99, wait.Max
	hs := s.hand.Summary(0)
	r.Handovers, r.HandoverP50, r.HandoverP99, r.HandoverMax = hs.Count, hs.P50, hs.P99, hs.Max
	for _, op := range []string{load.OpWaitAcquire, load.OpRelease, opBadGrant} {
		r.Errors += s.ph.Ops[op].Errors
		for code, n := range s.ph.Ops[op].ErrorsByCode {
			r.ErrorsByCode[code] += n
		}
	}
	for _, sm := range s.sems {
		sm.mu.Lock()
		n := load.MaxOverlap(sm.spans)
		sm.mu.Unlock()
		r.MaxHeldBySemaphore = append(r.MaxHeldBySemaphore, n)
		r.MaxHeld = max(r.MaxHeld, n)
		if n > c.limit {
			r.OverLimit++
		}
	}
	return r
}

func printSemaphore(w io.Writer, r *SemaphoreResult) {
	fmt.Fprintf(w, "\n== semaphore: %d callers on each of %d semaphores of %d permits, hold %.0fms ==\n", r.Waiters, r.Semaphores, r.Limit, r.HoldMs)
	fmt.Fprintf(w, "grants %d (%.0f/s), releases %d; wait (sent -> grant) p50 %s p99 %s max %s; %s\n",
		r.Grants, r.GrantsPerS, r.Releases, fmtMs(r.WaitP50), fmtMs(r.WaitP99), fmtMs(r.WaitMax), codesText(r.Errors, r.ErrorsByCode))
	fmt.Fprintf(w, "hand-over (release of a permit sent -> next grant of it) p50 %s p99 %s max %s over %d hand-overs\n",
		fmtMs(r.HandoverP50), fmtMs(r.HandoverP99), fmtMs(r.HandoverMax), r.Handovers)
	fmt.Fprintf(w, "permits of one semaphore held at once, by the grants' spans: at most %d of %d (per semaphore %v); semaphores over the limit: %d\n",
		r.MaxHeld, r.Limit, r.MaxHeldBySemaphore, r.OverLimit)
}
