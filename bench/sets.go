package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/streams"
)

// SetsResult is the outcome of the sets scenario: closed-loop workers
// acquiring and releasing lock sets, first uncontended, then drawn from
// few resources and waiting, then the single-key cycles of the same run.
type SetsResult struct {
	Workers      int          `json:"workers"`
	SetMin       int          `json:"set_min"`
	SetMax       int          `json:"set_max"`
	Resources    int          `json:"resources"`     // the sets phase draws from these
	HotResources int          `json:"hot_resources"` // the contended phase draws from these
	WaitMs       float64      `json:"wait_ms"`
	Sets         *SetsFigures `json:"sets"`
	Contended    *SetsFigures `json:"contended"`
	// Cycles is the single-key cycles phase of the same run, with the
	// same workers (also under cycles).
	Cycles *CyclesResult `json:"cycles"`
}

// SetsFigures are one phase's figures. An acquire is one logical set
// acquire (its retries with the same request_id included); a cycle is a
// set acquired and released. Latencies count from each request's send
// (the phase's ops have every percentile; a waiting acquire is
// wait_acquire).
type SetsFigures struct {
	Phase           string  `json:"phase"`
	Acquires        int64   `json:"acquires"`
	Granted         int64   `json:"granted"`
	GrantsPerS      float64 `json:"set_acquires_per_s"`
	Cycles          int64   `json:"cycles"`
	CyclesPerS      float64 `json:"cycles_per_s"`
	ResourcesLocked int64   `json:"resources_locked"`
	ResourcesPerS   float64 `json:"resources_locked_per_s"`
	MeanSetSize     float64 `json:"mean_set_size"`
	AcquireP50      float64 `json:"acquire_p50_ms"`
	AcquireP99      float64 `json:"acquire_p99_ms"`
	ReleaseP50      float64 `json:"release_p50_ms"`
	ReleaseP99      float64 `json:"release_p99_ms"`
	CycleP50        float64 `json:"cycle_p50_ms"`
	CycleP99        float64 `json:"cycle_p99_ms"`
	Errors          int64   `json:"errors"`
	// ErrorsByCode counts the errors of acquires, their retries and
	// releases by code.
	ErrorsByCode map[string]int64 `json:"errors_by_code"`
	// Waited (contended phase) counts the grants that came from the
	// queues: the service grants a set that waited with its hand-over TTL
	// (5s by default), shorter than the TTL asked, so they are told apart
	// only when --ttl is longer than that (null otherwise). WaitedP50..Max
	// is their acquire latency, send to grant.
	Waited    *int64  `json:"waited,omitempty"`
	WaitedP50 float64 `json:"waited_p50_ms,omitempty"`
	WaitedP99 float64 `json:"waited_p99_ms,omitempty"`
	WaitedMax float64 `json:"waited_max_ms,omitempty"`
}

// opBadGrant counts grants whose answer the bench could not use (a set
// grant not naming the set, a permit out of range), given back at once.
const opBadGrant = "bad_grant"

// handoverTTL is the service's default hand-over TTL: the longest TTL of
// a lease granted after waiting (lockd's HandoverTTL).
const handoverTTL = 5 * time.Second

// runSets runs the phases sets and sets contended, then the single-key
// cycles, and checks every resource's grants of the three for double
// grants: each set grant gives a token per resource, a grant of that
// resource in the log.
func runSets(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	log := e.grantLog()
	r := &SetsResult{Workers: c.workers, SetMin: c.setMin, SetMax: c.setMax, Resources: c.resources, HotResources: c.setHot,
		WaitMs: float64(c.wait.Milliseconds())}
	sets := e.setPhase(ctx, sum, "sets", false, log)
	r.Sets = sets.figures()
	if ctx.Err() == nil {
		r.Contended = e.setPhase(ctx, sum, "sets contended", true, log).figures()
	}
	if ctx.Err() == nil {
		e.cycles(ctx, sum, e.serviceBackend(), e.rq, log)
		r.Cycles = sum.Cycles
	}
	sum.use(sets.ph)
	sum.Sets = r
	return sum.check(log)
}

// setRun is one phase of the sets scenario.
type setRun struct {
	e     *env
	be    *load.Service
	ph    *phase
	log   *load.GrantLog
	names string
	hot   bool // contended: every worker draws from --set-hot resources and waits
	op    string
	wait  time.Duration

	waited                            *load.Recorder // grants that came from the queues (hot)
	acquires, granted, cycles, locked atomic.Int64
}

// setPhase runs one phase of set cycles for --duration.
func (e *env) setPhase(ctx context.Context, sum *Summary, name string, hot bool, log *load.GrantLog) *setRun {
	c := e.cfg
	s := &setRun{e: e, be: e.serviceBackend(), log: log, hot: hot, op: load.OpAcquire, names: e.names(strings.ReplaceAll(name, " ", "-")),
		waited: load.NewRecorder("waited", 0)}
	pool := c.resources
	if hot {
		s.op, s.wait, pool = load.OpWaitAcquire, c.wait, c.setHot
	}
	s.ph = newPhase(name, s.be, e.rq.InFlight, c.duration)
	fmt.Fprintf(e.out, "%s: %d workers acquire and release sets of %d..%d resources of %d (wait_ms %d) for %v\n",
		name, c.workers, c.setMin, c.setMax, pool, s.wait.Milliseconds(), c.duration)
	e.measure(ctx, sum, s.ph, func() {
		end := time.Now().Add(c.duration)
		var wg sync.WaitGroup
		for w := range c.workers {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			wg.Go(func() {
				for n := 0; time.Now().Before(end) && ctx.Err() == nil; n++ {
					if !s.cycle(ctx, w, n, s.draw(rng, w)) {
						time.Sleep(10 * time.Millisecond) // no tight loop on a persistent error
					}
				}
			})
		}
		wg.Wait()
	})
	return s
}

// draw returns a set of distinct random resources, of a random size in
// [--set-min, --set-max], sorted. Uncontended, worker w of W draws from
// its own share, w, w+W, w+2W, ... of --resources (as cycles does), so
// that no set meets another; contended, every worker draws from the
// first --set-hot.
func (s *setRun) draw(rng *rand.Rand, w int) []string {
	c := s.e.cfg
	size := c.setMin + rng.IntN(c.setMax-c.setMin+1)
	share, stride, base := c.setHot, 1, 0
	if !s.hot {
		share, stride, base = (c.resources-w+c.workers-1)/c.workers, c.workers, w
	}
	ids := map[int]bool{}
	for len(ids) < size {
		ids[base+rng.IntN(share)*stride] = true
	}
	set := make([]string, 0, size)
	for id := range ids {
		set = append(set, fmt.Sprintf("%sr%06d", s.names, id))
	}
	slices.Sort(set)
	return set
}

// cycle acquires set (waiting when contended) and releases it, and
// reports whether both succeeded.
func (s *setRun) cycle(ctx context.Context, w, n int, set []string) bool {
	c := s.e.cfg
	ctx = context.WithoutCancel(ctx) // finish the cycle: each request is bounded
	reqID := fmt.Sprintf("%s-s%d-%d", s.e.runID, w, n)
	owner := fmt.Sprintf("set-worker-%d", w) // each its own owner, as the service caps waiters per owner
	rec := s.ph.rec.Get(s.op, 0)
	start := time.Now()
	s.acquires.Add(1)
	var res load.Result
	var g load.GrantReply
	var at time.Time
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		reply, got, err := s.e.rq.Do(ctx, s.be.AcquireSet(set, reqID, owner, c.ttl, s.wait), c.timeout+s.wait)
		at = got
		res, g = s.be.ParseGrant(reply, err)
		if attempt == 0 {
			rec.Record(at.Sub(sent), res.Code)
		} else {
			s.ph.rec.Get(load.OpAcquireRetry, 0).Record(at.Sub(sent), res.Code)
		}
		if !res.Unknown {
			break
		}
		if attempt >= c.retries {
			// Given up: a grant nobody will use is released by the cancel.
			_, _, _ = s.e.rq.Do(ctx, s.be.CancelSet(set, reqID, owner), c.timeout)
			return false
		}
		time.Sleep(load.RetryDelay(250*time.Millisecond, res.RetryAfter))
	}
	if res.Code != load.CodeOK {
		return false
	}
	if !s.sameSet(set, g.Resources) {
		s.ph.rec.Get(opBadGrant, 0).Fail(streams.CodeInternal) // a grant that does not name the set: give it back
		s.release(ctx, set, res.Lease, nil)
		return false
	}
	s.granted.Add(1)
	s.locked.Add(int64(len(set)))
	if s.hot && c.ttl > handoverTTL && g.TTL() < c.ttl {
		s.waited.Record(at.Sub(start), load.CodeOK)
	}
	grants := make([]*load.Grant, len(g.Resources))
	for i, m := range g.Resources {
		// One lease id for the set: each resource's grant is logged
		// under a lease key of its own.
		grants[i] = s.log.Granted(m.Resource, m.Token, res.Lease+"@"+m.Resource, start, at, g.TTL())
	}
	done, ok := s.release(ctx, set, res.Lease, grants)
	if ok {
		s.cycles.Add(1)
		s.ph.rec.Get(load.OpCycle, 0).Record(done.Sub(start), load.CodeOK)
	}
	return ok
}

// sameSet reports whether a grant's members are exactly set (sorted).
func (s *setRun) sameSet(set []string, members []streams.SetMember) bool {
	if len(members) != len(set) {
		return false
	}
	for i, m := range members {
		if m.Resource != set[i] || m.Token == 0 {
			return false
		}
	}
	return true
}

// release releases the set's lease (retrying, it is idempotent, while the
// outcome is unknown), after marking its grants released when the first
// release is sent. It returns when the answer came and whether the set
// was released.
func (s *setRun) release(ctx context.Context, set []string, lease string, grants []*load.Grant) (time.Time, bool) {
	c := s.e.cfg
	rec := s.ph.rec.Get(load.OpRelease, 0)
	for attempt := 0; ; attempt++ {
		sent := time.Now()
		if attempt == 0 {
			for _, g := range grants {
				s.log.ReleasedAt(g, sent)
			}
		}
		reply, at, err := s.e.rq.Do(ctx, s.be.ReleaseSet(set, lease), c.timeout)
		rr := s.be.Parse(streams.OpRelease, reply, err)
		code := rr.Code
		if code == load.CodeOK && !rr.Released {
			code = load.CodeReleasedFalse
		}
		rec.Record(at.Sub(sent), code)
		if !rr.Unknown || attempt >= c.retries {
			return at, code == load.CodeOK
		}
		time.Sleep(load.RetryDelay(250*time.Millisecond, rr.RetryAfter))
	}
}

// figures summarises the phase.
func (s *setRun) figures() *SetsFigures {
	ph := s.ph
	d := ph.DurationS
	if sched := ph.sched.Seconds(); sched > 0 && sched < d {
		d = sched
	}
	per := func(n int64) float64 {
		if d <= 0 {
			return 0
		}
		return round2(float64(n) / d)
	}
	acq, rel, cyc := ph.Ops[s.op], ph.Ops[load.OpRelease], ph.Ops[load.OpCycle]
	f := &SetsFigures{Phase: ph.Name, Acquires: s.acquires.Load(), Granted: s.granted.Load(), Cycles: s.cycles.Load(),
		ResourcesLocked: s.locked.Load(), AcquireP50: acq.P50, AcquireP99: acq.P99, ReleaseP50: rel.P50, ReleaseP99: rel.P99,
		CycleP50: cyc.P50, CycleP99: cyc.P99, ErrorsByCode: map[string]int64{}}
	f.GrantsPerS, f.CyclesPerS, f.ResourcesPerS = per(f.Granted), per(f.Cycles), per(f.ResourcesLocked)
	if f.Granted > 0 {
		f.MeanSetSize = round2(float64(f.ResourcesLocked) / float64(f.Granted))
	}
	for _, op := range []string{s.op, load.OpAcquireRetry, load.OpRelease, opBadGrant} {
		f.Errors += ph.Ops[op].Errors
		for code, n := range ph.Ops[op].ErrorsByCode {
			f.ErrorsByCode[code] += n
		}
	}
	if s.hot && s.e.cfg.ttl > handoverTTL {
		ws := s.waited.Summary(0)
		f.Waited = &ws.Count
		f.WaitedP50, f.WaitedP99, f.WaitedMax = ws.P50, ws.P99, ws.Max
	}
	return f
}

func printSets(w io.Writer, r *SetsResult) {
	fmt.Fprintf(w, "\n== sets: %d closed-loop workers, sets of %d..%d resources, acquire + release ==\n", r.Workers, r.SetMin, r.SetMax)
	for _, f := range []*SetsFigures{r.Sets, r.Contended} {
		if f == nil {
			continue
		}
		fmt.Fprintf(w, "%s: %d sets granted (%.0f/s, mean size %.1f, %.0f resources locked/s), %d cycles (%.0f/s); acquire p50 %s p99 %s, release p50 %s p99 %s, whole cycle p50 %s p99 %s; %s\n",
			f.Phase, f.Granted, f.GrantsPerS, f.MeanSetSize, f.ResourcesPerS, f.Cycles, f.CyclesPerS,
			fmtMs(f.AcquireP50), fmtMs(f.AcquireP99), fmtMs(f.ReleaseP50), fmtMs(f.ReleaseP99), fmtMs(f.CycleP50), fmtMs(f.CycleP99), codesText(f.Errors, f.ErrorsByCode))
		if f.Waited != nil {
			fmt.Fprintf(w, "%s: %d of %d grants came from the queues (hand-over TTL), waited p50 %s p99 %s max %s\n",
				f.Phase, *f.Waited, f.Granted, fmtMs(f.WaitedP50), fmtMs(f.WaitedP99), fmtMs(f.WaitedMax))
		} else if f.Phase == "sets contended" {
			fmt.Fprintf(w, "%s: waits not told apart (--ttl is not above the hand-over TTL, 5s); see wait_acquire above\n", f.Phase)
		}
	}
	if c := r.Cycles; c != nil && r.Sets != nil {
		fmt.Fprintf(w, "beside single-key cycles of the same run: %.0f set cycles/s (%.0f resources/s) against %.0f single-key cycles/s\n",
			r.Sets.CyclesPerS, r.Sets.ResourcesPerS, c.CyclesPerS)
	}
}

// codesText renders n errors and their codes.
func codesText(n int64, byCode map[string]int64) string {
	if n == 0 {
		return "0 errors"
	}
	codes := sortedKeys(byCode, strings.Compare)
	parts := make([]string, len(codes))
	for i, code := range codes {
		parts[i] = fmt.Sprintf("%s:%d", code, byCode[code])
	}
	return fmt.Sprintf("%d errors (%s)", n, strings.Join(parts, " "))
}
