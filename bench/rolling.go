package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// rollingWindowTarget is the longest window without grants a planned
// restart may cost: a leader that hands over before it stops costs a
// round of replication, one that is killed costs a raft election
// timeout (4 to 9 s in nats-server).
const rollingWindowTarget = time.Second

// RollingResult is the outcome of the rolling scenario: the design load
// while each node, and then each service instance, is restarted in turn.
type RollingResult struct {
	Mode string `json:"mode"` // how each node was stopped: stop (lame duck mode), term or kill
	// PreStop is what ran before a stop in lame duck mode (--pre-stop).
	PreStop string `json:"pre_stop,omitempty"`
	// Restarted is what was restarted in turn (--restart): nodes, services
	// or all.
	Restarted string          `json:"restarted"`
	Restarts  []RestartResult `json:"restarts"`
	// MaxNoGrantWindowMs is the longest window without grants of any
	// restart.
	MaxNoGrantWindowMs float64 `json:"max_no_grant_window_ms"`
	TargetMs           float64 `json:"target_ms"`
	// LeasesLost and Errors are the whole phase's: leases whose renewal
	// was answered lease_lost or that went past their TTL unrenewed, and
	// the failed operations by code.
	LeasesLost int64            `json:"leases_lost"`
	Errors     map[string]int64 `json:"errors_by_code"`
	// Met: every window without grants within the target, no lease lost,
	// every process back, and no request unanswered (timeout) while a
	// service instance restarted. A node that stops closes its clients'
	// connections (in lame duck mode, spread over the lame duck
	// duration), and a request in flight on one of them loses its reply:
	// its caller retries after its request timeout. Those timeouts are
	// counted in the node's restart, not held against the target.
	Met  bool   `json:"met"`
	Note string `json:"note,omitempty"`
	// Skipped says why the service instances were not restarted.
	Skipped string `json:"skipped,omitempty"`
}

// RestartResult is one restart of a rolling restart.
type RestartResult struct {
	Name      string `json:"name"` // n3, service-2...
	Kind      string `json:"kind"` // node or service
	LedStream bool   `json:"led_stream,omitempty"`
	// NewLeader is the node that led the lock stream next, seen
	// NewLeaderAfterMs after the stop, when the restarted node led it.
	NewLeader        string  `json:"new_leader,omitempty"`
	NewLeaderAfterMs float64 `json:"new_leader_after_ms,omitempty"`
	// HandedOverTo is the node the pre-stop step handed the stream to.
	HandedOverTo string  `json:"handed_over_to,omitempty"`
	AtS          float64 `json:"at_s"` // seconds into the phase
	ExitedAfterS float64 `json:"exited_after_s"`
	// BackAfterS is when, after the stop, the process was running again
	// and (a node) its replica of the lock stream current, or (a service
	// instance) ready.
	BackAfterS float64 `json:"back_after_s"`
	// NoGrantWindowMs is the longest time without any grant arriving from
	// the stop until the request timeout after the process was back.
	NoGrantWindowMs float64 `json:"no_grant_window_ms"`
	// Errors and LeasesLost are those of the same stretch.
	Errors     map[string]int64 `json:"errors_by_code,omitempty"`
	LeasesLost int64            `json:"leases_lost"`
	Note       string           `json:"note,omitempty"`
}

// runRolling runs the design workload and, from --kill-at on, restarts
// the three nodes one after another (n3, n2, n1, as a StatefulSet's
// rolling update does), each stopped as --failover-mode says and started
// again, and the next one stopped only once it is current; then, with two
// or more service processes, each service instance with SIGTERM, the next
// one once it is ready. It reports each restart's longest window without
// grants, errors and lost leases, and checks the answers for double
// grants.
func runRolling(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	log := e.grantLog()
	wl := e.workload("rolling", e.serviceBackend(), e.rq, log)
	e.warm(ctx, sum, wl, "rolling warm-up", c.leases)
	r := e.designRates()
	fmt.Fprintf(e.out, "rolling: %s for %v; from %v on, each %s in turn stopped (nodes: %s), started again and back before the next\n",
		r, c.duration, c.killAt, map[string]string{"all": "node and then each service instance", "nodes": "node", "services": "service instance"}[c.restart], c.failoverMode)
	lost0 := wl.Losses()
	rr := &RollingResult{Mode: c.failoverMode, PreStop: preStopOf(c), Restarted: c.restart, TargetMs: msOf(rollingWindowTarget)}
	ph := e.loadPhase(ctx, sum, wl, "rolling", r, c.duration, func(ph *phase) { e.rolling(ctx, ph, wl, rr) })
	e.cleanup(ctx, wl)
	sum.use(ph)
	rr.LeasesLost, rr.Errors = wl.Losses().Sub(lost0).Leases(), phaseErrors(ph)
	rr.Met = rr.LeasesLost == 0 && len(rr.Restarts) > 0 && rr.Note == ""
	for _, x := range rr.Restarts {
		rr.MaxNoGrantWindowMs = max(rr.MaxNoGrantWindowMs, x.NoGrantWindowMs)
		rr.Met = rr.Met && x.BackAfterS > 0 && x.Note == "" && (x.Kind == "node" || x.Errors[load.CodeTimeout] == 0)
	}
	rr.Met = rr.Met && rr.MaxNoGrantWindowMs <= rr.TargetMs
	sum.Rolling = rr
	return sum.check(log)
}

// rolling restarts the nodes, then the service processes, into rr.
func (e *env) rolling(ctx context.Context, ph *phase, wl *load.Workload, rr *RollingResult) {
	c := e.cfg
	select {
	case <-time.After(c.killAt):
	case <-ctx.Done():
		return
	}
	end := ph.start.Add(c.duration)
	var restarts []func() RestartResult
	for i := devcluster.Size - 1; i >= 0 && c.restart != "services"; i-- {
		restarts = append(restarts, func() RestartResult { return e.restartNode(ctx, ph, wl, i) })
	}
	if c.restart == "nodes" {
		rr.Skipped = "the service instances were not restarted (--restart nodes)"
	} else if c.serviceMode == "proc" && c.instances >= 2 {
		for i := range e.svcProcs() {
			restarts = append(restarts, func() RestartResult { return e.restartService(ctx, ph, wl, i) })
		}
	} else {
		rr.Skipped = "the service instances were not restarted: that takes --service proc and --instances 2 or more (a lone instance leaves nobody to answer)"
	}
	for i, restart := range restarts {
		if ctx.Err() != nil || time.Now().After(end) {
			rr.Note = fmt.Sprintf("the load ended (--duration %v) before restart %d of %d: give a longer --duration", c.duration, i+1, len(restarts))
			return
		}
		x := restart()
		fmt.Fprintf(e.out, "rolling: %s\n", restartText(x))
		rr.Restarts = append(rr.Restarts, x)
	}
	if time.Now().After(end) {
		rr.Note = fmt.Sprintf("the load ended (--duration %v) before the last restart was settled: give a longer --duration", c.duration)
	}
}

// restartNode stops node i as --failover-mode says, starts it again, waits
// until its replica of the lock stream is current, then for the request
// timeout, and reports what the load saw meanwhile.
func (e *env) restartNode(ctx context.Context, ph *phase, wl *load.Workload, i int) RestartResult {
	mode, name := e.cfg.failoverMode, e.cluster.Name(i)
	x := &RestartResult{Name: name, Kind: "node"}
	leader, _ := e.streamLeader(ctx)
	x.LedStream = leader == name
	what := stopText(mode, name)
	if x.LedStream {
		what += " (stream leader)"
	}
	e.restart(ctx, ph, wl, x, what, func(at time.Time) string {
		exited, onItsOwn := make(chan struct{}), true
		go func() {
			defer close(exited)
			onItsOwn, x.HandedOverTo = e.stopNode(ctx, i, mode)
		}()
		if x.LedStream {
			if x.NewLeader = e.awaitNewLeader(ctx, name, at.Add(30*time.Second)); x.NewLeader != "" {
				x.NewLeaderAfterMs = msOf(time.Since(at))
				ph.event("new stream leader " + x.NewLeader)
			}
		}
		<-exited
		if !onItsOwn {
			return name + " did not exit on its own: killed"
		}
		return ""
	}, func() error {
		if err := e.cluster.Restart(ctx, i); err != nil {
			return err
		}
		ph.event("started " + name + " again")
		return e.awaitReplicaCurrent(ctx, i, streams.StreamName(e.cfg.bucket), 2*time.Minute)
	})
	return *x
}

// restartService stops service process i with SIGTERM (it drains), starts
// it again, waits until it is ready, then for the request timeout, and
// reports what the load saw meanwhile.
func (e *env) restartService(ctx context.Context, ph *phase, wl *load.Workload, i int) RestartResult {
	ch, name := e.svc.procs[i], serviceProcName(i)
	x := &RestartResult{Name: name, Kind: "service"}
	e.restart(ctx, ph, wl, x, "stopped "+name+" with SIGTERM", func(time.Time) string {
		if !ch.Signal(syscall.SIGTERM, 30*time.Second) {
			return name + " did not exit on its own within 30s: killed"
		}
		return ""
	}, func() error {
		if err := ch.Start(); err != nil {
			return err
		}
		ph.event("started " + name + " again")
		return ch.WaitReady(ctx, 90*time.Second, func() bool { return instanceReady(ctx, e.svc.metrics[i]) })
	})
	return *x
}

// restart runs one restart into x: stop (returning a note when the
// process had to be killed), start (returning once the process is back
// and current), then a wait of --settle (the request timeout unless set,
// so that every request sent meanwhile has its answer or its timeout). It
// measures the window without grants, the errors and the lost leases from
// the stop to the end of that wait: what a restart costs after its
// process is back counts toward it, not toward the next.
func (e *env) restart(ctx context.Context, ph *phase, wl *load.Workload, x *RestartResult, what string,
	stop func(at time.Time) string, start func() error) {
	errs0, lost0 := phaseErrors(ph), wl.Losses()
	at := time.Now()
	x.AtS = round2(at.Sub(ph.start).Seconds())
	ph.event(what)
	fmt.Fprintf(e.out, "rolling: %s at %.1fs\n", what, x.AtS)
	x.Note = stop(at)
	x.ExitedAfterS = round2(time.Since(at).Seconds())
	if err := start(); err != nil {
		x.Note = strings.TrimSpace(x.Note + " " + x.Name + " not back: " + err.Error())
	} else {
		x.BackAfterS = round2(time.Since(at).Seconds())
		ph.event(x.Name + " back")
	}
	settle := e.cfg.settle
	if settle == 0 {
		settle = e.cfg.timeout
	}
	select {
	case <-time.After(settle):
	case <-ctx.Done():
	}
	// The load sends nothing after the phase's end: a window past it is
	// the end of the run, not of this restart.
	to := time.Now()
	if end := ph.start.Add(e.cfg.duration); to.After(end) {
		to = end
	}
	x.NoGrantWindowMs = msOf(ph.grants.LongestGap(at, to))
	x.Errors = subCounts(phaseErrors(ph), errs0)
	x.LeasesLost = wl.Losses().Sub(lost0).Leases()
}

// awaitReplicaCurrent waits, at most timeout, until node i's replica of
// stream is current (no lag, online).
func (e *env) awaitReplicaCurrent(ctx context.Context, i int, stream string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if info, err := e.streamInfo(ctx, stream, 5*time.Second); err == nil && info.Cluster != nil {
			if info.Cluster.Leader == e.cluster.Name(i) {
				return nil
			}
			for _, p := range info.Cluster.Replicas {
				if p.Name == e.cluster.Name(i) && p.Current && p.Lag == 0 && !p.Offline {
					return nil
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("its replica of %s was not current within %v", stream, timeout)
}

// phaseErrors returns the failed operations of ph so far, by code.
func phaseErrors(ph *phase) map[string]int64 {
	out := map[string]int64{}
	for _, r := range ph.rec.All() {
		for code, n := range r.Summary(0).ErrorsByCode {
			out[code] += n
		}
	}
	return out
}

// subCounts returns the counts of b less those of a, leaving out zeros.
func subCounts(b, a map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range b {
		if d := v - a[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func restartText(x RestartResult) string {
	s := fmt.Sprintf("%s exited after %.1fs, back after %.1fs; longest window without grants %s; errors %s; leases lost %d",
		x.Name, x.ExitedAfterS, x.BackAfterS, fmtMs(x.NoGrantWindowMs), countsText(x.Errors), x.LeasesLost)
	if x.NewLeader != "" {
		s += fmt.Sprintf("; new stream leader %s after %s", x.NewLeader, fmtMs(x.NewLeaderAfterMs))
	}
	if x.HandedOverTo != "" {
		s += "; handed over to " + x.HandedOverTo + " before the stop"
	}
	if x.Note != "" {
		s += "; " + x.Note
	}
	return s
}

func printRolling(w io.Writer, r *RollingResult) {
	fmt.Fprintf(w, "\n== rolling restart (nodes stopped: %s%s) ==\n", r.Mode, preStopText(r.PreStop))
	for _, x := range r.Restarts {
		led := ""
		if x.LedStream {
			led = " (stream leader)"
		}
		fmt.Fprintf(w, "%s%s at %.1fs: %s\n", x.Name, led, x.AtS, restartText(x))
	}
	verdict := "missed"
	if r.Met {
		verdict = "met"
	}
	fmt.Fprintf(w, "longest window without grants %s against %s; leases lost %d; errors %s: %s\n",
		fmtMs(r.MaxNoGrantWindowMs), fmtMs(r.TargetMs), r.LeasesLost, countsText(r.Errors), verdict)
	for _, n := range []string{r.Note, r.Skipped} {
		if n != "" {
			fmt.Fprintf(w, "note: %s\n", n)
		}
	}
}
