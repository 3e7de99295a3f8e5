package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/bench/internal/procstat"
	"github.com/jetlock/jetlock/bench/internal/raftwal"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

// env is what a scenario runs against: the cluster (when the bench
// started one), the service (when the bench runs it), the load
// connections. The load connects as callers, through the
// imports of the service's subjects; the bench's own bucket work (stream
// info, leader moves, the raw baseline) uses the service's store user.
type env struct {
	cfg     *config
	out     io.Writer
	url     string
	dir     string
	tempDir bool
	failed  bool // the run failed: keep its data directory for the logs
	runID   string

	cluster *devcluster.ProcCluster // nil with --server
	svc     *serviceRun             // nil with --service none
	conns   []*nats.Conn            // load connections, as callers
	rq      *load.Requester
	admin   *nats.Conn // as the store user
	js      jetstream.JetStream

	walMu sync.Mutex
	wals  map[string]*raftwal.Log // raft logs read, by node and group
}

func setup(ctx context.Context, cfg *config) (_ *env, err error) {
	var id [4]byte
	_, _ = rand.Read(id[:])
	e := &env{cfg: cfg, out: os.Stdout, url: cfg.url, runID: hex.EncodeToString(id[:]), dir: cfg.dataDir}
	defer func() {
		if err != nil {
			e.failed = true
			e.close()
		}
	}()
	if e.dir == "" {
		if e.dir, err = os.MkdirTemp("", "jetlock-bench-"); err != nil {
			return nil, err
		}
		e.tempDir = true
	} else if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, err
	}
	if cfg.url == "" {
		fmt.Fprintf(e.out, "starting 3-node cluster (separate processes, sync always) in %s\n", e.dir)
		e.cluster, err = devcluster.StartProcs(ctx, devcluster.ProcOptions{Dir: e.dir, Prefix: cfg.prefix, Open: !cfg.auth, Out: e.out,
			Profile: cfg.profileDir != ""})
		if err != nil {
			return nil, err
		}
		e.url = e.cluster.URLs()
	}
	if err := e.startService(ctx); err != nil {
		return nil, err
	}
	if err := e.connectLoad(); err != nil {
		return nil, err
	}
	return e, e.awaitService(ctx)
}

// startService starts the service as --service asks.
func (e *env) startService(ctx context.Context) error {
	c := e.cfg
	switch c.serviceMode {
	case "inproc":
		logf, err := os.OpenFile(filepath.Join(e.dir, "service.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		e.svc = &serviceRun{log: logf}
		cfg := c.tune.config(service.DefaultConfig())
		cfg.Prefix, cfg.Bucket.Bucket, cfg.Logger = c.prefix, c.bucket, slog.New(slog.NewTextHandler(logf, nil))
		for range c.instances {
			rs, metrics, err := startInproc(ctx, e.url, e.connOpts, cfg, "127.0.0.1:0")
			if err != nil {
				return err
			}
			e.svc.inproc, e.svc.metrics = append(e.svc.inproc, rs), append(e.svc.metrics, metrics)
		}
	case "proc":
		var err error
		e.svc, err = startServiceProcs(c, e.url, e.dir, serviceUsers(e.cluster))
		return err
	}
	return nil
}

// connOpts returns the options of a connection of role to the bench's own
// cluster (none with --server).
func (e *env) connOpts(r devcluster.Role) []nats.Option {
	if e.cluster == nil {
		return nil
	}
	return e.cluster.ConnectOptions(r)
}

// dial connects to url as name, reconnecting for ever.
func dial(url, name string, opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(url, append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond), nats.ReconnectBufSize(64 << 20)}, opts...)...)
}

// connect opens n connections as role.
func (e *env) connect(role devcluster.Role, url string, n int) ([]*nats.Conn, error) {
	var conns []*nats.Conn
	for i := range n {
		nc, err := dial(url, fmt.Sprintf("jetlock-bench-%s-%d", role, i), e.connOpts(role)...)
		if err != nil {
			closeAll(conns)
			return nil, fmt.Errorf("connect %s as %s: %w", url, role, err)
		}
		conns = append(conns, nc)
	}
	return conns, nil
}

func closeAll(conns []*nats.Conn) {
	for _, nc := range conns {
		if nc != nil {
			nc.Close()
		}
	}
}

// connectLoad opens the load connections, as callers, and the bench's own
// connection, as the store user.
func (e *env) connectLoad() error {
	loadURL := e.url
	if e.cfg.clients == "service" {
		loadURL = e.svc.inproc[0].nc.ConnectedUrl() // nats.go learns the other nodes from it
	}
	var err error
	if e.conns, err = e.connect(devcluster.Caller, loadURL, e.cfg.conns); err != nil {
		return err
	}
	if e.rq, err = load.NewRequester(e.conns, e.cfg.maxInFlight); err != nil {
		return err
	}
	admin, err := e.connect(devcluster.Store, e.url, 1)
	if err != nil {
		return err
	}
	e.admin = admin[0]
	e.js, err = jetstream.New(e.admin)
	return err
}

// awaitService waits until the service answers a status request, and
// each service process its metrics, ready (up to 90s for each: see
// instanceReady), to fail early and clearly when one does not. With
// --service none it asks once, and only a scenario that needs the service
// fails.
func (e *env) awaitService(ctx context.Context) error {
	probe := func() error {
		m := e.serviceBackend().Msg(streams.OpStatus, &streams.StatusRequest{Resource: "bench/probe"})
		reply, err := e.conns[0].RequestMsg(m, 2*time.Second)
		if err == nil && load.ServiceError(reply) != "" {
			err = fmt.Errorf("status probe answered %s", load.ServiceError(reply))
		}
		return err
	}
	for i, ch := range e.svcProcs() {
		ready := func() bool { return probe() == nil && instanceReady(ctx, e.svc.metrics[i]) }
		if err := ch.WaitReady(ctx, 90*time.Second, ready); err != nil {
			if e.cfg.lockd != "" && e.cluster != nil && !e.cluster.Open() {
				err = fmt.Errorf("%w; a lockd that reaches NATS through one connection without credentials needs --auth=false", err)
			}
			return fmt.Errorf("service process: %w", err)
		}
	}
	if err := probe(); err != nil && (e.cfg.target == "service" && e.cfg.scenario != "raw" || e.svc != nil) {
		return fmt.Errorf("no jetlock service answers on %s: %w", streams.Subject(e.cfg.prefix, streams.OpStatus), err)
	}
	return nil
}

// procs lists the processes to measure.
func (e *env) procs() []procstat.Proc {
	ps := []procstat.Proc{{Name: "bench", PID: os.Getpid()}}
	if e.svc != nil && len(e.svc.inproc) > 0 {
		ps[0].Name = "bench+service"
	}
	for i, ch := range e.svcProcs() {
		if pid := ch.PID(); pid > 0 {
			ps = append(ps, procstat.Proc{Name: serviceProcName(i), PID: pid})
		}
	}
	for i := range devcluster.Size {
		if e.cluster != nil && e.cluster.PID(i) > 0 {
			ps = append(ps, procstat.Proc{Name: e.cluster.Name(i), PID: e.cluster.PID(i)})
		}
	}
	return ps
}

// svcProcs returns the service processes the bench started (none with
// --service inproc or none).
func (e *env) svcProcs() []*devcluster.Child {
	if e.svc == nil {
		return nil
	}
	return e.svc.procs
}

// streamLeader returns the server name leading the lock stream.
func (e *env) streamLeader(ctx context.Context) (string, error) {
	return e.streamLeaderWithin(ctx, 5*time.Second)
}

// streamLeaderWithin is streamLeader waiting at most timeout for the
// answer.
func (e *env) streamLeaderWithin(ctx context.Context, timeout time.Duration) (string, error) {
	info, err := e.streamInfo(ctx, streams.StreamName(e.cfg.bucket), timeout)
	if err == nil && (info.Cluster == nil || info.Cluster.Leader == "") {
		err = errors.New("the lock stream has no leader")
	}
	if err != nil {
		return "", err
	}
	return info.Cluster.Leader, nil
}

// streamInfo returns the stream's info, waiting at most timeout.
func (e *env) streamInfo(ctx context.Context, stream string, timeout time.Duration) (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s, err := e.js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// stepDown asks the lock stream's leader to step down, in favour of the
// node preferred if not empty.
func (e *env) stepDown(ctx context.Context, preferred string) error {
	var body []byte
	if preferred != "" {
		body, _ = json.Marshal(map[string]any{"placement": map[string]string{"preferred": preferred}})
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	reply, err := e.admin.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+streams.StreamName(e.cfg.bucket), body)
	if err != nil {
		return fmt.Errorf("stepdown request: %w", err)
	}
	var resp struct {
		Error *struct{ Description string } `json:"error"`
	}
	if json.Unmarshal(reply.Data, &resp) == nil && resp.Error != nil {
		return fmt.Errorf("stepdown refused: %s", resp.Error.Description)
	}
	return nil
}

// placeLeader moves the lock stream's leader as --leader asks: onto the
// in-process service's node, or away from it.
func (e *env) placeLeader(ctx context.Context) error {
	want := e.cfg.leader
	for deadline := time.Now().Add(60 * time.Second); want != "any" && time.Now().Before(deadline); time.Sleep(time.Second) {
		leader, err := e.streamLeader(ctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			continue
		case (leader == e.svc.node()) == (want == "service"):
			return nil
		case want == "service":
			_ = e.stepDown(ctx, e.svc.node())
		default:
			_ = e.stepDown(ctx, "")
		}
	}
	if want == "any" {
		return nil
	}
	return fmt.Errorf("--leader %s: could not move the leader of the lock stream in 60s", want)
}

// describe names the cluster and where the service runs, for reports.
func (e *env) describe() (cluster, svc string) {
	cluster = "existing deployment " + e.url
	if e.cluster != nil {
		cluster = "3 nats-server processes on loopback, sync always, R3 over az:a/az:b/az:c, least-privilege accounts"
		if e.cluster.Open() {
			cluster = "3 nats-server processes on loopback, sync always, R3 over az:a/az:b/az:c, no accounts (--auth=false)"
		}
	}
	procs := "separate process"
	if n := e.cfg.instances; n > 1 {
		procs = fmt.Sprintf("%d separate processes (their CPU counted together as the service's)", n)
	}
	switch {
	case e.cfg.lockd != "":
		return cluster, procs + ": " + e.cfg.lockd
	case e.cfg.serviceMode == "proc":
		return cluster, procs
	case e.cfg.serviceMode == "inproc" && e.cfg.instances > 1:
		return cluster, fmt.Sprintf("%d instances in the bench process (its CPU includes the load generator)", e.cfg.instances)
	case e.cfg.serviceMode == "inproc":
		return cluster, "in the bench process (its CPU includes the load generator)"
	}
	return cluster, "already deployed (not measured)"
}

// close stops everything the bench started, in order: load, service,
// nodes; and removes a temporary data directory unless --keep or the run
// failed (its logs tell why).
func (e *env) close() {
	if e.rq != nil {
		e.rq.Close()
	}
	closeAll(append(e.conns, e.admin))
	if e.svc != nil {
		e.svc.stop()
	}
	if e.cluster != nil {
		e.cluster.Shutdown()
	}
	if e.tempDir && !e.cfg.keep && !e.failed {
		os.RemoveAll(e.dir)
	} else if e.dir != "" {
		fmt.Fprintf(e.out, "data and logs kept in %s\n", e.dir)
	}
}

// names returns the resource name prefix of a workload of this run.
func (e *env) names(kind string) string { return fmt.Sprintf("bench/%s/%s/", e.runID, kind) }

// workload returns a lease workload of the flags' shape on be through rq.
func (e *env) workload(kind string, be load.Backend, rq *load.Requester, log *load.GrantLog) *load.Workload {
	c := e.cfg
	return load.NewWorkload(load.Config{Resources: c.resources, Leases: c.leases, TTL: c.ttl, RenewInterval: c.renewInterval,
		RenewJitter: c.renewJitter, Timeout: c.timeout, Retries: c.retries, RetryBackoff: 250 * time.Millisecond,
		Names: e.names(kind), RunID: e.runID}, be, rq, log)
}

// sessionWorkload returns a workload of the flags' shape on the service
// in session mode, in --sessions sessions.
func (e *env) sessionWorkload(kind string, log *load.GrantLog) *load.Workload {
	wl := e.workload(kind, e.serviceBackend(), e.rq, log)
	cfg := wl.Config()
	cfg.Sessions = e.cfg.sessions
	return load.NewWorkload(cfg, wl.Backend(), e.rq, log)
}

func (e *env) serviceBackend() *load.Service {
	return &load.Service{Prefix: e.cfg.prefix, Bucket: e.cfg.bucket, Owner: "bench-" + e.runID}
}

// grantLog returns a grant log for the safety check, or nil without it.
func (e *env) grantLog() *load.GrantLog {
	if e.cfg.check {
		return load.NewGrantLog()
	}
	return nil
}
