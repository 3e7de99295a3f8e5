package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jetlock/jetlock/bench/internal/load"
)

// OverloadResult is the outcome of the overload scenario: the design load's
// leases kept renewing while acquires (and as many releases) arrive at
// --overload-factor times what the deployment carries. A service that puts
// renewals first keeps every lease and sheds new work early, with
// retry_after_ms; one that does not lets renewals queue behind acquires
// until leases run out.
type OverloadResult struct {
	// CarriedRate is the acquire rate the deployment carries at the design
	// mix (the highest ramp step that met --p99-target), CarriedFrom where
	// it came from: "ramp" (measured in this run) or "--carried-rate".
	CarriedRate float64 `json:"carried_rate"`
	CarriedFrom string  `json:"carried_from"`
	Factor      float64 `json:"factor"`
	// AcquireRate is the overload phase's acquire (and release) rate,
	// Factor x CarriedRate; the renewals keep the design rate.
	AcquireRate float64 `json:"acquire_rate"`
	// Leases is the number held when the overload phase began.
	Leases int `json:"leases"`
	// RenewBudgetMs is how late a renewal may be answered before its lease
	// lapses: the TTL less the renew interval.
	RenewBudgetMs float64         `json:"renew_budget_ms"`
	Design        OverloadFigures `json:"design"`
	Overload      OverloadFigures `json:"overload"`
	// ServiceShed counts, by reason, the requests the service answered
	// unavailable unprocessed in the overload phase (from its metrics).
	ServiceShed map[string]int64 `json:"service_shed,omitempty"`
	// Note says when the carried rate is only a lower bound: the ramp
	// reached --ramp-max without missing.
	Note string `json:"note,omitempty"`
	// Met: no lease lost and the renewal p99 within its budget, in the
	// overload phase.
	Met bool `json:"met"`
}

// OverloadFigures are one phase's figures of the overload scenario, from
// the answers.
type OverloadFigures struct {
	// LeasesLost counts leases (each once) whose renewal was answered
	// lease_lost (LostAnswered) or whose renewals did not succeed until a
	// TTL after the last successful send (LostExpired).
	LeasesLost   int64   `json:"leases_lost"`
	LostAnswered int64   `json:"leases_lost_answered"`
	LostExpired  int64   `json:"leases_lost_expired"`
	Renewals     int64   `json:"renewals"`
	RenewP50     float64 `json:"renew_p50_ms"`
	RenewP99     float64 `json:"renew_p99_ms"`
	RenewMax     float64 `json:"renew_max_ms"`
	// Acquires counts first tries; AcquiresShed those answered unavailable
	// with retry_after_ms, RetriesShed their retries answered so;
	// AcquiresSkipped the intended acquires that found no free resource
	// (every one held or waiting out an unknown outcome).
	Acquires        int64   `json:"acquires"`
	AcquiresGranted int64   `json:"acquires_granted"`
	AcquiresShed    int64   `json:"acquires_shed"`
	RetriesShed     int64   `json:"retries_shed"`
	AcquiresSkipped int64   `json:"acquires_skipped,omitempty"`
	AcquireP50      float64 `json:"acquire_p50_ms"`
	AcquireP99      float64 `json:"acquire_p99_ms"`
	// Errors counts the answers that were not successes, by operation and
	// code (timeouts and backlog included).
	Errors map[string]map[string]int64 `json:"errors_by_code"`
}

// overloadFigures reads a phase's figures; lost are the workload's losses
// over the phase.
func overloadFigures(ph *phase, lost load.Losses) OverloadFigures {
	acq, ren := ph.Ops[load.OpAcquire], ph.Ops[load.OpRenew]
	f := OverloadFigures{LeasesLost: lost.Leases(), LostAnswered: lost.LeaseLost, LostExpired: lost.Expired,
		Renewals: ren.Count, RenewP50: ren.P50, RenewP99: ren.P99, RenewMax: ren.Max,
		Acquires: acq.Count, AcquiresGranted: acq.Count - acq.Errors, AcquiresShed: lost.AcquiresShed,
		RetriesShed: lost.RetriesShed, AcquiresSkipped: acq.Skipped, AcquireP50: acq.P50, AcquireP99: acq.P99,
		Errors: map[string]map[string]int64{}}
	for op, s := range ph.Ops {
		if len(s.ErrorsByCode) > 0 {
			f.Errors[op] = s.ErrorsByCode
		}
	}
	return f
}

// runOverload finds the acquire rate the deployment carries (the ramp of
// --scenario ramp, unless --carried-rate gives it), warms up the design
// load's leases, runs the design load for --duration as the reference,
// then for --duration the same renewals beside acquires and releases at
// --overload-factor times the carried rate.
func runOverload(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	r := &OverloadResult{CarriedRate: c.carriedRate, CarriedFrom: "--carried-rate", Factor: c.overloadFactor,
		RenewBudgetMs: msOf(c.ttl - c.renewInterval)}
	if r.CarriedRate == 0 {
		fmt.Fprintf(e.out, "overload: finding the acquire rate this deployment carries (the ramp; --carried-rate skips it)\n")
		ramp := e.serviceRamp(ctx, sum)
		r.CarriedRate, r.CarriedFrom = ramp.MaxAcquireRate, "ramp"
		if ramp.StoppedBy == rampMaxReached {
			r.Note = fmt.Sprintf("the ramp reached --ramp-max (%.0f/s) without missing: the deployment carries more, and the overload is less than %.1f x", c.rampMax, r.Factor)
		}
		if r.CarriedRate == 0 {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("overload: the ramp's first step (%.0f/s) missed already (%s): no carried rate to overload", c.rampStart, ramp.StoppedBy)
		}
	}
	r.AcquireRate = round2(r.Factor * r.CarriedRate)
	sum.Overload = r
	log := e.grantLog()
	wl := e.workload("overload", e.serviceBackend(), e.rq, log)
	e.warm(ctx, sum, wl, "overload warm-up", c.leases)

	design := e.designRates()
	fmt.Fprintf(e.out, "overload: the design load (%s) for %v\n", design, c.duration)
	_, r.Design = e.lossPhase(ctx, sum, wl, "design", design, nil)
	r.Leases = wl.Held()
	over := load.Rates{Acquire: r.AcquireRate, Renew: design.Renew, Release: r.AcquireRate * c.releaseRate / max(c.acquireRate, 1)}
	fmt.Fprintf(e.out, "overload: %s (%.1f x the carried %.0f acquires/s) for %v, %d leases renewing\n",
		over, r.Factor, r.CarriedRate, c.duration, r.Leases)
	ph, overload := e.lossPhase(ctx, sum, wl, "overload", over, nil)
	r.Overload = overload
	e.cleanup(ctx, wl)
	r.ServiceShed = ph.ServiceShed
	r.Met = r.Overload.LeasesLost == 0 && r.Overload.Renewals > 0 && r.Overload.RenewP99 <= r.RenewBudgetMs
	sum.use(ph)
	return sum.check(log)
}

// lossPhase runs a load phase of --duration (see loadPhase) and returns it
// with its figures, the leases lost over it counted after its answers
// (Overdue: renewals still failing a TTL after their last success).
func (e *env) lossPhase(ctx context.Context, sum *Summary, wl *load.Workload, name string, r load.Rates, during func(*phase)) (*phase, OverloadFigures) {
	before := wl.Losses()
	ph := e.loadPhase(ctx, sum, wl, name, r, e.cfg.duration, during)
	wl.Overdue(time.Now())
	return ph, overloadFigures(ph, wl.Losses().Sub(before))
}

func printOverload(w io.Writer, r *OverloadResult) {
	verdict := "met"
	if !r.Met {
		verdict = "missed"
	}
	fmt.Fprintf(w, "\n== overload: acquires and releases at %.0f/s (%.1f x the %.0f/s carried, from %s) beside %d renewing leases ==\n",
		r.AcquireRate, r.Factor, r.CarriedRate, r.CarriedFrom, r.Leases)
	for _, p := range []struct {
		name string
		f    OverloadFigures
	}{{"design", r.Design}, {"overload", r.Overload}} {
		f := p.f
		fmt.Fprintf(w, "%-8s leases lost %d (%d answered lease_lost, %d renewals failing past the TTL); renew p50 %s p99 %s max %s of a %s budget\n",
			p.name, f.LeasesLost, f.LostAnswered, f.LostExpired, fmtMs(f.RenewP50), fmtMs(f.RenewP99), fmtMs(f.RenewMax), fmtMs(r.RenewBudgetMs))
		fmt.Fprintf(w, "%-8s acquires %d: %d granted, %d shed with retry_after_ms (and %d of their retries), %d skipped (no free resource); acquire p50 %s p99 %s\n",
			"", f.Acquires, f.AcquiresGranted, f.AcquiresShed, f.RetriesShed, f.AcquiresSkipped, fmtMs(f.AcquireP50), fmtMs(f.AcquireP99))
		fmt.Fprintf(w, "%-8s errors: %s\n", "", errorsByOp(f.Errors))
	}
	if r.ServiceShed != nil {
		fmt.Fprintf(w, "service shed unprocessed in the overload phase: %s\n", countsText(r.ServiceShed))
	}
	if r.Note != "" {
		fmt.Fprintf(w, "note: %s\n", r.Note)
	}
	fmt.Fprintf(w, "no lease lost and renew p99 within its budget under overload: %s\n", verdict)
}

// countsText formats counts by name, leaving out zeros, or "none".
func countsText(m map[string]int64) string {
	var parts []string
	for _, k := range sortedKeys(m, strings.Compare) {
		if m[k] != 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// errorsByOp formats counts by operation and code, or "none".
func errorsByOp(m map[string]map[string]int64) string {
	var parts []string
	for _, op := range sortedKeys(m, load.OpOrder) {
		parts = append(parts, op+" ("+countsText(m[op])+")")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}
