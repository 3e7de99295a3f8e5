package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jetlock/jetlock/service"
)

// Hidden subcommands: the bench re-executes itself to run each cluster
// node (and, with --service proc, the service) as a process of its own.
const (
	cmdNode    = "__node"
	cmdService = "__service"
)

// readyLine is what a child prints on stdout once it serves.
const readyLine = "ready"

// untilParentGoes returns a context that ends when the parent closes our
// stdin (or dies, which closes it too) or on SIGTERM/SIGINT.
func untilParentGoes() (context.Context, context.CancelFunc) {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	return ctx, cancel
}

// nodeMain runs one nats-server node of the bench cluster: loopback,
// JetStream with fsync after every write (sync_interval: always), an
// availability-zone tag, and unique_tag "az:" so an R3 stream puts one
// replica in each zone.
func nodeMain(args []string) int {
	fs := flag.NewFlagSet(cmdNode, flag.ContinueOnError)
	name := fs.String("name", "n1", "server name")
	port := fs.Int("port", 0, "client port")
	clusterPort := fs.Int("cluster-port", 0, "route port")
	routes := fs.String("routes", "", "comma-separated route URLs")
	tag := fs.String("tag", "az:a", "availability-zone tag")
	dir := fs.String("dir", "", "data directory")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o := &server.Options{
		ServerName:         *name,
		Host:               "127.0.0.1",
		Port:               *port,
		JetStream:          true,
		StoreDir:           *dir,
		SyncAlways:         true,
		JetStreamUniqueTag: "az:",
		Tags:               []string{*tag},
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  16 << 30,
		Cluster: server.ClusterOpts{
			Name:        "jetlock-bench",
			Host:        "127.0.0.1",
			Port:        *clusterPort,
			NoAdvertise: true,
		},
		Routes:  server.RoutesFromStr(*routes),
		NoSigs:  true,
		LogFile: filepath.Join(*dir, "node.log"),
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, err := server.NewServer(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "node %s: %v\n", *name, err)
		return 1
	}
	s.ConfigureLogger()
	ctx, cancel := untilParentGoes()
	defer cancel()
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		fmt.Fprintf(os.Stderr, "node %s: not ready for connections\n", *name)
		s.Shutdown()
		return 1
	}
	fmt.Println(readyLine)
	<-ctx.Done()
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}

// serviceMain runs the jetlock service in a process of its own, so that
// its CPU and memory are measured apart from the load generator.
func serviceMain(args []string) int {
	fs := flag.NewFlagSet(cmdService, flag.ContinueOnError)
	url := fs.String("servers", nats.DefaultURL, "NATS URLs")
	prefix := fs.String("prefix", "jetlock", "subject prefix")
	bucket := fs.String("bucket", "jetlock", "bucket")
	logFile := fs.String("log", "", "log file (default stderr)")
	var tune tuning
	tune.register(fs, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := untilParentGoes()
	defer cancel()
	logger, closeLog, err := serviceLogger(*logFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer closeLog()
	svc, err := startService(ctx, *url, *prefix, *bucket, tune, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(readyLine)
	<-ctx.Done()
	svc.stop()
	return 0
}

// serviceLogger logs to path at info level, or warnings to stderr.
func serviceLogger(path string) (*slog.Logger, func(), error) {
	if path == "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	return slog.New(slog.NewTextHandler(f, nil)), func() { f.Close() }, nil
}

// runningService is a service started in this process.
type runningService struct {
	nc      *nats.Conn
	storeNC *nats.Conn
	cancel  context.CancelFunc
	done    chan error
	reg     *prometheus.Registry
}

// opTime is the service's own count and total time (receipt to reply) of
// one operation, from its metrics.
type opTime struct {
	count uint64
	sum   float64 // seconds
}

// svcStats is a reading of the in-process service's metrics: its own time
// per operation, and the requests it shed by reason (see
// jetlock_requests_shed_total).
type svcStats struct {
	ops  map[string]opTime
	shed map[string]float64
}

// stats reads the service's request-duration histogram and shed counters.
func (rs *runningService) stats() svcStats {
	st := svcStats{ops: map[string]opTime{}, shed: map[string]float64{}}
	mfs, err := rs.reg.Gather()
	if err != nil {
		return st
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "jetlock_request_duration_seconds":
				if h, op := m.GetHistogram(), label(m, "op"); h != nil && op != "" {
					st.ops[op] = opTime{count: h.GetSampleCount(), sum: h.GetSampleSum()}
				}
			case "jetlock_requests_shed_total":
				st.shed[label(m, "reason")] += m.GetCounter().GetValue()
			}
		}
	}
	return st
}

// startService connects to url, makes sure the bucket exists (retrying
// while the cluster settles), starts the service and waits until it serves.
func startService(ctx context.Context, url, prefix, bucket string, tune tuning, logger *slog.Logger) (*runningService, error) {
	nc, err := nats.Connect(url, nats.Name("jetlock-bench-service"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.ReconnectBufSize(64<<20))
	if err != nil {
		return nil, fmt.Errorf("service connect: %w", err)
	}
	cfg := service.DefaultConfig()
	cfg.Prefix = prefix
	cfg.Bucket.Bucket = bucket
	cfg.Logger = logger
	tune.apply(&cfg)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	storeNC, err := nats.Connect(url, nats.Name("jetlock-bench-store"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.ReconnectBufSize(64<<20))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("service store connect: %w", err)
	}
	if err := ensureBucket(ctx, storeNC, cfg.Bucket); err != nil {
		nc.Close()
		storeNC.Close()
		return nil, err
	}
	svc, err := service.New(nc, storeNC, cfg)
	if err != nil {
		nc.Close()
		storeNC.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rs := &runningService{nc: nc, storeNC: storeNC, cancel: cancel, done: make(chan error, 1), reg: reg}
	go func() { rs.done <- svc.Run(rctx) }()
	select {
	case <-svc.Ready():
		return rs, nil
	case err := <-rs.done:
		cancel()
		nc.Close()
		storeNC.Close()
		return nil, fmt.Errorf("service: %w", err)
	case <-time.After(60 * time.Second):
		rs.stop()
		return nil, fmt.Errorf("service not ready after 60s")
	}
}

// stop cancels the service and waits (up to 15s) for it to drain.
func (rs *runningService) stop() {
	rs.cancel()
	select {
	case <-rs.done:
	case <-time.After(15 * time.Second):
	}
	rs.nc.Close()
	rs.storeNC.Close()
}
