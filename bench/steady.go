package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// measure samples ph while f runs.
// With the service in this process, it also takes from the service's
// metrics its own mean time per operation (receipt to reply), which tells
// time spent inside the service from time spent getting to it, and the
// requests it shed without processing them, which tells its overload from
// the store's unavailability.
func (e *env) measure(ctx context.Context, ph *phase, stream string, f func()) {
	var before svcStats
	inproc := e.svc != nil && ph.Target == "service"
	if inproc {
		before = e.serviceStats()
	}
	stop := e.sampler.start(ctx, ph, stream)
	f()
	stop()
	if inproc {
		after := e.serviceStats()
		ph.ServiceMs = map[string]float64{}
		for op, t := range after.ops {
			if n := t.count - before.ops[op].count; n > 0 {
				ph.ServiceMs[op] = round2(1000 * (t.sum - before.ops[op].sum) / float64(n))
			}
		}
		ph.ServiceShed = map[string]int64{}
		for reason, n := range after.shed {
			ph.ServiceShed[reason] = int64(n - before.shed[reason])
		}
	}
}

// serviceStats sums the metrics of the in-process service instances.
func (e *env) serviceStats() svcStats {
	sum := svcStats{ops: map[string]opTime{}, shed: map[string]float64{}}
	for _, rs := range e.instances() {
		st := rs.stats()
		for op, t := range st.ops {
			sum.ops[op] = opTime{count: sum.ops[op].count + t.count, sum: sum.ops[op].sum + t.sum}
		}
		for reason, n := range st.shed {
			sum.shed[reason] += n
		}
	}
	return sum
}

// designRates returns the rates of the flags.
func (e *env) designRates() rates {
	return rates{acquire: e.cfg.acquireRate, renew: e.cfg.renewRate, release: e.cfg.releaseRate}
}

// warm acquires n leases in a phase of its own.
func (e *env) warm(ctx context.Context, sum *Summary, wl *workload, name string, n int) {
	ph := newPhase(name, wl.be.name())
	e.measure(ctx, ph, wl.be.stream(), func() { wl.warmup(ctx, ph.rec, n, e.cfg.warmupRate) })
	sum.Phases = append(sum.Phases, ph)
	held, _ := wl.counts()
	fmt.Fprintf(e.out, "%s: %d leases held after %.1fs\n", name, held, ph.DurationS)
}

// cleanup releases what the workload still holds, unmeasured.
func (e *env) cleanup(ctx context.Context, wl *workload) {
	held, _ := wl.counts()
	if held == 0 || ctx.Err() != nil {
		return
	}
	start := time.Now()
	wl.releaseAll(ctx, newRecorders(), math.Max(e.cfg.warmupRate, 1000))
	fmt.Fprintf(e.out, "released %d leases in %.1fs\n", held, time.Since(start).Seconds())
}

// steadyPhase warms wl up and runs it at the flags' rates for --duration.
func (e *env) steadyPhase(ctx context.Context, sum *Summary, wl *workload, name string) *phase {
	e.warm(ctx, sum, wl, name+" warm-up", wl.cfg.leases)
	r := e.designRates()
	fmt.Fprintf(e.out, "%s: %s for %v over %d resources, %d leases\n", name, r, e.cfg.duration, wl.cfg.resources, wl.cfg.leases)
	ph := newPhase(name, wl.be.name())
	ph.sched = e.cfg.duration
	ph.Rates = map[string]float64{opAcquire: r.acquire, opRenew: r.renew, opRelease: r.release}
	e.measure(ctx, ph, wl.be.stream(), func() {
		wl.run(ctx, ph, r, e.cfg.duration)
		wl.drain(ctx)
	})
	sum.Phases = append(sum.Phases, ph)
	e.cleanup(ctx, wl)
	return ph
}

func (e *env) grantLog() *grantLog {
	if e.cfg.check {
		return newGrantLog()
	}
	return nil
}

// runSteady runs the design workload against the service (or, with
// --target raw, as bare KV writes).
func runSteady(ctx context.Context, e *env, sum *Summary) error {
	if e.cfg.target == "raw" {
		return e.withRawBucket(ctx, func(be backend) {
			wl := newWorkload(e.workloadConfig("raw"), be, e.rq, nil, e.runID)
			sum.use(e.steadyPhase(ctx, sum, wl, "raw"))
		})
	}
	log := e.grantLog()
	wl := newWorkload(e.workloadConfig("steady"), e.serviceBackend(), e.rq, log, e.runID)
	ph := e.steadyPhase(ctx, sum, wl, "steady")
	sum.use(ph)
	if log != nil {
		s := log.check()
		sum.Safety = &s
	}
	return nil
}

// RampStep is one step of a ramp.
type RampStep struct {
	TargetRate    float64 `json:"target_rate"`
	AcquireRate   float64 `json:"acquire_rate"`
	TotalOpsRate  float64 `json:"total_ops_rate"`
	CommitsPerSec float64 `json:"commits_per_s"`
	P50           float64 `json:"acquire_p50_ms"`
	P99           float64 `json:"acquire_p99_ms"`
	Max           float64 `json:"acquire_max_ms"`
	Errors        int64   `json:"errors"`
	Pass          bool    `json:"pass"`
	Why           string  `json:"why,omitempty"`
}

// RampResult is the outcome of a ramp: the highest acquire rate (with
// renewals and releases in the flags' proportion) whose step met the p99
// target with no errors.
type RampResult struct {
	Target          string     `json:"target"`
	P99TargetMs     float64    `json:"p99_target_ms"`
	Mix             string     `json:"mix"`
	Steps           []RampStep `json:"steps"`
	MaxAcquireRate  float64    `json:"max_acquire_rate"`
	MaxCommitsPerS  float64    `json:"max_commits_per_s"`
	MaxTotalOpsRate float64    `json:"max_total_ops_rate"`
	StoppedBy       string     `json:"stopped_by"`

	best *phase
}

// judge decides whether a ramp step met the target.
func judge(ph *phase, target float64, p99Target time.Duration) RampStep {
	acq := ph.Ops[opAcquire]
	st := RampStep{TargetRate: target, AcquireRate: acq.Rate, CommitsPerSec: ph.CommitsPerSec,
		P50: acq.P50, P99: acq.P99, Max: acq.Max}
	var why []string
	for _, s := range ph.Ops {
		st.Errors += s.Errors
		st.TotalOpsRate += s.Rate
	}
	st.TotalOpsRate = round2(st.TotalOpsRate)
	if p99 := time.Duration(acq.P99 * float64(time.Millisecond)); p99 > p99Target {
		why = append(why, fmt.Sprintf("acquire p99 %s > %v", fmtMs(acq.P99), p99Target))
	}
	if st.Errors > 0 {
		why = append(why, fmt.Sprintf("%d errors", st.Errors))
	}
	if acq.Rate < 0.95*target {
		why = append(why, fmt.Sprintf("achieved %.0f/s of %.0f/s", acq.Rate, target))
	}
	st.Pass = len(why) == 0
	st.Why = strings.Join(why, "; ")
	return st
}

// ramp raises the acquire rate step by step until a step misses the p99
// target, shows errors or cannot be sustained. Each step is the flags'
// workload scaled by rate/--acquire-rate: renewals, releases and the
// leases held (topped up, unmeasured, before the step) scale with it, so
// every lease is still renewed each --renew-interval.
func (e *env) ramp(ctx context.Context, sum *Summary, be backend, kind string) *RampResult {
	c := e.cfg
	wl := newWorkload(e.workloadConfig(kind), be, e.rq, nil, e.runID)
	renewRatio, releaseRatio, leaseRatio := 1.0, 1.0, 10.0
	if c.acquireRate > 0 {
		renewRatio, releaseRatio = c.renewRate/c.acquireRate, c.releaseRate/c.acquireRate
		leaseRatio = float64(c.leases) / c.acquireRate
	}
	leasesAt := func(rate float64) int {
		return min(int(leaseRatio*rate), c.resources/2)
	}
	res := &RampResult{Target: be.name(), P99TargetMs: float64(c.p99Target) / float64(time.Millisecond),
		Mix: fmt.Sprintf("per acquire/s: %.2f renewals/s, %.2f releases/s, %.0f leases held; %d resources", renewRatio, releaseRatio, leaseRatio, c.resources)}
	e.warm(ctx, sum, wl, kind+" warm-up", leasesAt(c.rampStart))
	res.StoppedBy = "ramp-max reached"
	for rate := c.rampStart; rate <= c.rampMax+1e-9; rate += c.rampStep {
		if ctx.Err() != nil {
			res.StoppedBy = "interrupted"
			break
		}
		wl.warmup(ctx, newRecorders(), leasesAt(rate), c.warmupRate)
		r := rates{acquire: rate, renew: rate * renewRatio, release: rate * releaseRatio}
		ph := newPhase(fmt.Sprintf("%s %.0f/s", kind, rate), be.name())
		ph.sched, ph.compact = c.rampStepDur, true
		ph.Rates = map[string]float64{opAcquire: r.acquire, opRenew: r.renew, opRelease: r.release}
		held, _ := wl.counts()
		fmt.Fprintf(e.out, "%s step: %s, %d leases held\n", kind, r, held)
		e.measure(ctx, ph, be.stream(), func() {
			wl.run(ctx, ph, r, c.rampStepDur)
			wl.drain(ctx)
		})
		sum.Phases = append(sum.Phases, ph)
		st := judge(ph, rate, c.p99Target)
		res.Steps = append(res.Steps, st)
		fmt.Fprintf(e.out, "%s step %.0f/s: acquire p99 %s, commits %.0f/s, errors %d: %s\n", kind, rate,
			fmtMs(st.P99), st.CommitsPerSec, st.Errors, passText(st))
		if !st.Pass {
			res.StoppedBy = st.Why
			break
		}
		res.MaxAcquireRate, res.MaxCommitsPerS, res.MaxTotalOpsRate, res.best = rate, st.CommitsPerSec, st.TotalOpsRate, ph
	}
	e.cleanup(ctx, wl)
	return res
}

func passText(st RampStep) string {
	if st.Pass {
		return "met"
	}
	return "missed (" + st.Why + ")"
}

func printRamp(w io.Writer, r *RampResult) {
	fmt.Fprintf(w, "\n== ramp of %s (acquire p99 target %s; %s) ==\n", r.Target, fmtMs(r.P99TargetMs), r.Mix)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "acquire/s target\tachieved\tall ops/s\tcommits/s\tp50\tp99\tmax\terrors\tresult\t")
	for _, s := range r.Steps {
		fmt.Fprintf(tw, "%.0f\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t%d\t%s\t\n", s.TargetRate, s.AcquireRate, s.TotalOpsRate,
			s.CommitsPerSec, fmtMs(s.P50), fmtMs(s.P99), fmtMs(s.Max), s.Errors, passText(s))
	}
	tw.Flush()
	fmt.Fprintf(w, "highest rate that met the target: %.0f acquires/s (%.0f ops/s, %.0f commits/s); stopped by: %s\n",
		r.MaxAcquireRate, r.MaxTotalOpsRate, r.MaxCommitsPerS, r.StoppedBy)
}

// runRamp ramps the service (or, with --target raw, bare KV writes).
func runRamp(ctx context.Context, e *env, sum *Summary) error {
	if e.cfg.target == "raw" {
		return e.withRawBucket(ctx, func(be backend) {
			r := e.ramp(ctx, sum, be, "raw ramp")
			sum.RawRamp = r
			if r.best != nil {
				sum.use(r.best)
			}
		})
	}
	r := e.ramp(ctx, sum, e.serviceBackend(), "ramp")
	sum.Ramp = r
	if r.best != nil {
		sum.use(r.best)
	}
	return nil
}

// Overhead compares the service with bare KV compare-and-set writes.
type Overhead struct {
	// Latency ratios service/raw of the same load, by operation.
	P50Ratio map[string]float64 `json:"p50_ratio,omitempty"`
	P99Ratio map[string]float64 `json:"p99_ratio,omitempty"`
	// NodeCPURatio is the nodes' CPU under the service over that under
	// raw writes (the service's extra reads and writes).
	NodeCPURatio float64 `json:"node_cpu_ratio,omitempty"`
	// MaxRateRatio is the service's ramp maximum over raw's.
	MaxRateRatio float64 `json:"max_rate_ratio,omitempty"`
	Text         string  `json:"text"`
}

// withRawBucket creates the raw baseline's bucket, runs f with its
// backend, and deletes the bucket.
func (e *env) withRawBucket(ctx context.Context, f func(be backend)) error {
	if err := ensureRawBucket(ctx, e.js, e.cfg.rawBucket); err != nil {
		return fmt.Errorf("create raw bucket %s: %w", e.cfg.rawBucket, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := e.js.DeleteKeyValue(dctx, e.cfg.rawBucket); err != nil && err != jetstream.ErrBucketNotFound {
			fmt.Fprintf(e.out, "delete raw bucket: %v\n", err)
		}
	}()
	f(newRawBackend(e.cfg.rawBucket, "bench-"+e.runID))
	return nil
}

func nodeCPU(ph *phase) float64 {
	var sum float64
	for name, p := range ph.Processes {
		if strings.HasPrefix(name, "n") && len(name) == 2 {
			sum += p.CPUPct
		}
	}
	return sum
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round2(a / b)
}

// runRaw runs the design load as bare KV compare-and-set writes, then
// against the service, and reports the service's overhead.
func runRaw(ctx context.Context, e *env, sum *Summary) error {
	var rawPh *phase
	err := e.withRawBucket(ctx, func(be backend) {
		wl := newWorkload(e.workloadConfig("raw"), be, e.rq, nil, e.runID)
		rawPh = e.steadyPhase(ctx, sum, wl, "raw")
	})
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		sum.use(rawPh)
		return nil
	}
	log := e.grantLog()
	wl := newWorkload(e.workloadConfig("steady"), e.serviceBackend(), e.rq, log, e.runID)
	svcPh := e.steadyPhase(ctx, sum, wl, "steady")
	sum.use(svcPh)
	if log != nil {
		s := log.check()
		sum.Safety = &s
	}
	o := &Overhead{P50Ratio: map[string]float64{}, P99Ratio: map[string]float64{}}
	var lines []string
	for _, op := range []string{opAcquire, opRenew, opRelease} {
		s, r := svcPh.Ops[op], rawPh.Ops[op]
		o.P50Ratio[op], o.P99Ratio[op] = ratio(s.P50, r.P50), ratio(s.P99, r.P99)
		lines = append(lines, fmt.Sprintf("%-8s p50 %s vs raw %s (x%.2f), p99 %s vs raw %s (x%.2f)", op,
			fmtMs(s.P50), fmtMs(r.P50), o.P50Ratio[op], fmtMs(s.P99), fmtMs(r.P99), o.P99Ratio[op]))
	}
	o.NodeCPURatio = ratio(nodeCPU(svcPh), nodeCPU(rawPh))
	lines = append(lines, fmt.Sprintf("commits/s %.0f vs raw %.0f; node CPU %.0f%% vs raw %.0f%% (x%.2f)",
		svcPh.CommitsPerSec, rawPh.CommitsPerSec, nodeCPU(svcPh), nodeCPU(rawPh), o.NodeCPURatio))
	o.Text = strings.Join(lines, "\n")
	sum.Overhead = o
	return nil
}

// runAll ramps raw KV writes and the service with the same mix, so that
// the two maxima come from one run on one machine, then runs the design
// workload. The ramps go first: a design workload that overloads the
// system leaves leases whose grants timed out, and their expiry (TTL
// later) would add sweeper deletes to whatever runs next.
func runAll(ctx context.Context, e *env, sum *Summary) error {
	err := e.withRawBucket(ctx, func(be backend) { sum.RawRamp = e.ramp(ctx, sum, be, "raw ramp") })
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	sum.Ramp = e.ramp(ctx, sum, e.serviceBackend(), "ramp")
	o := &Overhead{MaxRateRatio: ratio(sum.Ramp.MaxAcquireRate, sum.RawRamp.MaxAcquireRate)}
	o.Text = fmt.Sprintf("ramp maximum: service %.0f acquires/s (%.0f commits/s) vs raw KV %.0f (%.0f commits/s): x%.2f",
		sum.Ramp.MaxAcquireRate, sum.Ramp.MaxCommitsPerS, sum.RawRamp.MaxAcquireRate, sum.RawRamp.MaxCommitsPerS, o.MaxRateRatio)
	sum.Overhead = o
	if ctx.Err() != nil {
		return nil
	}
	return runSteady(ctx, e, sum)
}
