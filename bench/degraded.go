package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/bench/internal/procstat"
)

// DegradedResult is the outcome of the degraded scenario: the design load
// while one replica of the lock stream is stopped and the stream compacts.
//
// Compaction here is what the server does on its own under churn (there is
// no API to force it, and the lock bucket denies purge): with history 1
// every write supersedes the key's previous message, the file store
// rewrites a message block once more than half of it is superseded, and
// the raft log is cut after each snapshot (every 65,536 entries or 8 MB in
// nats-server 2.15). The figures show it on the stream leader: what the
// phase's commits wrote, against what the stream's blocks and its raft log
// hold on disk.
type DegradedResult struct {
	StoppedNode  string               `json:"stopped_node"`
	StreamLeader string               `json:"stream_leader"`
	AcquireP99   float64              `json:"acquire_p99_ms"`
	P99TargetMs  float64              `json:"p99_target_ms"`
	Met          bool                 `json:"met"` // acquire p99 within the target
	Errors       int64                `json:"errors"`
	Machine      *procstat.MachineCPU `json:"machine_cpu,omitempty"`
	Commits      int64                `json:"commits"`
	WrittenMB    float64              `json:"written_mb"`       // commits times the stream's mean message size
	LiveMB       float64              `json:"stream_live_mb"`   // the stream's bytes at the end
	BlocksMB     [2]float64           `json:"stream_blocks_mb"` // message block files at the start and at the end
	RaftLogMB    [2]float64           `json:"raft_log_mb"`      // raft log block files at the start and at the end
	// CaughtUpAfterS is how long the stopped replica, restarted after the
	// phase, took to be current again.
	CaughtUpAfterS float64 `json:"caught_up_after_s,omitempty"`
	Note           string  `json:"note,omitempty"`
}

// runDegraded warms up, stops a replica of the lock stream that does not
// lead it, runs the design load for --duration, and restarts the replica.
func runDegraded(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	log := e.grantLog()
	wl := e.workload("degraded", e.serviceBackend(), e.rq, log)
	e.warm(ctx, sum, wl, "degraded warm-up", c.leases)
	info, err := e.streamInfo(ctx, wl.Backend().Stream(), 5*time.Second)
	if err != nil || info.Cluster == nil || len(info.Cluster.Replicas) == 0 {
		return errors.Join(errors.New("degraded: the lock stream's replicas are unknown"), err)
	}
	dr := &DegradedResult{StreamLeader: info.Cluster.Leader, StoppedNode: info.Cluster.Replicas[0].Name,
		P99TargetMs: msOf(c.p99Target)}
	stopped, leader := e.cluster.Node(dr.StoppedNode), e.cluster.Node(dr.StreamLeader)
	fmt.Fprintf(e.out, "degraded: stopping %s (a replica of the lock stream, led by %s)\n", dr.StoppedNode, dr.StreamLeader)
	e.cluster.Stop(stopped)
	if err := e.settle(ctx); err != nil {
		return fmt.Errorf("degraded: after stopping %s: %w", dr.StoppedNode, err)
	}
	group := info.Cluster.RaftGroup
	blocks0, raft0 := e.diskUse(leader, wl.Backend().Stream(), group)
	r := e.designRates()
	fmt.Fprintf(e.out, "degraded: %s for %v with %s stopped\n", r, c.duration, dr.StoppedNode)
	ph := e.loadPhase(ctx, sum, wl, "degraded", r, c.duration, nil)
	blocks1, raft1 := e.diskUse(leader, wl.Backend().Stream(), group)
	dr.BlocksMB, dr.RaftLogMB = [2]float64{mb(blocks0), mb(blocks1)}, [2]float64{mb(raft0), mb(raft1)}
	if end, err := e.streamInfo(ctx, wl.Backend().Stream(), 5*time.Second); err == nil && end.State.Msgs > 0 {
		dr.LiveMB = mb(int64(end.State.Bytes))
		dr.WrittenMB = mb(ph.Commits * int64(end.State.Bytes/end.State.Msgs))
	}
	acq := ph.Ops[load.OpAcquire]
	dr.AcquireP99, dr.Met, dr.Machine, dr.Commits = acq.P99, acq.P99 <= dr.P99TargetMs && acq.Count > 0, ph.Machine, ph.Commits
	for _, s := range ph.Ops {
		dr.Errors += s.Errors
	}
	dr.CaughtUpAfterS, dr.Note = e.restartReplica(ctx, stopped, wl.Backend().Stream())
	e.cleanup(ctx, wl)
	sum.use(ph)
	sum.Degraded = dr
	return sum.check(log)
}

// settle waits (up to 30s) until the load connections are connected again,
// the lock stream has a leader and the service answers.
func (e *env) settle(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := e.streamLeader(ctx)
		for _, nc := range e.conns {
			if err == nil && !nc.IsConnected() {
				err = errors.New("load connection not connected")
			}
		}
		if err == nil {
			err = e.awaitService(ctx)
		}
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// diskUse returns the bytes in node i's message block files of stream and
// of the raft log of group.
func (e *env) diskUse(i int, stream, group string) (blocks, raft int64) {
	sum := func(pattern string) int64 {
		var n int64
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			if st, err := os.Stat(f); err == nil {
				n += st.Size()
			}
		}
		return n
	}
	js := filepath.Join(e.cluster.Dir(i), "jetstream")
	return sum(filepath.Join(js, "*", "streams", stream, "msgs", "*.blk")), sum(filepath.Join(js, "*", "_js_", group, "msgs", "*.blk"))
}

func mb(n int64) float64 { return round2(float64(n) / (1 << 20)) }

// restartReplica restarts node i and returns how long, in seconds, its
// replica of stream took to be current again (up to 60s), or a note why
// that is unknown.
func (e *env) restartReplica(ctx context.Context, i int, stream string) (float64, string) {
	start := time.Now()
	if err := e.cluster.Restart(ctx, i); err != nil {
		return 0, "restart failed: " + err.Error()
	}
	if err := e.awaitReplicaCurrent(ctx, i, stream, time.Minute); err != nil {
		return 0, e.cluster.Name(i) + " restarted: " + err.Error()
	}
	return round2(time.Since(start).Seconds()), ""
}

func printDegraded(w io.Writer, d *DegradedResult) {
	verdict := "missed"
	if d.Met {
		verdict = "met"
	}
	fmt.Fprintf(w, "\n== degraded: %s stopped (a replica of the lock stream, led by %s) ==\n", d.StoppedNode, d.StreamLeader)
	fmt.Fprintf(w, "acquire p99 %s against the %s target: %s; %d errors\n", fmtMs(d.AcquireP99), fmtMs(d.P99TargetMs), verdict, d.Errors)
	if d.Machine != nil {
		fmt.Fprintln(w, machineText(d.Machine))
	}
	fmt.Fprintf(w, "on %s: %d commits wrote about %.1f MB; stream blocks %.1f -> %.1f MB, raft log %.1f -> %.1f MB, live data %.1f MB\n",
		d.StreamLeader, d.Commits, d.WrittenMB, d.BlocksMB[0], d.BlocksMB[1], d.RaftLogMB[0], d.RaftLogMB[1], d.LiveMB)
	if d.CaughtUpAfterS > 0 {
		fmt.Fprintf(w, "%s restarted after the phase: current again after %.1fs\n", d.StoppedNode, d.CaughtUpAfterS)
	}
	if d.Note != "" {
		fmt.Fprintf(w, "note: %s\n", d.Note)
	}
}
