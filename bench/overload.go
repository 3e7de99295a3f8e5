package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// OverloadResult is the outcome of the overload scenario: the design load's
// leases kept renewing while acquires (and as many releases) arrive at
// several times what the deployment carries. The service should keep
// every lease it holds (renewals go first) and shed new work early, with
// retry_after_ms, rather than let renewals time out.
type OverloadResult struct {
	DesignAcquireRate   float64 `json:"design_acquire_rate"`
	OverloadAcquireRate float64 `json:"overload_acquire_rate"`
	Leases              int     `json:"leases"`
	// RenewalsLost counts the renewals of the overload phase answered
	// lease_lost: a lease the workload held and renewed, ended before its
	// holder let it go.
	RenewalsLost  int64   `json:"renewals_lost"`
	RenewP50      float64 `json:"renew_p50_ms"`
	RenewP99      float64 `json:"renew_p99_ms"`
	RenewMax      float64 `json:"renew_max_ms"`
	RenewErrors   int64   `json:"renew_errors"`
	RenewBudgetMs float64 `json:"renew_budget_ms"` // TTL less the renew interval: how late a renewal may be
	// AcquiresShed counts acquires answered unavailable (shed or over a
	// rate), AcquiresGranted those granted, in the overload phase.
	AcquiresShed    int64            `json:"acquires_shed"`
	AcquiresGranted int64            `json:"acquires_granted"`
	AcquireP99      float64          `json:"acquire_p99_ms"`
	AcquireErrors   map[string]int64 `json:"acquire_errors_by_code"`
	ServiceShed     map[string]int64 `json:"service_shed,omitempty"`
	Met             bool             `json:"met"` // no renewal lost, renew p99 within its budget
}

// runOverload warms up the design load's leases, runs the design load for
// --duration as the reference, then the same renewals with acquires and
// releases at --overload-rate for --duration.
func runOverload(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	log := e.grantLog()
	wl := e.workload("overload", e.serviceBackend(), e.rq, log)
	e.warm(ctx, sum, wl, "overload warm-up", c.leases)
	design := e.designRates()
	fmt.Fprintf(e.out, "overload: the design load (%s) for %v\n", design, c.duration)
	e.loadPhase(ctx, sum, wl, "design", design, c.duration, nil)
	over := load.Rates{Acquire: c.overloadRate, Renew: design.Renew, Release: c.overloadRate}
	fmt.Fprintf(e.out, "overload: %s for %v, %d leases renewing\n", over, c.duration, wl.Held())
	ph := e.loadPhase(ctx, sum, wl, "overload", over, c.duration, nil)
	e.cleanup(ctx, wl)

	acq, ren := ph.Ops[load.OpAcquire], ph.Ops[load.OpRenew]
	r := &OverloadResult{DesignAcquireRate: design.Acquire, OverloadAcquireRate: c.overloadRate, Leases: c.leases,
		RenewalsLost: ren.ErrorsByCode[streams.CodeLeaseLost], RenewP50: ren.P50, RenewP99: ren.P99, RenewMax: ren.Max,
		RenewErrors: ren.Errors, RenewBudgetMs: msOf(c.ttl - c.renewInterval),
		AcquiresShed: acq.ErrorsByCode[streams.CodeUnavailable], AcquiresGranted: acq.Count - acq.Errors,
		AcquireP99: acq.P99, AcquireErrors: acq.ErrorsByCode, ServiceShed: ph.ServiceShed}
	r.Met = r.RenewalsLost == 0 && ren.Count > 0 && r.RenewP99 <= r.RenewBudgetMs
	sum.use(ph)
	sum.Overload = r
	return sum.check(log)
}

func printOverload(w io.Writer, r *OverloadResult) {
	verdict := "met"
	if !r.Met {
		verdict = "missed"
	}
	fmt.Fprintf(w, "\n== overload: acquires and releases at %.0f/s (design %.0f/s) beside %d renewing leases ==\n",
		r.OverloadAcquireRate, r.DesignAcquireRate, r.Leases)
	fmt.Fprintf(w, "renewals: %d lost, p50 %s, p99 %s, max %s against a budget of %s; %d errors: %s\n",
		r.RenewalsLost, fmtMs(r.RenewP50), fmtMs(r.RenewP99), fmtMs(r.RenewMax), fmtMs(r.RenewBudgetMs), r.RenewErrors, verdict)
	fmt.Fprintf(w, "acquires: %d granted, %d shed (unavailable), p99 %s; errors by code %v\n",
		r.AcquiresGranted, r.AcquiresShed, fmtMs(r.AcquireP99), r.AcquireErrors)
	if r.ServiceShed != nil {
		fmt.Fprintf(w, "service shed unprocessed: %v\n", r.ServiceShed)
	}
}

// NoisyResult is the outcome of the noisy scenario: the design load of one
// tenant, quiet and then beside another tenant that floods the service
// with cancels of random request ids, renewals of bogus leases, list pages,
// statuses and waits.
type NoisyResult struct {
	FloodRate float64 `json:"flood_rate"`
	// Quiet and Noisy are the honest tenant's figures in each phase.
	Quiet, Noisy NoisyFigures `json:"-"`
	QuietJSON    NoisyFigures `json:"quiet"`
	NoisyJSON    NoisyFigures `json:"noisy"`
	// AcquireP99Ratio and RenewP99Ratio are the noisy phase's p99 over the
	// quiet one's.
	AcquireP99Ratio float64 `json:"acquire_p99_ratio"`
	RenewP99Ratio   float64 `json:"renew_p99_ratio"`
	// Flood counts the flooding tenant's answers by operation and code.
	Flood map[string]map[string]int64 `json:"flood"`
	Met   bool                        `json:"met"` // both ratios at most 2, no lease lost
}

// NoisyFigures are one phase's figures of the honest tenant.
type NoisyFigures struct {
	AcquireP50 float64 `json:"acquire_p50_ms"`
	AcquireP99 float64 `json:"acquire_p99_ms"`
	RenewP50   float64 `json:"renew_p50_ms"`
	RenewP99   float64 `json:"renew_p99_ms"`
	Errors     int64   `json:"errors"`
	LeasesLost int64   `json:"leases_lost"`
}

func noisyFigures(ph *phase) NoisyFigures {
	acq, ren := ph.Ops[load.OpAcquire], ph.Ops[load.OpRenew]
	f := NoisyFigures{AcquireP50: acq.P50, AcquireP99: acq.P99, RenewP50: ren.P50, RenewP99: ren.P99,
		LeasesLost: ren.ErrorsByCode[streams.CodeLeaseLost]}
	for _, s := range ph.Ops {
		f.Errors += s.Errors
	}
	return f
}

// runNoisy runs the design load as one tenant for --duration (quiet), then
// again for --duration beside a flood at --flood-rate from another tenant
// (an application of its own account, APP).
func runNoisy(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	if e.cluster == nil {
		return fmt.Errorf("noisy: needs the bench's own cluster (its accounts give the flood a tenant of its own)")
	}
	conns, err := e.connect(devcluster.App, e.url, 1)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	frq, err := load.NewRequester(conns, 4096)
	if err != nil {
		return err
	}
	defer frq.Close()

	log := e.grantLog()
	wl := e.workload("noisy", e.serviceBackend(), e.rq, log)
	e.warm(ctx, sum, wl, "noisy warm-up", c.leases)
	design := e.designRates()
	fmt.Fprintf(e.out, "noisy: the design load (%s) for %v, quiet\n", design, c.duration)
	quiet := e.loadPhase(ctx, sum, wl, "quiet", design, c.duration, nil)
	fl := &flood{e: e, rq: frq, rate: c.floodRate, names: e.names("flood"), counts: map[string]map[string]*atomic.Int64{}}
	fmt.Fprintf(e.out, "noisy: the design load beside a flood of %.0f requests/s from another tenant, for %v\n", c.floodRate, c.duration)
	noisy := e.loadPhase(ctx, sum, wl, "noisy", design, c.duration, func(*phase) { fl.run(ctx, c.duration) })
	e.cleanup(ctx, wl)
	fl.cleanup(ctx)

	r := &NoisyResult{FloodRate: c.floodRate, Quiet: noisyFigures(quiet), Noisy: noisyFigures(noisy), Flood: fl.answers()}
	r.QuietJSON, r.NoisyJSON = r.Quiet, r.Noisy
	r.AcquireP99Ratio = ratio(r.Noisy.AcquireP99, r.Quiet.AcquireP99)
	r.RenewP99Ratio = ratio(r.Noisy.RenewP99, r.Quiet.RenewP99)
	r.Met = r.AcquireP99Ratio <= 2 && r.RenewP99Ratio <= 2 && r.Noisy.LeasesLost == 0 && r.Quiet.LeasesLost == 0
	sum.use(noisy)
	sum.Noisy = r
	return sum.check(log)
}

func printNoisy(w io.Writer, r *NoisyResult) {
	verdict := "met"
	if !r.Met {
		verdict = "missed"
	}
	fmt.Fprintf(w, "\n== noisy: another tenant floods at %.0f requests/s ==\n", r.FloodRate)
	for _, p := range []struct {
		name string
		f    NoisyFigures
	}{{"quiet", r.Quiet}, {"noisy", r.Noisy}} {
		fmt.Fprintf(w, "%-5s  acquire p50 %s p99 %s, renew p50 %s p99 %s, %d errors, %d leases lost\n", p.name,
			fmtMs(p.f.AcquireP50), fmtMs(p.f.AcquireP99), fmtMs(p.f.RenewP50), fmtMs(p.f.RenewP99), p.f.Errors, p.f.LeasesLost)
	}
	fmt.Fprintf(w, "noisy/quiet p99: acquire %.2fx, renew %.2fx (at most 2x, no lease lost: %s)\n", r.AcquireP99Ratio, r.RenewP99Ratio, verdict)
	var parts []string
	for _, op := range sortedKeys(r.Flood, strings.Compare) {
		parts = append(parts, fmt.Sprintf("%s %v", op, r.Flood[op]))
	}
	fmt.Fprintf(w, "the flood's answers: %s\n", strings.Join(parts, "; "))
}

// flood is the noisy tenant: open-loop requests at rate, in turn a cancel
// of a random request id, a renewal of a bogus lease, a list page of 1,000,
// a status, and a wait (2 s) on one of the resources it holds itself.
type flood struct {
	e      *env
	rq     *load.Requester
	rate   float64
	names  string
	held   []string // resources it holds, waited on
	leases []string
	counts map[string]map[string]*atomic.Int64 // op -> code -> count, filled before run
}

var floodOps = []string{"cancel", "renew", "list", "status", "wait"}

func (f *flood) run(ctx context.Context, d time.Duration) {
	be := f.e.serviceBackend()
	for _, op := range floodOps {
		f.counts[op] = map[string]*atomic.Int64{}
		for _, code := range []string{load.CodeOK, streams.CodeUnavailable, streams.CodeLocked, streams.CodeTooManyWaiters,
			streams.CodeLeaseLost, streams.CodeInvalidRequest, load.CodeTimeout, load.CodeBacklog, load.CodeNoResponders, load.CodePublish, "other"} {
			f.counts[op][code] = new(atomic.Int64)
		}
	}
	// The resources the flood waits on, held by the flood itself.
	for i := range 50 {
		res := fmt.Sprintf("%sheld%d", f.names, i)
		reply, _, err := f.rq.Do(ctx, be.Acquire(res, "hold-"+strconv.Itoa(i), "", 10*time.Minute, 0, 0), 5*time.Second)
		if r := be.Parse(streams.OpAcquire, reply, err); r.Code == load.CodeOK {
			f.held, f.leases = append(f.held, res), append(f.leases, r.Lease)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	seq := 0
	load.Pace(ctx, []load.Paced{{S: load.NewSchedule(time.Now(), f.rate, d, 0), Send: func(time.Time) {
		seq++
		op := floodOps[seq%len(floodOps)]
		var m *nats.Msg
		timeout := 5 * time.Second
		switch op {
		case "cancel":
			m = be.Msg(streams.OpCancel, streams.CancelRequest{Resource: fmt.Sprintf("%sr%d", f.names, rng.IntN(100_000)), RequestID: fmt.Sprintf("x%x", rng.Uint64())})
		case "renew":
			m = be.Msg(streams.OpRenew, streams.RenewRequest{Resource: fmt.Sprintf("%sr%d", f.names, rng.IntN(100_000)), LeaseID: fmt.Sprintf("%016x%016x", rng.Uint64(), rng.Uint64())})
		case "list":
			m = be.Msg(streams.OpList, streams.ListRequest{Limit: streams.MaxListLimit})
		case "status":
			m = be.Msg(streams.OpStatus, streams.StatusRequest{Resource: fmt.Sprintf("%sr%d", f.names, rng.IntN(100_000))})
		case "wait":
			if len(f.held) == 0 {
				return
			}
			m = be.Acquire(f.held[rng.IntN(len(f.held))], fmt.Sprintf("w%x", rng.Uint64()), "", 0, 2*time.Second, 0)
			timeout = 10 * time.Second
		}
		if err := f.rq.Send(m, timeout, func(reply *nats.Msg, _ time.Time, err error) {
			f.count(op, floodCode(reply, err))
		}); err != nil {
			f.count(op, load.SendCode(err))
		}
	}}}, nil)
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for f.rq.InFlight() > 0 && dctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

// floodCode is the outcome of a flood request: the service's error code,
// CodeOK, or a transport failure.
func floodCode(reply *nats.Msg, err error) string {
	switch {
	case errors.Is(err, load.ErrTimeout), errors.Is(err, load.ErrClosed):
		return load.CodeTimeout
	case errors.Is(err, load.ErrNoAnswer):
		return load.CodeNoResponders
	case err != nil:
		return load.CodePublish
	}
	if code := load.ServiceError(reply); code != "" {
		return code
	}
	return load.CodeOK
}

func (f *flood) count(op, code string) {
	c, ok := f.counts[op][code]
	if !ok {
		c = f.counts[op]["other"]
	}
	c.Add(1)
}

// answers returns the counts that are not zero.
func (f *flood) answers() map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	for op, byCode := range f.counts {
		for code, n := range byCode {
			if v := n.Load(); v > 0 {
				if out[op] == nil {
					out[op] = map[string]int64{}
				}
				out[op][code] = v
			}
		}
	}
	return out
}

// cleanup releases what the flood holds.
func (f *flood) cleanup(ctx context.Context) {
	be := f.e.serviceBackend()
	for i, res := range f.held {
		_, _, _ = f.rq.Do(ctx, be.Release(res, f.leases[i], 0), 5*time.Second)
	}
}
