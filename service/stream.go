package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/jsm.go/api"
	"github.com/nats-io/jsm.go/monitor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/streams"
)

// streamGuard watches the bucket's stream once a second through jsm.go:
// it records the token high-water mark, counts leader changes and the
// time without a leader, checks the stream's configuration and quorum for
// readiness, and holds grants back while the stream's sequence is below
// the high-water mark — a stream recreated or restored behind the
// service's back would otherwise hand out tokens that went backwards
// (invariant 2).
type streamGuard struct {
	bucket  *streams.Bucket
	mgr     *jsm.Manager
	store   *store
	tracker *tracker
	m       *metrics
	log     *slog.Logger
	conns   map[string]*nats.Conn // watched for permission errors

	below atomic.Bool

	mu        sync.Mutex
	health    Health
	leader    string
	lastErrs  map[string]error // per connection, the last error seen
	permUntil time.Time        // unready until then after a permission error
}

// Health is an instance's readiness as its last stream check saw it.
type Health struct {
	// Ready: the bucket's stream has a leader and a quorum of current
	// replicas, its configuration is as required, its sequence is not
	// below the token high-water mark, no permission error was reported in
	// the last minute, and the instance serves.
	Ready bool `json:"ready"`
	// Problems says why not, and what jsm.go's stream check warns of.
	Problems []string  `json:"problems,omitempty"`
	Leader   string    `json:"leader,omitempty"`
	LastSeq  uint64    `json:"last_seq"`
	Checked  time.Time `json:"checked"`
}

// errBelowHighWater refuses grants while the guard's below is set.
var errBelowHighWater = fmt.Errorf("%w: the bucket's stream went back below the token high-water mark (recreated or restored behind the service's back); grants resume once its sequence is above the mark again (see lockd check)", errUnavailable)

// regressed is called when a write committed at or below the high-water
// mark: the service stops trusting what it knows, reads afresh, and
// refuses grants until the mark holds again.
func (g *streamGuard) regressed(seq, floor uint64) {
	if !g.below.Swap(true) {
		g.m.belowHW.Set(1)
		g.log.Error("the bucket's stream went back below the token high-water mark: refusing grants", "seq", seq, "high_water", floor)
	}
	g.tracker.reset()
}

// run checks the stream every interval until ctx ends.
func (g *streamGuard) run(ctx context.Context, serving func() bool, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		g.check(ctx, serving(), now.Sub(last))
		last = now
	}
}

// check makes one round: stream info, readiness, high-water mark. elapsed
// is the time since the last round, counted as leaderless when the stream
// has no leader now.
func (g *streamGuard) check(ctx context.Context, serving bool, elapsed time.Duration) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	h := Health{Checked: time.Now()}
	info, err := g.info()
	if err != nil {
		h.Problems = append(h.Problems, "stream info: "+err.Error())
		g.m.leaderless.Add(elapsed.Seconds())
	} else {
		h.Leader, h.LastSeq = g.leaderOf(info), info.State.LastSeq
		h.Problems = append(h.Problems, g.streamProblems(info, elapsed)...)
		g.recordHighWater(cctx, info.State.LastSeq)
	}
	h.Problems = append(h.Problems, g.permissionProblems()...)
	if g.below.Load() {
		h.Problems = append(h.Problems, "stream below the token high-water mark: grants refused")
	}
	if !serving {
		h.Problems = append(h.Problems, "instance not serving")
	}
	h.Ready = len(h.Problems) == 0
	if h.Ready {
		g.m.ready.Set(1)
	} else {
		g.m.ready.Set(0)
	}
	if err == nil {
		h.Problems = append(h.Problems, jsmWarnings(info)...)
	}
	g.mu.Lock()
	g.health = h
	g.mu.Unlock()
}

func (g *streamGuard) info() (*api.StreamInfo, error) {
	st, err := g.mgr.LoadStream(streams.StreamName(g.bucket.Config().Bucket))
	if err != nil {
		return nil, err
	}
	return st.LatestInformation()
}

func (g *streamGuard) leaderOf(info *api.StreamInfo) string {
	if info.Cluster == nil {
		return ""
	}
	return info.Cluster.Leader
}

// streamProblems checks leadership, quorum, configuration and the
// high-water mark, and counts leader changes.
func (g *streamGuard) streamProblems(info *api.StreamInfo, elapsed time.Duration) []string {
	var problems []string
	leader := g.leaderOf(info)
	g.mu.Lock()
	if leader != g.leader && leader != "" && g.leader != "" {
		g.m.leaderChanges.Inc()
	}
	if leader != "" {
		g.leader = leader
	}
	g.mu.Unlock()
	if leader == "" {
		g.m.leaderless.Add(elapsed.Seconds())
		problems = append(problems, "stream has no leader")
	} else if current, quorum := currentPeers(info); current < quorum {
		problems = append(problems, fmt.Sprintf("%d of %d replicas current, a quorum needs %d", current, info.Config.Replicas, quorum))
	}
	cfg, err := liveConfig(info)
	if err != nil {
		return append(problems, err.Error())
	}
	hw := g.store.floor.Load() // the mark last recorded
	for _, d := range g.bucket.Config().Drift(cfg, info.State.LastSeq, hw) {
		problems = append(problems, "configuration: "+d.String())
	}
	if g.below.Load() && info.State.LastSeq > hw {
		g.below.Store(false)
		g.m.belowHW.Set(0)
		g.log.Info("the bucket's stream is above the token high-water mark again: granting", "last_seq", info.State.LastSeq, "high_water", hw)
	}
	return problems
}

// currentPeers counts the leader and the current, online replicas, and the
// quorum of the stream's replica count.
func currentPeers(info *api.StreamInfo) (current, quorum int) {
	quorum = info.Config.Replicas/2 + 1
	if info.Cluster == nil {
		return 1, quorum
	}
	current = 1
	for _, p := range info.Cluster.Replicas {
		if p.Current && !p.Offline {
			current++
		}
	}
	return current, quorum
}

// liveConfig converts jsm.go's view of a stream configuration to nats.go's
// (the JSON is the server's, field for field).
func liveConfig(info *api.StreamInfo) (jetstream.StreamConfig, error) {
	var sc jetstream.StreamConfig
	b, err := json.Marshal(info.Config)
	if err == nil {
		err = json.Unmarshal(b, &sc)
	}
	if err != nil {
		return sc, fmt.Errorf("read stream configuration: %w", err)
	}
	return sc, nil
}

// jsmWarnings runs jsm.go's stream health check (replicas offline or
// lagging) and returns what it warns of, for operators; readiness rests on
// the quorum above, since a stream with one replica down still serves.
func jsmWarnings(info *api.StreamInfo) []string {
	var res monitor.Result
	monitor.CheckStreamInfoHealth(info, &res, monitor.CheckStreamHealthOptions{
		StreamName: info.Config.Name, ClusterExpectedPeers: info.Config.Replicas, ClusterLagCritical: 10_000, ClusterSeenCritical: 10,
	}, api.NewDiscardLogger())
	out := make([]string, 0, len(res.Criticals)+len(res.Warnings))
	for _, c := range append(res.Criticals, res.Warnings...) {
		out = append(out, "jsm stream check: "+c)
	}
	return out
}

// recordHighWater raises the recorded token high-water mark to the highest
// revision seen, so that a bucket recreated after loss never hands out
// smaller tokens, and moves the store's floor to it.
func (g *streamGuard) recordHighWater(ctx context.Context, lastSeq uint64) {
	hw := min(g.tracker.maxRev(), lastSeq)
	if g.below.Load() || hw <= g.store.floor.Load() {
		return
	}
	if err := g.bucket.RecordHighWater(ctx, hw); err != nil {
		g.log.Warn("record high-water mark", "err", err)
		return
	}
	g.store.floor.Store(hw)
}

// permissionProblems reports a permission error the NATS server sent
// either connection within the last minute (logged and counted the first
// time it is seen): a subject the service needs is not allowed.
func (g *streamGuard) permissionProblems() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	for name, nc := range g.conns {
		err := nc.LastError()
		if err == nil || err == g.lastErrs[name] {
			continue
		}
		g.lastErrs[name] = err
		if errors.Is(err, nats.ErrPermissionViolation) {
			g.permUntil = now.Add(time.Minute)
			g.m.permission.WithLabelValues(name).Inc()
			g.log.Error("permission error on the "+name+" connection: a subject the service needs is not allowed (see deploy/)", "err", err)
		}
	}
	if now.Before(g.permUntil) {
		return []string{"a permission error was reported in the last minute (see the log)"}
	}
	return nil
}
