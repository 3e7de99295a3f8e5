package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jetlock/jetlock/internal/handover"
	"github.com/jetlock/jetlock/streams"
)

// FailoverResult is the outcome of the failover scenario.
type FailoverResult struct {
	Mode string `json:"mode"` // kill, stepdown, stop (lame duck mode) or term
	// PreStop is what ran before a stop in lame duck mode (--pre-stop),
	// and HandedOverTo the node it handed the stream to.
	PreStop      string  `json:"pre_stop,omitempty"`
	HandedOverTo string  `json:"handed_over_to,omitempty"`
	Stream       string  `json:"stream"`
	OldLeader    string  `json:"old_leader"`
	NewLeader    string  `json:"new_leader"`
	KillAtS      float64 `json:"kill_at_s"` // seconds into the measured phase
	// NewLeaderAfterMs is when the bench first saw another node lead the
	// stream, after the kill.
	NewLeaderAfterMs float64 `json:"new_leader_after_ms"`
	// LastGrantBeforeMs is how long before the kill the last grant arrived.
	LastGrantBeforeMs float64 `json:"last_grant_before_ms"`
	// FirstGrantAfterMs is when, after the kill, the first grant of an
	// acquire sent after the kill arrived.
	FirstGrantAfterMs float64 `json:"first_grant_after_ms"`
	// NoGrantWindowMs is the longest time without any grant arriving, from
	// the last grant before the kill (or any later gap) on.
	NoGrantWindowMs float64 `json:"no_grant_window_ms"`
	RestartAtS      float64 `json:"restart_at_s,omitempty"`
	Note            string  `json:"note,omitempty"`

	killAt time.Time
}

func msOf(d time.Duration) float64 { return round2(float64(d) / 1e6) }

// runFailover runs the design workload and, --kill-at into it, kills the
// process of the node leading the lock stream, stops it as a deployment
// does, or asks it to step down (--failover-mode).
// It reports the window with no grants and checks the answers for double
// grants.
func runFailover(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	log := e.grantLog()
	wl := e.workload("failover", e.serviceBackend(), e.rq, log)
	e.warm(ctx, sum, wl, "failover warm-up", c.leases)
	r := e.designRates()
	fmt.Fprintf(e.out, "failover: %s for %v; %s the stream leader at %v\n", r, c.duration, c.failoverMode, c.killAt)
	var fr *FailoverResult
	ph := e.loadPhase(ctx, sum, wl, "failover", r, c.duration, func(ph *phase) { fr = e.failover(ctx, ph) })
	e.cleanup(ctx, wl)
	sum.use(ph)
	if !fr.killAt.IsZero() {
		fr.KillAtS = round2(fr.killAt.Sub(ph.start).Seconds())
		last, first, gap := ph.grants.Around(fr.killAt)
		fr.LastGrantBeforeMs, fr.FirstGrantAfterMs, fr.NoGrantWindowMs = msOf(last), msOf(first), msOf(gap)
	}
	sum.Failover = fr
	return sum.check(log)
}

// failover stops (or steps down) the stream leader at --kill-at, watches
// for the new leader, and restarts the node --restart-after the stop, or
// when it has exited if that is later.
func (e *env) failover(ctx context.Context, ph *phase) *FailoverResult {
	c := e.cfg
	fr := &FailoverResult{Mode: c.failoverMode, PreStop: preStopOf(c), Stream: streams.StreamName(c.bucket)}
	select {
	case <-time.After(c.killAt):
	case <-ctx.Done():
		return fr
	}
	leader, err := e.streamLeader(ctx)
	if err != nil {
		fr.Note = "could not find the stream leader: " + err.Error()
		return fr
	}
	fr.OldLeader = leader
	killAt := time.Now()
	idx := -1
	exited, onItsOwn := make(chan struct{}), true
	if c.failoverMode == "stepdown" {
		if err := e.stepDown(ctx, ""); err != nil {
			fr.Note = err.Error()
			return fr
		}
		ph.event("asked " + leader + " (stream leader) to step down")
	} else {
		if idx = e.cluster.Node(leader); idx < 0 {
			fr.Note = "stream leader " + leader + " is not a node the bench started"
			return fr
		}
		// A node in lame duck mode takes up to its lame duck duration to
		// exit: the new leader is watched for meanwhile.
		go func() {
			defer close(exited)
			onItsOwn, fr.HandedOverTo = e.stopNode(ctx, idx, c.failoverMode)
		}()
		ph.event(stopText(c.failoverMode, leader) + " (stream leader)")
	}
	fr.killAt = killAt
	fmt.Fprintf(e.out, "failover: %s %s at %.1fs\n", c.failoverMode, leader, killAt.Sub(ph.start).Seconds())
	if fr.NewLeader = e.awaitNewLeader(ctx, leader, killAt.Add(30*time.Second)); fr.NewLeader != "" {
		fr.NewLeaderAfterMs = msOf(time.Since(killAt))
		ph.event("new stream leader " + fr.NewLeader)
	}
	if idx < 0 {
		return fr
	}
	select {
	case <-exited:
	case <-ctx.Done():
		return fr
	}
	if !onItsOwn {
		fr.Note = leader + " did not exit on its own: killed"
	}
	if c.restartAfter > 0 {
		select {
		case <-time.After(time.Until(killAt.Add(c.restartAfter))):
		case <-ctx.Done():
			return fr
		}
		if err := e.cluster.Restart(ctx, idx); err != nil {
			fr.Note = "restart failed: " + err.Error()
		} else {
			fr.RestartAtS = round2(time.Since(ph.start).Seconds())
			ph.event("restarted " + leader)
		}
	}
	return fr
}

// stopNode stops node idx as mode says: kill (SIGKILL), term (SIGTERM: a
// shutdown without lame duck mode) or stop (as deploy/'s units and the
// NATS chart's pre-stop hook stop a server: the hand-over of --pre-stop,
// then SIGUSR2, lame duck mode), and
// waits until its process has exited. It reports whether the process
// exited on its own (a kill always does), and the node the pre-stop step
// handed the lock stream to (none when the node did not lead it).
func (e *env) stopNode(ctx context.Context, idx int, mode string) (onItsOwn bool, handedTo string) {
	switch mode {
	case "stop":
		if e.cfg.preStop == "handover" {
			handedTo = e.handOver(ctx, idx)
		}
		return e.cluster.LameDuck(idx), handedTo
	case "term":
		return e.cluster.Terminate(idx), ""
	}
	e.cluster.Kill(idx)
	return true, ""
}

// stopText says how a node was stopped, for events.
func stopText(mode, node string) string {
	switch mode {
	case "stop":
		return "stopped " + node + " in lame duck mode (SIGUSR2)"
	case "term":
		return "stopped " + node + " with SIGTERM"
	}
	return "killed " + node + " with SIGKILL"
}

// awaitNewLeader returns the first leader of the lock stream other than
// old that it sees before deadline, or "". A request for the stream's
// info that reaches the old leader as it steps down goes unanswered: each
// is given a short time, which bounds how late a new leader is seen.
func (e *env) awaitNewLeader(ctx context.Context, old string, deadline time.Time) string {
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if l, err := e.streamLeaderWithin(ctx, 250*time.Millisecond); err == nil && l != old {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
	return ""
}

func printFailover(w io.Writer, f *FailoverResult) {
	fmt.Fprintf(w, "\n== failover (%s%s of the leader of %s) ==\n", f.Mode, preStopText(f.PreStop), f.Stream)
	if f.Note != "" {
		fmt.Fprintf(w, "note: %s\n", f.Note)
	}
	if f.OldLeader == "" {
		return
	}
	fmt.Fprintf(w, "%s at %.1fs; new leader %s seen after %s\n", f.OldLeader, f.KillAtS, f.NewLeader, fmtMs(f.NewLeaderAfterMs))
	if f.HandedOverTo != "" {
		fmt.Fprintf(w, "pre-stop: handed over to %s before the stop\n", f.HandedOverTo)
	}
	fmt.Fprintf(w, "last grant %s before; first grant of an acquire sent after: %s after; longest window without grants: %s\n",
		fmtMs(f.LastGrantBeforeMs), fmtMs(f.FirstGrantAfterMs), fmtMs(f.NoGrantWindowMs))
	if f.RestartAtS > 0 {
		fmt.Fprintf(w, "restarted %s at %.1fs\n", f.OldLeader, f.RestartAtS)
	}
}

// handOver is deploy/'s pre-stop step (lockd handover) for node idx: if
// it leads the lock stream, the most current replica takes over before it
// stops. As in the units, a failure is reported and the stop goes on.
func (e *env) handOver(ctx context.Context, idx int) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	name := e.cluster.Name(idx)
	res, err := handover.Move(ctx, e.admin, streams.StreamName(e.cfg.bucket), name)
	switch {
	case err != nil:
		fmt.Fprintf(e.out, "pre-stop: hand-over from %s failed: %v\n", name, err)
	case res.NewLeader != "":
		fmt.Fprintf(e.out, "pre-stop: %s handed the stream over to %s in %v\n", name, res.NewLeader, res.Took.Round(time.Millisecond))
	}
	return res.NewLeader
}

// preStopOf is the pre-stop step of a run: --pre-stop for stops in lame
// duck mode, none otherwise.
func preStopOf(c *config) string {
	if c.failoverMode != "stop" {
		return ""
	}
	return c.preStop
}

// preStopText names the pre-stop step in a heading.
func preStopText(preStop string) string {
	if preStop == "" {
		return ""
	}
	return ", pre-stop " + preStop
}
