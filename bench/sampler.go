package main

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/bench/internal/procstat"
	"github.com/jetlock/jetlock/bench/internal/raftwal"
)

var round2 = load.Round2

// Event marks a moment in a phase (a node killed, a ramp step).
type Event struct {
	T    float64 `json:"t"` // seconds since phase start
	What string  `json:"what"`
}

// seriesPoint is one value of a time series.
type seriesPoint struct {
	T float64 `json:"t"`
	V float64 `json:"v"`
}

// phase is one measured stretch of a run: its recorders and what the
// sampler saw meanwhile.
type phase struct {
	Name      string                    `json:"name"`
	Target    string                    `json:"target"` // service or raw
	Rates     map[string]float64        `json:"target_rates,omitempty"`
	DurationS float64                   `json:"duration_s"`
	Ops       map[string]load.OpSummary `json:"ops"`
	// CommitsPerSec and Commits count the messages the stream stored,
	// from its last sequence: each message of an atomic batch counts.
	CommitsPerSec float64 `json:"commits_per_s"`
	Commits       int64   `json:"commits"`
	// RaftCommitsPerSec and RaftCommits count replicated commits: the
	// appends of the stream's raft group, read from the stream leader's
	// raft log on disk (see internal/raftwal), when RaftRead. An append
	// carries an atomic batch whole, and whatever other proposals reached
	// the leader while it was busy with the one before: under load they
	// are far fewer than the messages, and their number follows the time
	// a round of replication takes more than the number of writes.
	// Without access to the nodes' files (--server), RaftRead is false.
	RaftCommitsPerSec float64                     `json:"raft_commits_per_s,omitempty"`
	RaftCommits       int64                       `json:"raft_commits,omitempty"`
	RaftRead          bool                        `json:"raft_read"`
	CPU               *CPUCost                    `json:"cpu_per_op,omitempty"`
	Processes         map[string]procstat.Summary `json:"processes"`
	Events            []Event                     `json:"events,omitempty"`
	// ServiceMs is the service's own mean time per operation, receipt to
	// reply, from its metrics (when the bench runs the service).
	ServiceMs map[string]float64 `json:"service_mean_ms,omitempty"`
	// ServiceShed counts the requests the service answered unavailable
	// without processing them, by reason: waited (longer than its queue
	// wait) or queue_full (when the bench runs the service).
	ServiceShed map[string]int64 `json:"service_shed,omitempty"`
	// ServiceCommitMs is the service's mean round trip of its writes to
	// the bucket, by kind, and ServiceCommits their number (the kind
	// "grant" is an atomic batch: a lone instance's grant to a session,
	// with its check, or a lock set's grant); ServiceConflicts
	// counts its compare-and-set writes that lost a race and were decided
	// again (when the bench runs the service).
	ServiceCommitMs  map[string]float64 `json:"service_commit_mean_ms,omitempty"`
	ServiceCommits   map[string]int64   `json:"service_commits,omitempty"`
	ServiceConflicts int64              `json:"service_cas_conflicts,omitempty"`
	// Machine is how the whole machine's CPU time went.
	Machine *procstat.MachineCPU `json:"machine_cpu,omitempty"`

	rec      *load.Recorders
	grants   load.GrantTimes
	stream   string        // whose last sequence counts the commits
	sched    time.Duration // scheduled length, if any: rates are counted over it
	compact  bool          // a ramp step: printed in the ramp table only
	start    time.Time
	end      time.Time
	commits  []seriesPoint
	raft     []seriesPoint // raft commits a second
	cpu      map[string][]seriesPoint
	evMu     sync.Mutex
	inflight func() int64
}

// newPhase returns a phase of load on be, whose requests in flight
// inflight counts, scheduled to last sched (0: as long as it runs).
func newPhase(name string, be load.Backend, inflight func() int64, sched time.Duration) *phase {
	return &phase{Name: name, Target: be.Name(), stream: be.Stream(), inflight: inflight, sched: sched,
		rec: load.NewRecorders(), cpu: map[string][]seriesPoint{}}
}

// event records what happened now.
func (p *phase) event(what string) {
	p.evMu.Lock()
	p.Events = append(p.Events, Event{T: round2(time.Since(p.start).Seconds()), What: what})
	p.evMu.Unlock()
}

// CPUCost is the CPU time used during a phase, in microseconds, per
// operation answered and per commit: of the service's process and of the
// cluster's nodes together.
type CPUCost struct {
	Answered int64 `json:"ops_answered"`
	Commits  int64 `json:"commits"`
	// ServiceProcess is the process measured as the service: "service";
	// the processes together when it runs in several ("service+service-2"
	// with --instances 2); or "bench+service" when the service runs in the
	// bench process (the load generator's CPU included).
	ServiceProcess     string  `json:"service_process,omitempty"`
	ServiceUsPerOp     float64 `json:"service_us_per_op,omitempty"`
	ServiceUsPerCommit float64 `json:"service_us_per_commit,omitempty"`
	ClusterUsPerOp     float64 `json:"cluster_us_per_op,omitempty"`
	ClusterUsPerCommit float64 `json:"cluster_us_per_commit,omitempty"`
}

// isNode reports whether a process name is a cluster node's (n1, n2, n3).
func isNode(name string) bool { return len(name) == 2 && name[0] == 'n' }

// isServiceProc reports whether a process name is a service process's:
// "service", or "service-2"... when several run (see env.procs).
func isServiceProc(name string) bool { return name == "service" || strings.HasPrefix(name, "service-") }

// serviceCPU returns the CPU seconds of the service's processes together
// and their names joined by "+" in the order they were started, or of the
// bench process when the service runs in it; ok is false when none was
// measured.
func serviceCPU(procs map[string]procstat.Summary) (seconds float64, name string, ok bool) {
	if p, ok := procs["bench+service"]; ok {
		return p.CPUSeconds, "bench+service", true
	}
	var names []string
	for n, p := range procs {
		if isServiceProc(n) {
			names = append(names, n)
			seconds += p.CPUSeconds
		}
	}
	// service, service-2, ..., service-10: shorter names first.
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(len(a), len(b)), strings.Compare(a, b)) })
	return seconds, strings.Join(names, "+"), len(names) > 0
}

// cpuCost divides the CPU time of procs by the operations answered and by
// the commits: the nodes' together, and the service's (its processes'
// together, see serviceCPU) only when the load went to the service.
func cpuCost(procs map[string]procstat.Summary, ops map[string]load.OpSummary, commits int64, service bool) *CPUCost {
	c := &CPUCost{Commits: commits}
	for _, s := range ops {
		c.Answered += s.Answered()
	}
	per := func(seconds float64, n int64) float64 {
		if n <= 0 {
			return 0
		}
		return round2(seconds * 1e6 / float64(n))
	}
	var cluster float64
	for name, p := range procs {
		if isNode(name) {
			cluster += p.CPUSeconds
		}
	}
	c.ClusterUsPerOp, c.ClusterUsPerCommit = per(cluster, c.Answered), per(cluster, commits)
	if seconds, name, ok := serviceCPU(procs); ok && service {
		c.ServiceProcess = name
		c.ServiceUsPerOp, c.ServiceUsPerCommit = per(seconds, c.Answered), per(seconds, commits)
	}
	return c
}

// lastSeq reads the stream's last sequence and, when the bench can read
// the nodes' files, the last index of the stream's raft group on its
// leader, waiting at most 900ms: a reading must not hold up the next one
// a second later.
func (e *env) lastSeq(ctx context.Context, stream string) seqReading {
	info, err := e.streamInfo(ctx, stream, 900*time.Millisecond)
	if err != nil {
		return seqReading{}
	}
	rd := seqReading{seq: info.State.LastSeq, at: time.Now()}
	if c := info.Cluster; c != nil && c.Leader != "" && c.RaftGroup != "" {
		rd.raft, rd.raftOK = e.raftIndex(c.Leader, c.RaftGroup)
	}
	return rd
}

// raftIndex returns the last index of raft group in the log of node
// (a server name), read from its files (when the bench runs the cluster).
func (e *env) raftIndex(node, group string) (uint64, bool) {
	if e.cluster == nil {
		return 0, false
	}
	i := e.cluster.Node(node)
	if i < 0 {
		return 0, false
	}
	e.walMu.Lock()
	defer e.walMu.Unlock()
	key := node + "/" + group
	l := e.wals[key]
	if l == nil {
		dir, err := raftwal.Dir(e.cluster.Dir(i), group)
		if err != nil {
			return 0, false
		}
		l = raftwal.Open(dir)
		if e.wals == nil {
			e.wals = map[string]*raftwal.Log{}
		}
		e.wals[key] = l
	}
	idx, err := l.Last()
	return idx, err == nil
}

type seqReading struct {
	seq    uint64
	raft   uint64    // the raft group's last index on the stream leader
	raftOK bool      // raft was read
	at     time.Time // zero: no reading
}

// sampling is the sampling of one phase: a reading every second while
// it runs, of an interval point for every recorder, the commit rate from
// the stream's last sequence, and the CPU and memory of the processes;
// and a progress line every --progress.
type sampling struct {
	e           *env
	ph          *phase
	pt          *procstat.Tracker
	m0          procstat.MachineSample
	m0err       error
	first, last seqReading
	// firstRaft and lastRaft are the first and the latest readings that
	// read the raft log.
	firstRaft, lastRaft seqReading
	prevTick            time.Time
	lastProgress        time.Time
}

// sample begins sampling ph and returns the function that stops it and
// fills in ph's summary.
func (e *env) sample(ctx context.Context, ph *phase) (stop func()) {
	ph.start = time.Now()
	r := &sampling{e: e, ph: ph, pt: procstat.NewTracker(ph.start), prevTick: ph.start, lastProgress: ph.start}
	r.first = e.lastSeq(ctx, ph.stream)
	r.last = r.first
	if r.first.raftOK {
		r.firstRaft, r.lastRaft = r.first, r.first
	}
	r.pt.Sample(e.procs())
	r.m0, r.m0err = procstat.ReadMachine()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				r.tick(context.WithoutCancel(ctx), time.Now(), true)
				return
			case now := <-t.C:
				r.tick(ctx, now, false)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// tick takes one reading at now; the final one fills in the phase.
func (r *sampling) tick(ctx context.Context, now time.Time, final bool) {
	ph := r.ph
	iv := now.Sub(r.prevTick)
	r.prevTick = now
	el := round2(now.Sub(ph.start).Seconds())
	stub := final && iv < 500*time.Millisecond // its rates would mislead
	pts := map[string]load.Point{}
	for _, rec := range ph.rec.All() {
		pts[rec.Name] = rec.Tick(el, iv, stub)
	}
	commits, raft := -1.0, -1.0
	if rd := r.e.lastSeq(ctx, ph.stream); !rd.at.IsZero() {
		if !r.last.at.IsZero() && rd.seq >= r.last.seq && !stub {
			commits = float64(rd.seq-r.last.seq) / rd.at.Sub(r.last.at).Seconds()
			ph.commits = append(ph.commits, seriesPoint{el, round2(commits)})
		}
		if r.first.at.IsZero() {
			r.first = rd
		}
		r.last = rd
		if rd.raftOK {
			// A new leader's log may stand a little behind the old one's.
			if !r.lastRaft.at.IsZero() && rd.raft >= r.lastRaft.raft && !stub {
				raft = float64(rd.raft-r.lastRaft.raft) / rd.at.Sub(r.lastRaft.at).Seconds()
				ph.raft = append(ph.raft, seriesPoint{el, round2(raft)})
			}
			if r.firstRaft.at.IsZero() {
				r.firstRaft = rd
			}
			if rd.raft >= r.lastRaft.raft {
				r.lastRaft = rd
			}
		}
	}
	cpu := r.pt.Sample(r.e.procs())
	for name, v := range cpu {
		if !stub {
			ph.cpu[name] = append(ph.cpu[name], seriesPoint{el, v})
		}
	}
	if progress := r.e.cfg.progress; progress > 0 && now.Sub(r.lastProgress) >= progress-50*time.Millisecond && !final {
		r.lastProgress = now
		fmt.Fprintln(r.e.out, progressLine(ph.Name, el, pts, commits, raft, cpu, ph.inflight))
	}
	if final {
		r.finish(now)
	}
}

// finish fills in the phase's summary at its end.
func (r *sampling) finish(now time.Time) {
	ph := r.ph
	ph.end = now
	ph.DurationS = round2(now.Sub(ph.start).Seconds())
	ph.Processes = r.pt.Summary(now)
	if m1, err := procstat.ReadMachine(); err == nil && r.m0err == nil {
		ph.Machine = procstat.Machine(r.m0, m1, runtime.NumCPU())
	}
	if !r.first.at.IsZero() && r.last.at.After(r.first.at) {
		ph.Commits = int64(r.last.seq - r.first.seq)
		ph.CommitsPerSec = round2(float64(ph.Commits) / r.last.at.Sub(r.first.at).Seconds())
	}
	if !r.firstRaft.at.IsZero() && r.lastRaft.at.After(r.firstRaft.at) {
		ph.RaftCommits = int64(r.lastRaft.raft - r.firstRaft.raft)
		ph.RaftCommitsPerSec = round2(float64(ph.RaftCommits) / r.lastRaft.at.Sub(r.firstRaft.at).Seconds())
		ph.RaftRead = true
	}
	d := ph.end.Sub(ph.start)
	if ph.sched > 0 && ph.sched < d {
		d = ph.sched
	}
	ph.Ops = map[string]load.OpSummary{}
	for _, rec := range ph.rec.All() {
		ph.Ops[rec.Name] = rec.Summary(d)
	}
	ph.CPU = cpuCost(ph.Processes, ph.Ops, ph.Commits, ph.Target == "service")
}

// progressLine renders one line of progress.
func progressLine(name string, el float64, pts map[string]load.Point, commits, raft float64, cpu map[string]float64, inflight func() int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s %4.0fs]", name, el)
	var errs int64
	for _, op := range sortedKeys(pts, load.OpOrder) {
		p := pts[op]
		errs += p.Errors
		if p.Count > 0 {
			fmt.Fprintf(&b, " %s %.0f/s p99 %s |", op, p.Rate, fmtMs(p.P99))
		}
	}
	if commits >= 0 {
		fmt.Fprintf(&b, " commits %.0f/s |", commits)
	}
	if raft >= 0 {
		fmt.Fprintf(&b, " raft commits %.0f/s |", raft)
	}
	fmt.Fprintf(&b, " errors %d", errs)
	if inflight != nil {
		fmt.Fprintf(&b, " | in flight %d", inflight())
	}
	if len(cpu) > 0 {
		b.WriteString(" | cpu")
		for _, n := range sortedKeys(cpu, strings.Compare) {
			fmt.Fprintf(&b, " %s %.0f%%", n, cpu[n])
		}
	}
	return b.String()
}

// sortedKeys returns the keys of m in the order of cmp.
func sortedKeys[V any](m map[string]V, cmp func(a, b string) int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp)
	return keys
}

// fmtMs formats milliseconds compactly.
func fmtMs(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2fs", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0fms", v)
	default:
		return fmt.Sprintf("%.2fms", v)
	}
}

// measure runs f as phase ph with the sampler running, adds ph to the
// summary, and adds the service's own figures when the bench runs the
// service: its mean time per operation (receipt to reply), which tells
// time inside the service from time getting to it, and the requests it
// shed unprocessed, which tells its overload from the store's
// unavailability.
func (e *env) measure(ctx context.Context, sum *Summary, ph *phase, f func()) *phase {
	sum.Phases = append(sum.Phases, ph)
	withSvc := e.svc != nil && ph.Target == "service"
	var before svcStats
	if withSvc {
		before = e.svc.stats(ctx)
	}
	profiled := e.profileNodes(ctx, ph, len(sum.Phases))
	stop := e.sample(ctx, ph)
	f()
	stop()
	profiled()
	if !withSvc {
		return ph
	}
	after := e.svc.stats(context.WithoutCancel(ctx))
	ph.ServiceMs, ph.ServiceShed = map[string]float64{}, map[string]int64{}
	for op, t := range after.ops {
		if n := t.count - before.ops[op].count; n > 0 {
			ph.ServiceMs[op] = round2(1000 * (t.sum - before.ops[op].sum) / n)
		}
	}
	for reason, n := range after.shed {
		ph.ServiceShed[reason] = int64(n - before.shed[reason])
	}
	ph.ServiceCommitMs, ph.ServiceCommits = map[string]float64{}, map[string]int64{}
	for op, t := range after.commits {
		if n := t.count - before.commits[op].count; n > 0 {
			ph.ServiceCommitMs[op] = round2(1000 * (t.sum - before.commits[op].sum) / n)
			ph.ServiceCommits[op] = int64(n)
		}
	}
	ph.ServiceConflicts = int64(*after.conflicts - *before.conflicts)
	return ph
}
