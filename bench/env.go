package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/streams"
)

// env is what a scenario runs against: the cluster (when the bench
// started one), the service (when the bench runs it), the load
// connections and the sampler.
type env struct {
	cfg     *config
	out     io.Writer
	url     string
	dir     string
	tempDir bool
	failed  bool // the run failed: keep its data directory for the logs
	runID   string

	cluster  *cluster
	svc      *runningService   // --service inproc
	moreSvcs []*runningService // --instances beyond the first
	svcProc  *child            // --service proc
	closeLog func()            // closes the in-process service's log

	conns   []*nats.Conn
	rq      *requester
	js      jetstream.JetStream
	sampler *sampler
}

func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func setup(ctx context.Context, cfg *config) (_ *env, err error) {
	e := &env{cfg: cfg, out: os.Stdout, url: cfg.url, runID: newRunID()}
	defer func() {
		if err != nil {
			e.failed = true
			e.close()
		}
	}()
	e.dir = cfg.dataDir
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
		if e.cluster, err = startCluster(ctx, e.dir, e.out, freePort); err != nil {
			return nil, err
		}
		e.url = e.cluster.URLs()
	}
	switch cfg.serviceMode {
	case "inproc":
		logger, closeLog, err := serviceLogger(filepath.Join(e.dir, "service.log"))
		if err != nil {
			return nil, err
		}
		e.svc, err = startService(ctx, e.url, cfg.prefix, cfg.bucket, cfg.tune, logger)
		if err != nil {
			closeLog()
			return nil, err
		}
		e.closeLog = closeLog
		for range cfg.instances - 1 {
			rs, err := startService(ctx, e.url, cfg.prefix, cfg.bucket, cfg.tune, logger)
			if err != nil {
				return nil, err
			}
			e.moreSvcs = append(e.moreSvcs, rs)
		}
	case "proc":
		e.svcProc = &child{name: "service", log: filepath.Join(e.dir, "service.log"),
			args: append([]string{cmdService, "-servers", e.url, "-prefix", cfg.prefix, "-bucket", cfg.bucket,
				"-log", filepath.Join(e.dir, "service.log")}, cfg.tune.args()...)}
		if err := e.svcProc.start(90 * time.Second); err != nil {
			return nil, err
		}
	}
	loadURL := e.url
	if cfg.clients == "service" {
		// nats.go learns the other nodes from this one, for reconnects.
		loadURL = e.svc.nc.ConnectedUrl()
	}
	if e.conns, err = connect(loadURL, cfg.conns, "jetlock-bench"); err != nil {
		return nil, err
	}
	if e.rq, err = newRequester(e.conns, cfg.maxInFlight); err != nil {
		return nil, err
	}
	if e.js, err = jetstream.New(e.conns[0]); err != nil {
		return nil, err
	}
	e.sampler = &sampler{js: e.js, procs: e.procs, progress: cfg.progress, out: e.out, inflight: e.rq.inflight.Load}
	if cfg.scenario != "raw" || cfg.serviceMode != "none" {
		if err := e.checkService(ctx); err != nil && cfg.scenario != "raw" {
			return nil, err
		}
	}
	return e, nil
}

// checkService asks for the status of a resource, to fail early and
// clearly when no service answers.
func (e *env) checkService(ctx context.Context) error {
	m := &nats.Msg{Subject: streams.Subject(e.cfg.prefix, streams.OpStatus), Data: []byte(`{"resource":"bench/probe"}`)}
	reply, _, err := e.rq.do(ctx, m, 5*time.Second)
	if err != nil {
		return fmt.Errorf("no jetlock service answers on %s: %w", m.Subject, err)
	}
	if code := serviceError(reply); code != "" {
		return fmt.Errorf("jetlock status probe answered %s", code)
	}
	return nil
}

// procs lists the processes to measure.
func (e *env) procs() []proc {
	self := "bench"
	if e.svc != nil {
		self = "bench+service"
	}
	ps := []proc{{name: self, pid: os.Getpid()}}
	if e.svcProc != nil {
		if pid := e.svcProc.pid(); pid > 0 {
			ps = append(ps, proc{name: "service", pid: pid})
		}
	}
	if e.cluster != nil {
		ps = append(ps, e.cluster.procs()...)
	}
	return ps
}

// placement returns the node the in-process service is connected to and
// the node leading the lock stream; either is empty when unknown.
func (e *env) placement(ctx context.Context) (service, leader string) {
	if e.svc != nil {
		service = e.svc.nc.ConnectedServerName()
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	leader, _ = streamLeader(lctx, e.js, streams.StreamName(e.cfg.bucket))
	return service, leader
}

// placeLeader moves the lock stream's leader as --leader asks: onto the
// in-process service's node (a stream leader step-down naming it as the
// successor), or away from it (a plain step-down).
func (e *env) placeLeader(ctx context.Context) error {
	if e.cfg.leader == "any" {
		return nil // config.finish refuses any other with no in-process service
	}
	stream := streams.StreamName(e.cfg.bucket)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		svcNode, leader := e.placement(ctx)
		if leader != "" && (leader == svcNode) == (e.cfg.leader == "service") {
			return nil
		}
		if leader != "" {
			// A step-down moves the leader away from where it is; "service"
			// names the successor.
			var body []byte
			if e.cfg.leader == "service" {
				body, _ = json.Marshal(map[string]any{"placement": map[string]string{"preferred": svcNode}})
			}
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := e.conns[0].RequestWithContext(sctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, body)
			cancel()
			if err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("--leader %s: could not move the leader of %s in 60s", e.cfg.leader, stream)
}

// describe names the cluster and where the service runs, for reports.
func (e *env) describe() (clusterDesc, serviceDesc string) {
	clusterDesc = "existing deployment " + e.url
	if e.cluster != nil {
		clusterDesc = "3 nats-server processes on loopback, sync always, R3 over az:a/az:b/az:c"
	}
	switch e.cfg.serviceMode {
	case "inproc":
		serviceDesc = "in the bench process (its CPU includes the load generator)"
		if n := 1 + len(e.moreSvcs); n > 1 {
			serviceDesc = fmt.Sprintf("%d instances in the bench process (its CPU includes the load generator; service times are the first instance's)", n)
		}
	case "proc":
		serviceDesc = "separate process"
	default:
		serviceDesc = "already deployed (not measured)"
	}
	return
}

// instances returns the in-process service instances, the first first.
func (e *env) instances() []*runningService {
	if e.svc == nil {
		return nil
	}
	return append([]*runningService{e.svc}, e.moreSvcs...)
}

// close stops everything the bench started, in order: load, service,
// nodes; and removes a temporary data directory unless --keep or the run
// failed (its logs tell why).
func (e *env) close() {
	if e.rq != nil {
		e.rq.close()
	}
	for _, nc := range e.conns {
		nc.Close()
	}
	for _, rs := range e.instances() {
		rs.stop()
	}
	if e.closeLog != nil {
		e.closeLog()
	}
	if e.svcProc != nil {
		e.svcProc.stop(15 * time.Second)
	}
	if e.cluster != nil {
		e.cluster.stop()
	}
	if e.dir != "" {
		if e.tempDir && !e.cfg.keep && !e.failed {
			os.RemoveAll(e.dir)
		} else {
			fmt.Fprintf(e.out, "data and logs kept in %s\n", e.dir)
		}
	}
}

// names returns the resource name prefix of a workload of this run.
func (e *env) names(kind string) string { return fmt.Sprintf("bench/%s/%s/", e.runID, kind) }

// workloadConfig returns the workload shape from the flags.
func (e *env) workloadConfig(kind string) workloadConfig {
	c := e.cfg
	return workloadConfig{resources: c.resources, leases: c.leases, ttl: c.ttl, renewInterval: c.renewInterval,
		renewJitter: c.renewJitter, timeout: c.timeout, retries: c.retries, retryBackoff: 250 * time.Millisecond,
		names: e.names(kind)}
}

func (e *env) serviceBackend() *serviceBackend {
	return &serviceBackend{prefix: e.cfg.prefix, bucket: e.cfg.bucket, owner: "bench-" + e.runID}
}
