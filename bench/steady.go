package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// designRates returns the rates of the flags.
func (e *env) designRates() load.Rates {
	return load.Rates{Acquire: e.cfg.acquireRate, Renew: e.cfg.renewRate, Release: e.cfg.releaseRate}
}

// warm acquires n leases in a phase of its own.
func (e *env) warm(ctx context.Context, sum *Summary, wl *load.Workload, name string, n int) {
	ph := newPhase(name, wl.Backend(), wl.InFlight, 0)
	e.measure(ctx, sum, ph, func() { wl.Warmup(ctx, ph.rec, n, e.cfg.warmupRate) })
	fmt.Fprintf(e.out, "%s: %d leases held after %.1fs\n", name, wl.Held(), ph.DurationS)
}

// cleanup releases what the workload still holds, unmeasured.
func (e *env) cleanup(ctx context.Context, wl *load.Workload) {
	held := wl.Held()
	if held == 0 || ctx.Err() != nil {
		return
	}
	start := time.Now()
	wl.ReleaseAll(ctx, load.NewRecorders(), max(e.cfg.warmupRate, 1000))
	fmt.Fprintf(e.out, "released %d leases in %.1fs\n", held, time.Since(start).Seconds())
}

// loadPhase runs wl at r for d as phase name, with during (if not nil)
// running alongside, and waits for the answers.
func (e *env) loadPhase(ctx context.Context, sum *Summary, wl *load.Workload, name string, r load.Rates, d time.Duration, during func(*phase)) *phase {
	ph := newPhase(name, wl.Backend(), wl.InFlight, d)
	ph.Rates = r.Map()
	return e.measure(ctx, sum, ph, func() {
		var wg sync.WaitGroup
		if during != nil {
			wg.Go(func() { during(ph) })
		}
		wl.Run(ctx, ph.rec, &ph.grants, r, d)
		wl.Drain(ctx)
		wg.Wait()
	})
}

// steadyPhase warms wl up and runs it at the flags' rates for --duration.
func (e *env) steadyPhase(ctx context.Context, sum *Summary, wl *load.Workload, name string) *phase {
	e.warm(ctx, sum, wl, name+" warm-up", wl.Config().Leases)
	r := e.designRates()
	fmt.Fprintf(e.out, "%s: %s for %v over %d resources, %d leases\n", name, r, e.cfg.duration, e.cfg.resources, e.cfg.leases)
	ph := e.loadPhase(ctx, sum, wl, name, r, e.cfg.duration, nil)
	e.cleanup(ctx, wl)
	return ph
}

// runSteady runs the design workload against the service (or, with
// --target raw, as bare KV writes).
func runSteady(ctx context.Context, e *env, sum *Summary) error {
	var err error
	if e.cfg.target == "raw" {
		_, err = e.rawSteady(ctx, sum)
	} else {
		_, err = e.serviceSteady(ctx, sum)
	}
	return err
}

// rawSteady runs the design workload as bare KV writes, as the main phase.
func (e *env) rawSteady(ctx context.Context, sum *Summary) (ph *phase, err error) {
	err = e.withRawBucket(ctx, func(be load.Backend, rq *load.Requester) {
		ph = e.steadyPhase(ctx, sum, e.workload("raw", be, rq, nil), "raw")
		sum.use(ph)
	})
	return ph, err
}

// serviceSteady runs the design workload against the service, as the main
// phase, and checks its grants. With --sessions it then runs the same load
// in sessions and compares the two.
func (e *env) serviceSteady(ctx context.Context, sum *Summary) (*phase, error) {
	log := e.grantLog()
	wl := e.workload("steady", e.serviceBackend(), e.rq, log)
	msgs0 := e.streamMsgs(ctx, wl.Backend().Stream())
	e.warm(ctx, sum, wl, "steady warm-up", wl.Config().Leases)
	held := wl.Held()
	r := e.designRates()
	fmt.Fprintf(e.out, "steady: %s for %v over %d resources, %d leases\n", r, e.cfg.duration, e.cfg.resources, held)
	lost0 := wl.Losses()
	ph := e.loadPhase(ctx, sum, wl, "steady", r, e.cfg.duration, nil)
	wl.Overdue(time.Now())
	lost := wl.Losses().Sub(lost0)
	e.cleanup(ctx, wl)
	sum.use(ph)
	var err error
	if e.cfg.sessions > 0 && ctx.Err() == nil {
		pause := e.awaitMarkers(ctx, wl.Backend().Stream(), msgs0)
		err = e.sessionSteady(ctx, sum, log, ph, held, lost, pause)
	}
	return ph, errors.Join(err, sum.check(log))
}

// withRawBucket creates the raw baseline's bucket (R3, history 1, file
// storage, like the lock bucket) as the store user, runs f with its
// backend and load connections of that user, and deletes the bucket.
func (e *env) withRawBucket(ctx context.Context, f func(be load.Backend, rq *load.Requester)) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := e.js.CreateOrUpdateKeyValue(cctx, jetstream.KeyValueConfig{Bucket: e.cfg.rawBucket,
			Description: "jetlock bench raw baseline", History: 1, Storage: jetstream.FileStorage, Replicas: 3})
		if err == nil {
			// Atomic batches, as the service's bucket allows them
			// (--raw-batch writes them).
			err = allowAtomic(cctx, e.js, streams.StreamName(e.cfg.rawBucket))
		}
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("create raw bucket %s: %w", e.cfg.rawBucket, err)
		}
		time.Sleep(250 * time.Millisecond) // the cluster may still be placing peers
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := e.js.DeleteKeyValue(dctx, e.cfg.rawBucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			fmt.Fprintf(e.out, "delete raw bucket: %v\n", err)
		}
	}()
	conns, err := e.connect(devcluster.Store, e.url, e.cfg.conns)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	rq, err := load.NewRequester(conns, e.cfg.maxInFlight)
	if err != nil {
		return err
	}
	defer rq.Close()
	f(load.NewRaw(e.cfg.rawBucket, "bench-"+e.runID), rq)
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
	acq := ph.Ops[load.OpAcquire]
	st := RampStep{TargetRate: target, AcquireRate: acq.Rate, CommitsPerSec: ph.CommitsPerSec, P50: acq.P50, P99: acq.P99, Max: acq.Max}
	for _, s := range ph.Ops {
		st.Errors += s.Errors
		st.TotalOpsRate += s.Rate
	}
	st.TotalOpsRate = round2(st.TotalOpsRate)
	var why []string
	if p99 := time.Duration(acq.P99 * float64(time.Millisecond)); p99 > p99Target {
		why = append(why, fmt.Sprintf("acquire p99 %s > %v", fmtMs(acq.P99), p99Target))
	}
	if st.Errors > 0 {
		why = append(why, fmt.Sprintf("%d errors", st.Errors))
	}
	if acq.Rate < 0.95*target {
		why = append(why, fmt.Sprintf("achieved %.0f/s of %.0f/s", acq.Rate, target))
	}
	st.Pass, st.Why = len(why) == 0, strings.Join(why, "; ")
	return st
}

// rampMaxReached is a ramp's StoppedBy when no step missed.
const rampMaxReached = "ramp-max reached"

// ramp raises the acquire rate step by step until a step misses the p99
// target, shows errors or cannot be sustained. Each step is the flags'
// workload scaled by rate/--acquire-rate: renewals, releases and the
// leases held (topped up, unmeasured, before the step) scale with it, so
// every lease is still renewed each --renew-interval.
func (e *env) ramp(ctx context.Context, sum *Summary, wl *load.Workload, kind string) *RampResult {
	c := e.cfg
	mix := load.Rates{Acquire: 1, Renew: 1, Release: 1}
	leaseRatio := 10.0
	if c.acquireRate > 0 {
		mix = load.Rates{Acquire: 1, Renew: c.renewRate / c.acquireRate, Release: c.releaseRate / c.acquireRate}
		leaseRatio = float64(c.leases) / c.acquireRate
	}
	leasesAt := func(rate float64) int { return min(int(leaseRatio*rate), c.resources/2) }
	res := &RampResult{Target: wl.Backend().Name(), P99TargetMs: float64(c.p99Target) / float64(time.Millisecond), StoppedBy: rampMaxReached,
		Mix: fmt.Sprintf("per acquire/s: %.2f renewals/s, %.2f releases/s, %.0f leases held; %d resources", mix.Renew, mix.Release, leaseRatio, c.resources)}
	e.warm(ctx, sum, wl, kind+" warm-up", leasesAt(c.rampStart))
	for rate := c.rampStart; rate <= c.rampMax+1e-9 && ctx.Err() == nil; rate += c.rampStep {
		wl.Warmup(ctx, load.NewRecorders(), leasesAt(rate), c.warmupRate)
		r := load.Rates{Acquire: rate, Renew: rate * mix.Renew, Release: rate * mix.Release}
		fmt.Fprintf(e.out, "%s step: %s, %d leases held\n", kind, r, wl.Held())
		ph := e.loadPhase(ctx, sum, wl, fmt.Sprintf("%s %.0f/s", kind, rate), r, c.rampStepDur, nil)
		ph.compact = true
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
	if ctx.Err() != nil {
		res.StoppedBy = "interrupted"
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

// rampRow is a step's row of the ramp tables.
func rampRow(s RampStep) []string {
	return []string{fmt.Sprintf("%.0f", s.TargetRate), fmt.Sprintf("%.0f", s.AcquireRate), fmt.Sprintf("%.0f", s.TotalOpsRate),
		fmt.Sprintf("%.0f", s.CommitsPerSec), fmtMs(s.P50), fmtMs(s.P99), fmtMs(s.Max), fmt.Sprint(s.Errors), passText(s)}
}

func printRamp(w io.Writer, r *RampResult) {
	fmt.Fprintf(w, "\n== ramp of %s (acquire p99 target %s; %s) ==\n", r.Target, fmtMs(r.P99TargetMs), r.Mix)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "acquire/s target\tachieved\tall ops/s\tcommits/s\tp50\tp99\tmax\terrors\tresult\t")
	for _, s := range r.Steps {
		fmt.Fprintln(tw, strings.Join(rampRow(s), "\t")+"\t")
	}
	tw.Flush()
	fmt.Fprintf(w, "highest rate that met the target: %.0f acquires/s (%.0f ops/s, %.0f commits/s); stopped by: %s\n",
		r.MaxAcquireRate, r.MaxTotalOpsRate, r.MaxCommitsPerS, r.StoppedBy)
}

// runRamp ramps the service (or, with --target raw, bare KV writes).
func runRamp(ctx context.Context, e *env, sum *Summary) error {
	var r *RampResult
	var err error
	if e.cfg.target == "raw" {
		err = e.rawRamp(ctx, sum)
		r = sum.RawRamp
	} else {
		r = e.serviceRamp(ctx, sum)
	}
	if r != nil && r.best != nil {
		sum.use(r.best)
	}
	return err
}

func (e *env) rawRamp(ctx context.Context, sum *Summary) error {
	return e.withRawBucket(ctx, func(be load.Backend, rq *load.Requester) {
		sum.RawRamp = e.ramp(ctx, sum, e.workload("raw", be, rq, nil), "raw ramp")
	})
}

func (e *env) serviceRamp(ctx context.Context, sum *Summary) *RampResult {
	sum.Ramp = e.ramp(ctx, sum, e.workload("ramp", e.serviceBackend(), e.rq, nil), "ramp")
	return sum.Ramp
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

func nodeCPU(ph *phase) float64 {
	var sum float64
	for name, p := range ph.Processes {
		if isNode(name) {
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
	rawPh, err := e.rawSteady(ctx, sum)
	if err != nil || ctx.Err() != nil {
		return err
	}
	svcPh, err := e.serviceSteady(ctx, sum)
	o := &Overhead{P50Ratio: map[string]float64{}, P99Ratio: map[string]float64{}}
	var lines []string
	for _, op := range []string{load.OpAcquire, load.OpRenew, load.OpRelease} {
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
	return err
}

// runAll ramps raw KV writes and the service with the same mix, so that
// the two maxima come from one run on one machine, then runs the design
// workload. The ramps go first: a design workload that overloads the
// system leaves leases whose grants timed out, and their expiry (TTL
// later) would add sweeper deletes to whatever runs next.
func runAll(ctx context.Context, e *env, sum *Summary) error {
	if err := e.rawRamp(ctx, sum); err != nil || ctx.Err() != nil {
		return err
	}
	e.serviceRamp(ctx, sum)
	o := &Overhead{MaxRateRatio: ratio(sum.Ramp.MaxAcquireRate, sum.RawRamp.MaxAcquireRate)}
	o.Text = fmt.Sprintf("ramp maximum: service %.0f acquires/s (%.0f commits/s) vs raw KV %.0f (%.0f commits/s): x%.2f",
		sum.Ramp.MaxAcquireRate, sum.Ramp.MaxCommitsPerS, sum.RawRamp.MaxAcquireRate, sum.RawRamp.MaxCommitsPerS, o.MaxRateRatio)
	sum.Overhead = o
	if ctx.Err() != nil {
		return nil
	}
	return runSteady(ctx, e, sum)
}

// allowAtomic lets stream take atomic batches.
func allowAtomic(ctx context.Context, js jetstream.JetStream, stream string) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	if cfg.AllowAtomicPublish {
		return nil
	}
	cfg.AllowAtomicPublish = true
	_, err = js.UpdateStream(ctx, cfg)
	return err
}
