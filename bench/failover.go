package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"
)

// FailoverResult is the outcome of the failover scenario.
type FailoverResult struct {
	Mode      string  `json:"mode"` // kill or stepdown
	Stream    string  `json:"stream"`
	OldLeader string  `json:"old_leader"`
	NewLeader string  `json:"new_leader"`
	KillAtS   float64 `json:"kill_at_s"` // seconds into the measured phase
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
}

// runFailover runs the design workload and, --kill-at into it, kills the
// process of the node leading the lock stream (or asks it to step down).
// It reports the window with no grants and checks the answers for double
// grants.
func runFailover(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	log := e.grantLog()
	be := e.serviceBackend()
	wl := newWorkload(e.workloadConfig("failover"), be, e.rq, log, e.runID)
	e.warm(ctx, sum, wl, "failover warm-up", wl.cfg.leases)
	r := e.designRates()
	ph := newPhase("failover", be.name())
	ph.sched = c.duration
	ph.Rates = map[string]float64{opAcquire: r.acquire, opRenew: r.renew, opRelease: r.release}
	fr := &FailoverResult{Mode: c.failoverMode, Stream: be.stream()}
	var killAt time.Time
	fmt.Fprintf(e.out, "failover: %s for %v; %s the stream leader at %v\n", r, c.duration, c.failoverMode, c.killAt)
	e.measure(ctx, ph, be.stream(), func() {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			killAt = e.failover(ctx, ph, fr)
		}()
		wl.run(ctx, ph, r, c.duration)
		wl.drain(ctx)
		wg.Wait()
	})
	sum.Phases = append(sum.Phases, ph)
	e.cleanup(ctx, wl)
	sum.use(ph)
	if !killAt.IsZero() {
		fr.KillAtS = round2(killAt.Sub(ph.start).Seconds())
		grantWindow(fr, &ph.grants, killAt)
	}
	sum.Failover = fr
	if log != nil {
		s := log.check()
		sum.Safety = &s
		if s.Violations > 0 {
			return fmt.Errorf("failover: %d safety violations", s.Violations)
		}
	}
	return nil
}

// failover kills (or steps down) the stream leader at --kill-at, watches
// for the new leader, and restarts the node after --restart-after. It
// returns when the kill happened (zero if it did not).
func (e *env) failover(ctx context.Context, ph *phase, fr *FailoverResult) time.Time {
	c := e.cfg
	select {
	case <-time.After(c.killAt):
	case <-ctx.Done():
		return time.Time{}
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	leader, err := streamLeader(lctx, e.js, fr.Stream)
	cancel()
	if err != nil {
		fr.Note = "could not find the stream leader: " + err.Error()
		return time.Time{}
	}
	fr.OldLeader = leader
	var killAt time.Time
	idx := -1
	switch c.failoverMode {
	case "kill":
		idx = e.cluster.node(leader)
		if idx < 0 {
			fr.Note = "stream leader " + leader + " is not a node the bench started"
			return time.Time{}
		}
		killAt = time.Now()
		e.cluster.kill(idx)
		ph.event("killed " + leader + " (stream leader) with SIGKILL")
	case "stepdown":
		killAt = time.Now()
		reply, err := e.conns[0].Request("$JS.API.STREAM.LEADER.STEPDOWN."+fr.Stream, nil, 5*time.Second)
		if err != nil {
			fr.Note = "stepdown request: " + err.Error()
			return time.Time{}
		}
		var resp struct {
			Error *struct{ Description string } `json:"error"`
		}
		if json.Unmarshal(reply.Data, &resp) == nil && resp.Error != nil {
			fr.Note = "stepdown refused: " + resp.Error.Description
			return time.Time{}
		}
		ph.event("asked " + leader + " (stream leader) to step down")
	}
	fmt.Fprintf(e.out, "failover: %s %s at %.1fs\n", c.failoverMode, leader, killAt.Sub(ph.start).Seconds())
	// Watch for the new leader.
	deadline := killAt.Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		l, err := streamLeader(qctx, e.js, fr.Stream)
		cancel()
		if err == nil && l != leader {
			fr.NewLeader = l
			fr.NewLeaderAfterMs = round2(float64(time.Since(killAt)) / 1e6)
			ph.event("new stream leader " + l)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if idx >= 0 && c.restartAfter > 0 {
		select {
		case <-time.After(time.Until(killAt.Add(c.restartAfter))):
		case <-ctx.Done():
			return killAt
		}
		if err := e.cluster.restart(idx); err != nil {
			fr.Note = "restart failed: " + err.Error()
		} else {
			fr.RestartAtS = round2(time.Since(ph.start).Seconds())
			ph.event("restarted " + leader)
		}
	}
	return killAt
}

// grantWindow fills the grant timing of fr from the grants around kill.
func grantWindow(fr *FailoverResult, g *grantTimes, kill time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	recv := append([]time.Time(nil), g.recv...)
	sort.Slice(recv, func(i, j int) bool { return recv[i].Before(recv[j]) })
	var first time.Time
	for i := range g.sent {
		if !g.sent[i].Before(kill) && (first.IsZero() || g.recv[i].Before(first)) {
			first = g.recv[i]
		}
	}
	if !first.IsZero() {
		fr.FirstGrantAfterMs = round2(float64(first.Sub(kill)) / 1e6)
	}
	var gap time.Duration
	for i, t := range recv {
		if !t.After(kill) {
			fr.LastGrantBeforeMs = round2(float64(kill.Sub(t)) / 1e6)
			continue
		}
		if i > 0 {
			if d := t.Sub(recv[i-1]); d > gap {
				gap = d
			}
		}
	}
	fr.NoGrantWindowMs = round2(float64(gap) / 1e6)
}

func printFailover(w io.Writer, f *FailoverResult) {
	fmt.Fprintf(w, "\n== failover (%s of the leader of %s) ==\n", f.Mode, f.Stream)
	if f.Note != "" {
		fmt.Fprintf(w, "note: %s\n", f.Note)
	}
	if f.OldLeader == "" {
		return
	}
	fmt.Fprintf(w, "%s at %.1fs; new leader %s seen after %s\n", f.OldLeader, f.KillAtS, f.NewLeader, fmtMs(f.NewLeaderAfterMs))
	fmt.Fprintf(w, "last grant %s before; first grant of an acquire sent after: %s after; longest window without grants: %s\n",
		fmtMs(f.LastGrantBeforeMs), fmtMs(f.FirstGrantAfterMs), fmtMs(f.NoGrantWindowMs))
	if f.RestartAtS > 0 {
		fmt.Fprintf(w, "restarted %s at %.1fs\n", f.OldLeader, f.RestartAtS)
	}
}
