package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/jetlock/jetlock/internal/batchconn"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/gctune"
	"github.com/jetlock/jetlock/service"
)

// cmdService is the hidden subcommand with which the bench runs the
// service in a process of its own (--service proc without --lockd).
const cmdService = "__service"

// userFlags are the flags that carry the service's two users to a service
// process, as every lockd names them: lockd's environment variables
// changed names (NATS_USER became JETLOCK_USER), its flags did not.
var userFlags = map[devcluster.Role][2]string{
	devcluster.Service: {"--user", "--password"},
	devcluster.Store:   {"--store-user", "--store-password"},
}

// serviceUsers returns the flags that give a service process the
// cluster's service users (none without a cluster or with --auth=false).
// They are on its command line: random passwords of a cluster on loopback
// that lives as long as the run.
func serviceUsers(cl *devcluster.ProcCluster) []string {
	if cl == nil || cl.Open() {
		return nil
	}
	var args []string
	for _, r := range []devcluster.Role{devcluster.Service, devcluster.Store} {
		user, password := cl.User(r)
		args = append(args, userFlags[r][0], user, userFlags[r][1], password)
	}
	return args
}

// connOptions returns the options of a connection of a role.
type connOptions func(devcluster.Role) []nats.Option

// serviceRun is the service the bench started: instances in this process,
// or processes of their own (one per instance). Each instance serves its
// metrics on loopback.
type serviceRun struct {
	inproc  []*inprocService
	procs   []*devcluster.Child
	metrics []string  // metrics URLs, one per instance (and process, in order)
	log     io.Closer // the in-process instances' log
}

// inprocService is a service instance running in this process.
type inprocService struct {
	nc, store *nats.Conn
	cancel    context.CancelFunc
	done      chan error
	http      *http.Server
}

// startInproc connects the service's two connections, starts the service,
// serves its metrics on addr and waits until it serves. It returns the
// metrics URL.
func startInproc(ctx context.Context, url string, opts connOptions, cfg service.Config, addr string) (*inprocService, string, error) {
	rs := &inprocService{done: make(chan error, 1)}
	svc, l, err := rs.setup(url, opts, cfg, addr)
	if err != nil {
		rs.closeAll()
		return nil, "", fmt.Errorf("start the service: %w", err)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rs.cancel = cancel
	go func() { rs.done <- svc.Run(rctx) }()
	select {
	case <-svc.Ready():
		return rs, "http://" + l.Addr().String() + "/metrics", nil
	case err = <-rs.done:
		err = fmt.Errorf("service: %w", err)
	case <-time.After(60 * time.Second):
		err = errors.New("service not ready after 60s")
	}
	rs.stop()
	return nil, "", err
}

func (rs *inprocService) setup(url string, opts connOptions, cfg service.Config, addr string) (*service.Service, net.Listener, error) {
	var err error
	// The service's writes are gathered as lockd gathers them.
	if rs.nc, err = dial(url, "jetlock-bench-service", append(opts(devcluster.Service), batchconn.Option())...); err != nil {
		return nil, nil, err
	}
	if rs.store, err = dial(url, "jetlock-bench-store", append(opts(devcluster.Store), batchconn.Option())...); err != nil {
		return nil, nil, err
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	rs.http = &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = rs.http.Serve(l) }()
	svc, err := service.New(rs.nc, rs.store, cfg)
	return svc, l, err
}

// closeAll closes the metrics server and the connections.
func (rs *inprocService) closeAll() {
	if rs.http != nil {
		_ = rs.http.Close()
	}
	closeAll([]*nats.Conn{rs.nc, rs.store})
}

// stop cancels the service and waits (up to 15s) for it to drain.
func (rs *inprocService) stop() {
	rs.cancel()
	select {
	case <-rs.done:
	case <-time.After(15 * time.Second):
	}
	rs.closeAll()
}

// startServiceProcs starts the service as --instances processes of
// their own: this program's __service, or a lockd binary. The first is
// named "service" and logs to dir/service.log, the others "service-2"...
// and service-2.log...; each serves its metrics on a port of its own.
// users are the flags of its users (see serviceUsers). Only the first
// writes the profiles of --profile. On an error it returns the processes
// it started, for the caller to stop.
func startServiceProcs(cfg *config, url, dir string, users []string) (*serviceRun, error) {
	run := &serviceRun{}
	for i := range cfg.instances {
		ch, metrics, err := startServiceProc(cfg, url, dir, users, i)
		if err != nil {
			return run, err
		}
		run.procs, run.metrics = append(run.procs, ch), append(run.metrics, metrics)
	}
	return run, nil
}

// serviceProcName returns the name of the i-th service process (from 0):
// service, service-2, service-3...
func serviceProcName(i int) string {
	if i == 0 {
		return "service"
	}
	return fmt.Sprintf("service-%d", i+1)
}

// startServiceProc starts the i-th service process (see
// startServiceProcs) and returns it and its metrics URL. A lockd is given
// the servers by --url, the one name every lockd takes (the current one's
// hidden alias of --server).
func startServiceProc(cfg *config, url, dir string, users []string, i int) (*devcluster.Child, string, error) {
	port, err := devcluster.FreePort()
	if err != nil {
		return nil, "", err
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", port)
	args := append(append([]string{"--prefix", cfg.prefix, "--bucket", cfg.bucket, "--metrics", metrics}, users...), cfg.tune.args()...)
	name := serviceProcName(i)
	ch := &devcluster.Child{Name: name, Path: cfg.lockd, Args: append([]string{cmdService, "--server", url}, args...),
		Log: filepath.Join(dir, name+".log")}
	if cfg.profileDir != "" && i == 0 {
		cpu, heap := serviceProfiles(cfg.profileDir)
		ch.Args = append(ch.Args, "--cpuprofile", cpu, "--heapprofile", heap)
	}
	if cfg.lockd != "" {
		ch.Args = append([]string{"--url", url}, args...)
	}
	if err := ch.Start(); err != nil {
		return nil, "", err
	}
	return ch, "http://" + metrics + "/metrics", nil
}

// serviceMain runs the service in a process of its own until its stdin
// closes or SIGTERM/SIGINT arrive. Its flags are lockd's.
func serviceMain(args []string) int {
	fs := flag.NewFlagSet(cmdService, flag.ContinueOnError)
	url := fs.String("server", nats.DefaultURL, "NATS URLs")
	fs.StringVar(url, "s", nats.DefaultURL, "short for --server")
	fs.StringVar(url, "url", nats.DefaultURL, "the old name of --server")
	users := map[devcluster.Role]*[2]string{devcluster.Service: new([2]string), devcluster.Store: new([2]string)}
	for r, names := range userFlags {
		fs.StringVar(&users[r][0], names[0][2:], "", "NATS user name")
		fs.StringVar(&users[r][1], names[1][2:], "", "NATS password")
	}
	prefix := fs.String("prefix", "jetlock", "subject prefix")
	bucket := fs.String("bucket", "jetlock", "bucket")
	metrics := fs.String("metrics", "127.0.0.1:0", "serve Prometheus metrics on this address")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	heapProfile := fs.String("heapprofile", "", "write a heap profile to this file as the service ends")
	var tune tuning
	tune.register(fs, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	gctune.Apply(os.LookupEnv) // as lockd does
	cfg := tune.config(service.DefaultConfig())
	cfg.Prefix, cfg.Bucket.Bucket = *prefix, *bucket
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts := func(r devcluster.Role) []nats.Option {
		opts := []nats.Option{nats.CustomInboxPrefix(devcluster.InboxPrefix(r))}
		if u := users[r]; u[0] != "" {
			opts = append(opts, nats.UserInfo(u[0], u[1]))
		}
		return opts
	}
	var rs *inprocService
	err := withProfiles(*cpuProfile, *heapProfile, "heap", func() error {
		var err error
		if rs, _, err = startInproc(ctx, *url, opts, cfg, *metrics); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	})
	if rs != nil {
		rs.stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// serviceProfiles returns the paths of the CPU and heap profiles of a
// service process under dir (--profile).
func serviceProfiles(dir string) (cpu, heap string) {
	return filepath.Join(dir, "service.cpu.pprof"), filepath.Join(dir, "service.heap.pprof")
}

// stop stops the service and waits for it to end.
func (s *serviceRun) stop() {
	for _, rs := range s.inproc {
		rs.stop()
	}
	var wg sync.WaitGroup
	for _, ch := range s.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch.Stop(15 * time.Second)
		}()
	}
	wg.Wait()
	if s.log != nil {
		s.log.Close()
	}
}

// node returns the node the first in-process instance is connected to,
// or "" for a service process.
func (s *serviceRun) node() string {
	if len(s.inproc) == 0 {
		return ""
	}
	return s.inproc[0].nc.ConnectedServerName()
}

// opTime is the service's own count and total time (receipt to reply) of
// one operation, from its metrics.
type opTime struct {
	count, sum float64 // requests, seconds
}

// svcStats is a reading of the service's metrics: its own time per
// operation, the requests it shed by reason (see
// jetlock_requests_shed_total), and the waiting requests it woke
// (jetlock_wakes_total: in process or by a message).
type svcStats struct {
	ops   map[string]opTime
	shed  map[string]float64
	wakes *float64
	// commits are the round trips of the service's writes to the bucket
	// by kind (jetlock_store_commit_duration_seconds: put, delete, grant,
	// confirm...), conflicts the compare-and-set writes that lost a race
	// and were decided again (jetlock_cas_conflicts_total).
	commits   map[string]opTime
	conflicts *float64
}

func newSvcStats() svcStats {
	return svcStats{ops: map[string]opTime{}, shed: map[string]float64{}, wakes: new(float64),
		commits: map[string]opTime{}, conflicts: new(float64)}
}

// stats reads and sums the metrics of every instance; an instance that
// does not answer counts nothing.
func (s *serviceRun) stats(ctx context.Context) svcStats {
	st := newSvcStats()
	for _, url := range s.metrics {
		_ = scrape(ctx, url, st)
	}
	return st
}

// scrape adds the request-duration sums and counts and the shed counters
// of the Prometheus text exposition at url to st.
func scrape(ctx context.Context, url string, st svcStats) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := httpGet(ctx, url)
	if err != nil {
		return fmt.Errorf("service metrics: %w", err)
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body, st)
}

// httpGet sends a GET of url within ctx.
func httpGet(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return http.DefaultClient.Do(req)
}

// parseMetrics adds the service's figures in the Prometheus text format
// read from r to st.
func parseMetrics(r io.Reader, st svcStats) error {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return err
	}
	for _, m := range fams["jetlock_request_duration_seconds"].GetMetric() {
		op, h := label(m, "op"), m.GetHistogram()
		st.ops[op] = opTime{count: st.ops[op].count + float64(h.GetSampleCount()), sum: st.ops[op].sum + h.GetSampleSum()}
	}
	for _, m := range fams["jetlock_requests_shed_total"].GetMetric() {
		st.shed[label(m, "reason")] += m.GetCounter().GetValue()
	}
	for _, m := range fams["jetlock_wakes_total"].GetMetric() {
		*st.wakes += m.GetCounter().GetValue()
	}
	for _, m := range fams["jetlock_store_commit_duration_seconds"].GetMetric() {
		op, h := label(m, "op"), m.GetHistogram()
		st.commits[op] = opTime{count: st.commits[op].count + float64(h.GetSampleCount()), sum: st.commits[op].sum + h.GetSampleSum()}
	}
	for _, m := range fams["jetlock_cas_conflicts_total"].GetMetric() {
		*st.conflicts += m.GetCounter().GetValue()
	}
	return nil
}

// instanceReady reports whether the service instance whose metrics are at
// url answers them and reports itself ready: jetlock_ready 1, or no such
// gauge (a lockd older than it). A service process serves its metrics
// before it serves requests, and sets the gauge within a second of
// serving.
func instanceReady(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := httpGet(ctx, url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return false
	}
	ready, ok := fams["jetlock_ready"]
	if !ok {
		return true
	}
	for _, m := range ready.GetMetric() {
		if m.GetGauge().GetValue() != 1 {
			return false
		}
	}
	return len(ready.GetMetric()) > 0
}

// label returns the value of a metric's label name.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
