package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// NoisyResult is the outcome of the noisy scenario: the design load of
// honest callers (user caller of account CALLERS), quiet and then beside a
// flood from another tenant (user app of account APP).
type NoisyResult struct {
	HonestTenant string  `json:"honest_tenant"`
	FloodTenant  string  `json:"flood_tenant"`
	FloodRate    float64 `json:"flood_rate"`
	// UserRate and TenantRates are the fair-use settings of the service
	// the bench started (lockd --user-rate, --tenant-rates); empty with
	// --service none.
	UserRate    string `json:"user_rate,omitempty"`
	TenantRates string `json:"tenant_rates,omitempty"`
	// Quiet and Noisy are the honest callers' figures in each phase.
	Quiet NoisyFigures `json:"quiet"`
	Noisy NoisyFigures `json:"noisy"`
	// The noisy phase's p50 and p99 over the quiet phase's.
	AcquireP50Ratio float64 `json:"acquire_p50_ratio"`
	AcquireP99Ratio float64 `json:"acquire_p99_ratio"`
	RenewP50Ratio   float64 `json:"renew_p50_ratio"`
	RenewP99Ratio   float64 `json:"renew_p99_ratio"`
	// Flood counts the flood's requests by operation and outcome (ok, an
	// error code, timeout, backlog...).
	Flood map[string]map[string]int64 `json:"flood"`
	// Met: both p99 ratios at most 2 and no lease lost.
	Met bool `json:"met"`
}

// NoisyFigures are one phase's figures of the honest callers.
type NoisyFigures struct {
	Acquires   int64   `json:"acquires"`
	AcquireP50 float64 `json:"acquire_p50_ms"`
	AcquireP99 float64 `json:"acquire_p99_ms"`
	Renewals   int64   `json:"renewals"`
	RenewP50   float64 `json:"renew_p50_ms"`
	RenewP99   float64 `json:"renew_p99_ms"`
	// Errors counts the operations that were not successes; ErrorsByCode
	// sums them by code over the operations.
	Errors       int64            `json:"errors"`
	ErrorsByCode map[string]int64 `json:"errors_by_code,omitempty"`
	// LeasesLost counts leases (each once) whose renewal was answered
	// lease_lost or did not succeed until a TTL after the last success.
	LeasesLost int64 `json:"leases_lost"`
}

func noisyFigures(ph *phase, lost load.Losses) NoisyFigures {
	acq, ren := ph.Ops[load.OpAcquire], ph.Ops[load.OpRenew]
	f := NoisyFigures{Acquires: acq.Count, AcquireP50: acq.P50, AcquireP99: acq.P99, Renewals: ren.Count,
		RenewP50: ren.P50, RenewP99: ren.P99, LeasesLost: lost.Leases(), ErrorsByCode: map[string]int64{}}
	for _, s := range ph.Ops {
		f.Errors += s.Errors
		for code, n := range s.ErrorsByCode {
			f.ErrorsByCode[code] += n
		}
	}
	return f
}

// runNoisy runs the design load as the honest callers for --duration
// (quiet), then again for --duration beside a flood at --flood-rate from
// another tenant, and compares the honest callers' latencies.
func runNoisy(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	if e.cluster == nil || e.cluster.Open() {
		return errors.New("noisy: needs the bench's own cluster with its accounts (the flood is a tenant of its own)")
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
	honest, _ := e.cluster.User(devcluster.Caller)
	flooder, _ := e.cluster.User(devcluster.App)
	r := &NoisyResult{HonestTenant: devcluster.CallersAccount + "/" + honest, FloodTenant: devcluster.AppAccount + "/" + flooder,
		FloodRate: c.floodRate}
	if e.svc != nil {
		r.UserRate, r.TenantRates = c.flags.Lookup("service-user-rate").Value.String(), c.tune.tenantRates
	}
	sum.Noisy = r

	log := e.grantLog()
	wl := e.workload("noisy", e.serviceBackend(), e.rq, log)
	e.warm(ctx, sum, wl, "noisy warm-up", c.leases)
	design := e.designRates()
	fmt.Fprintf(e.out, "noisy: the design load (%s) as %s for %v, quiet\n", design, r.HonestTenant, c.duration)
	before := wl.Losses()
	quiet := e.loadPhase(ctx, sum, wl, "quiet", design, c.duration, nil)
	wl.Overdue(time.Now())
	mid := wl.Losses()
	r.Quiet = noisyFigures(quiet, mid.Sub(before))

	fl := newFlood(e, frq, c.floodRate, wl.Config())
	fl.hold(ctx)
	fmt.Fprintf(e.out, "noisy: the design load beside a flood of %.0f requests/s from %s, for %v\n", c.floodRate, r.FloodTenant, c.duration)
	noisy := e.loadPhase(ctx, sum, wl, "noisy", design, c.duration, func(*phase) { fl.run(ctx, c.duration) })
	wl.Overdue(time.Now())
	r.Noisy = noisyFigures(noisy, wl.Losses().Sub(mid))
	e.cleanup(ctx, wl)
	fl.release(ctx)

	r.Flood = fl.answers()
	r.AcquireP50Ratio, r.AcquireP99Ratio = ratio(r.Noisy.AcquireP50, r.Quiet.AcquireP50), ratio(r.Noisy.AcquireP99, r.Quiet.AcquireP99)
	r.RenewP50Ratio, r.RenewP99Ratio = ratio(r.Noisy.RenewP50, r.Quiet.RenewP50), ratio(r.Noisy.RenewP99, r.Quiet.RenewP99)
	r.Met = r.AcquireP99Ratio <= 2 && r.RenewP99Ratio <= 2 && r.Noisy.LeasesLost == 0 && r.Quiet.LeasesLost == 0
	sum.use(noisy)
	return sum.check(log)
}

func printNoisy(w io.Writer, r *NoisyResult) {
	verdict := "met"
	if !r.Met {
		verdict = "missed"
	}
	fmt.Fprintf(w, "\n== noisy: %s floods at %.0f requests/s beside the design load of %s ==\n", r.FloodTenant, r.FloodRate, r.HonestTenant)
	if r.UserRate != "" {
		fmt.Fprintf(w, "service fair use: --user-rate %s, --tenant-rates %q\n", r.UserRate, r.TenantRates)
	}
	for _, p := range []struct {
		name string
		f    NoisyFigures
	}{{"quiet", r.Quiet}, {"noisy", r.Noisy}} {
		fmt.Fprintf(w, "%-5s  acquire p50 %s p99 %s (%d), renew p50 %s p99 %s (%d), errors: %s, %d leases lost\n", p.name,
			fmtMs(p.f.AcquireP50), fmtMs(p.f.AcquireP99), p.f.Acquires, fmtMs(p.f.RenewP50), fmtMs(p.f.RenewP99), p.f.Renewals,
			countsText(p.f.ErrorsByCode), p.f.LeasesLost)
	}
	fmt.Fprintf(w, "noisy/quiet: acquire p50 %.2fx p99 %.2fx, renew p50 %.2fx p99 %.2fx (p99s at most 2x, no lease lost: %s)\n",
		r.AcquireP50Ratio, r.AcquireP99Ratio, r.RenewP50Ratio, r.RenewP99Ratio, verdict)
	fmt.Fprintf(w, "the flood's answers: %s\n", errorsByOp(r.Flood))
}

// Flood operations, sent in turn.
var floodOps = []string{streams.OpCancel, streams.OpRenew, streams.OpRelease, streams.OpList, "wait"}

// Flood outcomes counted; any other counts as "other".
var floodCodes = []string{load.CodeOK, streams.CodeUnavailable, streams.CodeLocked, streams.CodeTooManyWaiters,
	streams.CodeLeaseLost, streams.CodeInvalidRequest, load.CodeTimeout, load.CodeBacklog, load.CodeNoResponders,
	load.CodePublish, "other"}

// floodHeld is how many resources the flood holds, to wait on.
const floodHeld = 50

// flood is the noisy tenant: open-loop requests at rate, in turn a cancel
// of a random request id, a renewal and a release of a bogus lease id (on
// the honest callers' resources, most of them free, some held), a list
// page of 1,000, and a 2 s wait on one of the resources it holds itself.
// Its counts are fixed before run, so reading them needs no lock.
type flood struct {
	e      *env
	rq     *load.Requester
	rate   float64
	names  string // the flood's own resources
	target string // the honest callers' resource names
	nres   int
	held   []string
	leases []string
	counts map[string]map[string]*atomic.Int64 // op -> code -> count
}

func newFlood(e *env, rq *load.Requester, rate float64, honest load.Config) *flood {
	f := &flood{e: e, rq: rq, rate: rate, names: e.names("flood"), target: honest.Names, nres: honest.Resources,
		counts: map[string]map[string]*atomic.Int64{}}
	for _, op := range floodOps {
		f.counts[op] = map[string]*atomic.Int64{}
		for _, code := range floodCodes {
			f.counts[op][code] = new(atomic.Int64)
		}
	}
	return f
}

// hold acquires the resources the flood waits on, within 10 s.
func (f *flood) hold(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	be := f.e.serviceBackend()
	for i := 0; i < floodHeld && ctx.Err() == nil; i++ {
		res := fmt.Sprintf("%sheld%d", f.names, i)
		reply, _, err := f.rq.Do(ctx, be.Acquire(res, fmt.Sprintf("%shold%d", f.names, i), "flood", 10*time.Minute, 0, 0), 5*time.Second)
		if r := be.Parse(streams.OpAcquire, reply, err); r.Code == load.CodeOK {
			f.held, f.leases = append(f.held, res), append(f.leases, r.Lease)
		}
	}
}

// run sends the flood for d, then waits (at most 15 s) for its answers.
func (f *flood) run(ctx context.Context, d time.Duration) {
	be := f.e.serviceBackend()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	honest := func() string { return fmt.Sprintf("%sr%06d", f.target, rng.IntN(f.nres)) }
	bogus := func() string { return fmt.Sprintf("%016x%016x", rng.Uint64(), rng.Uint64()) }
	seq := 0
	load.Pace(ctx, []load.Paced{{S: load.NewSchedule(time.Now(), f.rate, d, 0), Send: func(time.Time) {
		op := floodOps[seq%len(floodOps)]
		seq++
		var m *nats.Msg
		timeout := 5 * time.Second
		switch op {
		case streams.OpCancel:
			m = be.Msg(op, streams.CancelRequest{Resource: honest(), RequestID: "flood-" + bogus()})
		case streams.OpRenew:
			m = be.Renew(honest(), bogus(), 30*time.Second, 0)
		case streams.OpRelease:
			m = be.Release(honest(), bogus(), 0)
		case streams.OpList:
			m = be.Msg(op, streams.ListRequest{Limit: streams.MaxListLimit})
		case "wait":
			if len(f.held) == 0 {
				return
			}
			m = be.Acquire(f.held[rng.IntN(len(f.held))], "flood-"+bogus(), "flood", 0, 2*time.Second, 0)
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

// release releases what the flood holds.
func (f *flood) release(ctx context.Context) {
	be := f.e.serviceBackend()
	for i, res := range f.held {
		_, _, _ = f.rq.Do(ctx, be.Release(res, f.leases[i], 0), 5*time.Second)
	}
}
