package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jetlock/jetlock/bench/internal/load"
)

// sessionsTargetPct is the reduction of replicated commits a second that
// session mode is to reach against per-lease mode at the design load
// (with no error and the acquire p99 within --p99-target).
const sessionsTargetPct = 30

// SessionsResult compares, in one run, the design load with each lease
// renewed on its own (per-lease mode, the steady phase) against the same
// leases, acquires and releases spread over --sessions sessions, each
// kept alive every TTL/3 instead of renewing its leases (session mode).
type SessionsResult struct {
	Sessions int `json:"sessions"`
	// Opened is the number of sessions open when the load began;
	// LeasesPerSession the leases held then, per session.
	Opened           int     `json:"sessions_opened"`
	LeasesPerSession float64 `json:"leases_per_session"`
	KeepaliveEveryS  float64 `json:"keepalive_every_s"`
	// PauseS is how long the bench waited between the two modes for the
	// per-lease phase's delete markers to leave the stream (see
	// awaitMarkers).
	PauseS float64 `json:"pause_s"`
	// RaftRead says that both modes' replicated commits were read from
	// the stream's raft log (see phase.RaftCommits).
	RaftRead bool `json:"raft_read"`
	// ServiceRead says that the bench read the service's metrics, and so
	// counted the check messages of session mode from its batch commits
	// (see SessionFigures.CheckMsgs); without them (--service none) it
	// counts none.
	ServiceRead bool           `json:"service_metrics_read"`
	PerLease    SessionFigures `json:"per_lease"`
	Session     SessionFigures `json:"session"`
	// The reductions of session mode against per-lease mode, in percent of
	// per-lease mode's rate: of replicated commits (raft appends), of
	// stream messages, and of writes (stream messages less the check
	// messages of session grants: an atomic batch counted once).
	RaftCommitsReductionPct float64 `json:"raft_commits_reduction_pct"`
	StreamMsgsReductionPct  float64 `json:"stream_msgs_reduction_pct"`
	WritesReductionPct      float64 `json:"writes_reduction_pct"`
	// ClusterCPURatio and ServiceCPURatio are session mode's CPU per
	// operation over per-lease mode's, of the nodes and of the service (0
	// when either mode's figure is unknown).
	ClusterCPURatio float64 `json:"cluster_cpu_ratio"`
	ServiceCPURatio float64 `json:"service_cpu_ratio,omitempty"`
	// ClusterLoadCPURatio and ServiceLoadCPURatio compare the CPU each
	// mode spent in all over its phase (of the same length, with the same
	// acquires and releases and the same leases kept): what carrying the
	// load in sessions costs against carrying it with renewals. Session
	// mode answers fewer operations (a keepalive for many renewals), so
	// its CPU per operation can be higher while its CPU in all is lower.
	ClusterLoadCPURatio float64 `json:"cluster_load_cpu_ratio"`
	ServiceLoadCPURatio float64 `json:"service_load_cpu_ratio,omitempty"`
	// HeldAtClose is the number of leases held in the sessions when they
	// were closed at the end, ClosedReleased the number the closes
	// released, by their answers.
	HeldAtClose    int    `json:"leases_held_at_close"`
	ClosedReleased int64  `json:"leases_released_by_close"`
	Target         string `json:"target"`
	// Met judges the target by replicated commits (raft appends).
	Met bool   `json:"met"`
	Why string `json:"why,omitempty"`
	// MetByWrites judges the same target with writes in place of
	// replicated commits. The leader sends whatever proposals are queued
	// in one append, so under load an append carries many writes, and the
	// number of appends follows the time a round of replication takes
	// more than the number of writes: a lighter load makes more, smaller
	// appends.
	MetByWrites bool   `json:"met_by_writes"`
	WhyByWrites string `json:"why_by_writes,omitempty"`
}

// SessionFigures are one mode's figures of the comparison.
type SessionFigures struct {
	Phase      string `json:"phase"`
	LeasesHeld int    `json:"leases_held"` // when the load began
	// RaftCommitsPerSec counts replicated commits: appends of the
	// stream's raft group (see phase.RaftCommits).
	RaftCommitsPerSec float64 `json:"raft_commits_per_s"`
	RaftCommits       int64   `json:"raft_commits"`
	// StreamMsgsPerSec counts the stream's messages (phase.CommitsPerSec).
	StreamMsgsPerSec float64 `json:"stream_msgs_per_s"`
	StreamMsgs       int64   `json:"stream_msgs"`
	// CheckMsgs is, in session mode, the number of atomic batches of
	// leases and a check message (on the bucket's "confirm" key) that the
	// service committed to grant to sessions: its commits of kind "grant"
	// in the phase, from its metrics (jetlock_store_commit_duration_seconds).
	// Every grant to a session commits so, on any number of instances; the
	// grants to one session that commit together share one batch and its
	// check message. Without the service's metrics (--service none) none
	// are counted. WritesPerSec is the
	// stream's messages a second less these: each single write and each
	// atomic batch once.
	CheckMsgs    int64   `json:"check_msgs"`
	WritesPerSec float64 `json:"writes_per_s"`
	// MsgsPerRaftCommit is how many messages an append carried on average.
	MsgsPerRaftCommit float64 `json:"msgs_per_raft_commit"`
	// ClusterUsPerOp and ServiceUsPerOp are the CPU time of the nodes
	// together and of the service (its processes together) per operation
	// answered, in microseconds (see CPUCost).
	ClusterUsPerOp float64 `json:"cluster_us_per_op"`
	ServiceUsPerOp float64 `json:"service_us_per_op,omitempty"`
	// Answered counts the operations answered in the phase, and
	// ClusterCPUSeconds, ServiceCPUSeconds the CPU time spent over it.
	Answered          int64   `json:"ops_answered"`
	ClusterCPUSeconds float64 `json:"cluster_cpu_s"`
	ServiceCPUSeconds float64 `json:"service_cpu_s,omitempty"`
	// Conflicts counts the compare-and-set writes the service lost to
	// another write and decided again (from its metrics), and
	// ConflictsPerGrantPct them per acquire granted, in percent.
	Conflicts            int64   `json:"cas_conflicts"`
	ConflictsPerGrantPct float64 `json:"cas_conflicts_per_grant_pct"`
	// Granted counts acquires answered granted (first tries and retries),
	// and the rest per grant: raft commits, and writes.
	Granted             int64   `json:"granted"`
	RaftCommitsPerGrant float64 `json:"raft_commits_per_grant"`
	WritesPerGrant      float64 `json:"writes_per_grant"`
	AcquireP50          float64 `json:"acquire_p50_ms"`
	AcquireP99          float64 `json:"acquire_p99_ms"`
	// Errors counts the answers of the phase that were not successes, by
	// operation and code in ErrorsByCode.
	Errors       int64                       `json:"errors"`
	ErrorsByCode map[string]map[string]int64 `json:"errors_by_code,omitempty"`
	LeasesLost   int64                       `json:"leases_lost"`
	MachineBusy  float64                     `json:"machine_busy_pct,omitempty"`
	MachineSteal float64                     `json:"machine_steal_pct,omitempty"`
}

// sessionFigures reads one mode's figures from its phase; sessions tells
// whether it is session mode, whose grants may carry check messages (see
// SessionFigures.CheckMsgs).
func sessionFigures(ph *phase, held int, lost load.Losses, sessions bool) SessionFigures {
	f := SessionFigures{Phase: ph.Name, LeasesHeld: held, RaftCommitsPerSec: ph.RaftCommitsPerSec, RaftCommits: ph.RaftCommits,
		StreamMsgsPerSec: ph.CommitsPerSec, StreamMsgs: ph.Commits, LeasesLost: lost.Leases(), ErrorsByCode: map[string]map[string]int64{}}
	for _, op := range []string{load.OpAcquire, load.OpAcquireRetry} {
		s := ph.Ops[op]
		f.Granted += s.Count - s.Errors
	}
	for op, s := range ph.Ops {
		f.Errors += s.Errors
		if len(s.ErrorsByCode) > 0 {
			f.ErrorsByCode[op] = s.ErrorsByCode
		}
	}
	acq := ph.Ops[load.OpAcquire]
	f.AcquireP50, f.AcquireP99 = acq.P50, acq.P99
	if sessions {
		f.CheckMsgs = ph.ServiceCommits["grant"] // none without the service's metrics
	}
	writes := max(f.StreamMsgs-f.CheckMsgs, 0)
	f.WritesPerSec = f.StreamMsgsPerSec
	if f.StreamMsgs > 0 {
		f.WritesPerSec = round2(f.StreamMsgsPerSec * float64(writes) / float64(f.StreamMsgs))
	}
	if f.Granted > 0 {
		f.RaftCommitsPerGrant = round2(float64(f.RaftCommits) / float64(f.Granted))
		f.WritesPerGrant = round2(float64(writes) / float64(f.Granted))
	}
	f.MsgsPerRaftCommit = ratio(f.StreamMsgsPerSec, f.RaftCommitsPerSec)
	if c := ph.CPU; c != nil {
		f.ClusterUsPerOp, f.ServiceUsPerOp, f.Answered = c.ClusterUsPerOp, c.ServiceUsPerOp, c.Answered
		f.ClusterCPUSeconds = round2(c.ClusterUsPerOp * float64(c.Answered) / 1e6)
		f.ServiceCPUSeconds = round2(c.ServiceUsPerOp * float64(c.Answered) / 1e6)
	}
	f.Conflicts = ph.ServiceConflicts
	if f.Granted > 0 {
		f.ConflictsPerGrantPct = round2(100 * float64(f.Conflicts) / float64(f.Granted))
	}
	if m := ph.Machine; m != nil {
		f.MachineBusy, f.MachineSteal = m.BusyPct, m.StealPct
	}
	return f
}

// reduction returns how much lower b is than a, in percent of a.
func reduction(a, b float64) float64 {
	if a <= 0 {
		return 0
	}
	return round2(100 * (a - b) / a)
}

// compareSessions judges session mode against per-lease mode.
func compareSessions(r *SessionsResult, p99Target time.Duration) {
	r.RaftCommitsReductionPct = reduction(r.PerLease.RaftCommitsPerSec, r.Session.RaftCommitsPerSec)
	r.StreamMsgsReductionPct = reduction(r.PerLease.StreamMsgsPerSec, r.Session.StreamMsgsPerSec)
	r.WritesReductionPct = reduction(r.PerLease.WritesPerSec, r.Session.WritesPerSec)
	r.ClusterCPURatio = ratio(r.Session.ClusterUsPerOp, r.PerLease.ClusterUsPerOp)
	r.ServiceCPURatio = ratio(r.Session.ServiceUsPerOp, r.PerLease.ServiceUsPerOp)
	r.ClusterLoadCPURatio = ratio(r.Session.ClusterCPUSeconds, r.PerLease.ClusterCPUSeconds)
	r.ServiceLoadCPURatio = ratio(r.Session.ServiceCPUSeconds, r.PerLease.ServiceCPUSeconds)
	r.Target = fmt.Sprintf("session mode's replicated commits/s at least %d %% below per-lease mode's, 0 errors, acquire p99 <= %s",
		sessionsTargetPct, fmtMs(msOf(p99Target)))
	var rest []string
	if r.Session.Errors > 0 {
		rest = append(rest, fmt.Sprintf("%d errors", r.Session.Errors))
	}
	if r.Session.AcquireP99 > msOf(p99Target) {
		rest = append(rest, fmt.Sprintf("acquire p99 %s", fmtMs(r.Session.AcquireP99)))
	}
	if r.Session.Granted == 0 {
		rest = append(rest, "no grant in session mode")
	}
	var why []string
	if !r.RaftRead {
		why = append(why, "the raft log was not read")
	} else if r.RaftCommitsReductionPct < sessionsTargetPct {
		why = append(why, fmt.Sprintf("raft commits %.1f %% lower", r.RaftCommitsReductionPct))
	}
	why = append(why, rest...)
	r.Met, r.Why = len(why) == 0, strings.Join(why, "; ")
	why = nil
	if r.WritesReductionPct < sessionsTargetPct {
		why = append(why, fmt.Sprintf("writes %.1f %% lower", r.WritesReductionPct))
	}
	why = append(why, rest...)
	r.MetByWrites, r.WhyByWrites = len(why) == 0, strings.Join(why, "; ")
}

// awaitMarkers waits until the stream holds no more than msgs0 messages
// and a little more, at most --sessions-pause (by default its duplicate
// window, the retry window and so the TTL of the service's delete
// markers, and 30 s), and returns how long it waited. A release leaves a delete marker that expires a retry window
// later, and expiring costs the nodes work: without the wait, the second
// mode would bear the expiry of the first mode's markers, which the first
// mode, on a fresh stream, did not.
func (e *env) awaitMarkers(ctx context.Context, stream string, msgs0 uint64) time.Duration {
	start := time.Now()
	info, err := e.streamInfo(ctx, stream, 5*time.Second)
	if err != nil {
		return 0
	}
	slack := uint64(max(100, e.cfg.leases/100))
	limit := e.cfg.sessionsPause
	if limit < 0 {
		limit = info.Config.Duplicates + 30*time.Second
	}
	if limit == 0 || info.State.Msgs <= msgs0+slack {
		return 0
	}
	fmt.Fprintf(e.out, "waiting (at most %v) for the steady phase's delete markers to expire: %d messages in the stream\n", limit, info.State.Msgs)
	for msgs := info.State.Msgs; msgs > msgs0+slack && time.Since(start) < limit && ctx.Err() == nil; {
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		if n := e.streamMsgs(ctx, stream); n > 0 {
			msgs = n
		}
	}
	return time.Since(start)
}

// streamMsgs returns the number of messages in the stream (0 if unknown).
func (e *env) streamMsgs(ctx context.Context, stream string) uint64 {
	info, err := e.streamInfo(ctx, stream, 5*time.Second)
	if err != nil {
		return 0
	}
	return info.State.Msgs
}

// sessionSteady runs the design load in session mode after the per-lease
// phase ph (which held perLeaseHeld leases and lost perLeaseLost): opens
// --sessions sessions, acquires the leases in them, runs the design rates
// of acquires and releases with keepalives instead of renewals for
// --duration, and closes the sessions.
func (e *env) sessionSteady(ctx context.Context, sum *Summary, log *load.GrantLog, ph *phase, perLeaseHeld int, perLeaseLost load.Losses, pause time.Duration) error {
	c := e.cfg
	wl := e.sessionWorkload("sessions", log)
	open := newPhase("sessions open", wl.Backend(), wl.InFlight, 0)
	e.measure(ctx, sum, open, func() { wl.OpenSessions(ctx, open.rec, c.warmupRate) })
	n := wl.SessionsOpen()
	fmt.Fprintf(e.out, "sessions open: %d of %d after %.1fs (after a pause of %.0fs)\n", n, c.sessions, open.DurationS, pause.Seconds())
	if n == 0 {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("sessions: the service opened none of %d sessions (%s)", c.sessions, errorText(open.Ops[load.OpSessionOpen]))
	}
	e.warm(ctx, sum, wl, "sessions warm-up", wl.Config().Leases)
	held := wl.Held()
	every := wl.KeepaliveInterval()
	r := load.Rates{Acquire: c.acquireRate, Release: c.releaseRate, Keepalive: float64(n) / every.Seconds()}
	fmt.Fprintf(e.out, "sessions: %s for %v over %d resources, %d leases in %d sessions\n", r, c.duration, c.resources, held, n)
	lost0 := wl.Losses()
	sph := e.loadPhase(ctx, sum, wl, "sessions", r, c.duration, nil)
	wl.Overdue(time.Now())
	lost := wl.Losses().Sub(lost0)
	start, atClose := time.Now(), wl.Held()
	wl.CloseSessions(ctx, load.NewRecorders(), max(c.warmupRate, 1000))
	fmt.Fprintf(e.out, "closed %d sessions in %.1fs: %d leases released\n", n, time.Since(start).Seconds(), wl.SessionsReleased())
	res := &SessionsResult{Sessions: c.sessions, Opened: n, KeepaliveEveryS: every.Seconds(), HeldAtClose: atClose, ClosedReleased: wl.SessionsReleased(),
		PauseS:   round2(pause.Seconds()),
		PerLease: sessionFigures(ph, perLeaseHeld, perLeaseLost, false), Session: sessionFigures(sph, held, lost, true)}
	res.LeasesPerSession = round2(float64(held) / float64(n))
	res.RaftRead = ph.RaftRead && sph.RaftRead
	res.ServiceRead = len(sph.ServiceCommits) > 0
	compareSessions(res, c.p99Target)
	sum.Sessions = res
	return nil
}

func printSessions(w io.Writer, r *SessionsResult) {
	fmt.Fprintf(w, "\n== sessions: %d leases in %d sessions (%.1f a session), each kept alive every %.0fs, against per-lease renewals (a pause of %.0fs between) ==\n",
		r.Session.LeasesHeld, r.Opened, r.LeasesPerSession, r.KeepaliveEveryS, r.PauseS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tleases\traft commits/s\tper grant\tmsgs each\tstream msgs/s\twrites/s\tper grant\tacquire p50\tp99\terrors\tlost\t"+
		"cluster µs/op\tservice µs/op\tconflicts\tmachine busy\t")
	for _, f := range []struct {
		name string
		SessionFigures
	}{{"per-lease", r.PerLease}, {"session", r.Session}} {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%.1f\t%.0f\t%.0f\t%.2f\t%s\t%s\t%d\t%d\t%.0f\t%.0f\t%d (%.2f%%)\t%.0f%%\t\n", f.name, f.LeasesHeld,
			f.RaftCommitsPerSec, f.RaftCommitsPerGrant, f.MsgsPerRaftCommit, f.StreamMsgsPerSec, f.WritesPerSec, f.WritesPerGrant,
			fmtMs(f.AcquireP50), fmtMs(f.AcquireP99), f.Errors, f.LeasesLost, f.ClusterUsPerOp, f.ServiceUsPerOp,
			f.Conflicts, f.ConflictsPerGrantPct, f.MachineBusy)
	}
	tw.Flush()
	if !r.RaftRead {
		fmt.Fprintln(w, "raft commits: the stream's raft log was not read (it is read on the bench's own cluster only)")
	}
	fmt.Fprintln(w, "raft commits: appends of the lock stream's raft group; "+checksText(r))
	fmt.Fprintf(w, "session mode against per-lease mode: raft commits/s %.1f %% lower, stream msgs/s %.1f %% lower, writes/s %.1f %% lower\n",
		r.RaftCommitsReductionPct, r.StreamMsgsReductionPct, r.WritesReductionPct)
	if s := cpuRatiosText(r); s != "" {
		fmt.Fprintln(w, "session mode against per-lease mode: "+s)
	}
	for _, f := range []struct {
		name string
		SessionFigures
	}{{"per-lease", r.PerLease}, {"session", r.Session}} {
		if len(f.ErrorsByCode) > 0 {
			fmt.Fprintf(w, "errors in %s mode: %v\n", f.name, f.ErrorsByCode)
		}
	}
	fmt.Fprintf(w, "closing the sessions released %d leases (%d held)\n", r.ClosedReleased, r.HeldAtClose)
	verdict := func(met bool, why string) string {
		if met {
			return "met"
		}
		return "missed (" + why + ")"
	}
	fmt.Fprintf(w, "target (%s): %s\n", r.Target, verdict(r.Met, r.Why))
	fmt.Fprintf(w, "the same target with writes in place of replicated commits: %s\n", verdict(r.MetByWrites, r.WhyByWrites))
}

// checksText says what the writes of the comparison are: the stream's
// messages less the check messages of session grants, as the service's
// batch commits counted them.
func checksText(r *SessionsResult) string {
	if !r.ServiceRead {
		return "writes: stream messages less the 0 check messages of session grants (each write or atomic batch once): " +
			"the service's metrics were not read, so its checked batches are unknown and none is counted"
	}
	return fmt.Sprintf("writes: stream messages less the %d check messages of session grants (each write or atomic batch once), "+
		"counted from the service's batch commits: every grant to a session commits in an atomic batch with one check message, "+
		"shared by the grants to one session that commit together", r.Session.CheckMsgs)
}

// cpuRatiosText renders session mode's CPU per operation against
// per-lease mode's, each figure only when both modes measured it.
func cpuRatiosText(r *SessionsResult) string {
	var parts []string
	if r.ClusterCPURatio > 0 {
		parts = append(parts, fmt.Sprintf("cluster CPU per operation %.2f×", r.ClusterCPURatio))
	}
	if r.ServiceCPURatio > 0 {
		parts = append(parts, fmt.Sprintf("service CPU per operation %.2f×", r.ServiceCPURatio))
	}
	if r.ClusterLoadCPURatio > 0 {
		parts = append(parts, fmt.Sprintf("cluster CPU for the load in all %.2f×", r.ClusterLoadCPURatio))
	}
	if r.ServiceLoadCPURatio > 0 {
		parts = append(parts, fmt.Sprintf("service CPU for the load in all %.2f×", r.ServiceLoadCPURatio))
	}
	return strings.Join(parts, ", ")
}
