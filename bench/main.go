// Command bench measures a jetlock deployment: how many locks it holds, at
// what latency, how it behaves when a node dies and when many callers wait
// for one lock.
//
// With no flags it starts a three-node NATS cluster of its own, each node a
// separate process (this binary re-executed), with fsync after every write,
// starts the jetlock service against it, and runs the design workload of
// DESIGN.md section 4 for a minute: 100,000 resources, 20,000 leases held
// and renewed every 10s, 2,000 acquires and 2,000 releases a second. With
// --url it measures an existing deployment instead.
//
// Load is open-loop: each operation has an intended send time on a fixed
// schedule, and its latency is measured from that time, so a stall shows
// as latency rather than as a quietly lower rate (no coordinated omission).
//
// Scenarios (--scenario): steady, ramp, hotlock, failover, raw, all. See
// README.md in this directory.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/jetlock/jetlock/service"
)

// config is the parsed command line.
type config struct {
	url         string
	serviceMode string
	instances   int
	tune        tuning // of the service the bench starts
	tuned       bool   // a --service-* flag was given
	leader      string
	clients     string
	scenario    string
	target      string
	duration    time.Duration
	progress    time.Duration
	jsonPath    string
	htmlPath    string
	dataDir     string
	keep        bool
	prefix      string
	bucket      string
	rawBucket   string
	conns       int
	maxInFlight int
	timeout     time.Duration
	retries     int
	check       bool

	resources     int
	leases        int
	acquireRate   float64
	releaseRate   float64
	renewRate     float64
	renewInterval time.Duration
	renewJitter   float64
	ttl           time.Duration
	warmupRate    float64

	p99Target   time.Duration
	rampStart   float64
	rampStep    float64
	rampMax     float64
	rampStepDur time.Duration

	hotResources int
	waiters      int
	hold         time.Duration
	wait         time.Duration
	poll         time.Duration
	wakeSubject  string

	killAt       time.Duration
	restartAfter time.Duration
	failoverMode string

	cpuProfile string
	memProfile string
}

var scenarios = []string{"steady", "ramp", "hotlock", "failover", "raw", "all"}

func parseFlags(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&c.url, "url", "", "NATS URL(s) of an existing deployment; the default starts a 3-node cluster of separate processes")
	fs.StringVar(&c.leader, "leader", "any", "placement of the lock stream's leader with --service inproc: any (where JetStream put it), service (on the node the service is connected to: its writes cross no route), away (on another node)")
	fs.StringVar(&c.clients, "clients", "any", "where the load connections connect, with --service inproc: any (each to a cluster node picked at random, as nats.go does) or service (to the node the service is connected to: requests and replies cross no route, like clients in the service's own zone)")
	fs.StringVar(&c.serviceMode, "service", "", "where the jetlock service runs: inproc (in this process), proc (a child process, measured apart), none (already deployed). The default is inproc, or none with --url")
	c.tune.register(fs, "service-")
	fs.IntVar(&c.instances, "instances", 1, "with --service inproc: service instances in this process, each on its own connection (more than one makes every instance follow every write)")
	fs.StringVar(&c.scenario, "scenario", "steady", "one of "+strings.Join(scenarios, ", "))
	fs.StringVar(&c.target, "target", "service", "steady and ramp: service, or raw (the same load as bare KV compare-and-set writes, no service)")
	fs.DurationVar(&c.duration, "duration", 60*time.Second, "measured duration of steady, failover and hotlock, and of each phase of raw")
	fs.DurationVar(&c.progress, "progress", 5*time.Second, "interval of progress lines; 0 for none")
	fs.StringVar(&c.jsonPath, "json", "", "write the summary as JSON to this file")
	fs.StringVar(&c.htmlPath, "html", "", "write an HTML report with latency-over-time charts to this file")
	fs.StringVar(&c.dataDir, "data-dir", "", "directory for node data and logs; the default is a temporary directory")
	fs.BoolVar(&c.keep, "keep", false, "keep the data directory (node data and logs) after the run")
	fs.StringVar(&c.prefix, "prefix", "jetlock", "subject prefix of the service")
	fs.StringVar(&c.bucket, "bucket", "jetlock", "lock bucket of the service (its stream counts commits)")
	fs.StringVar(&c.rawBucket, "raw-bucket", "jetlock_bench_raw", "KV bucket of the raw baseline (created, and deleted afterwards)")
	fs.IntVar(&c.conns, "conns", 2, "load connections")
	fs.IntVar(&c.maxInFlight, "max-inflight", 50000, "requests in flight at most; beyond, sends count as 'backlog' errors")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Second, "request timeout")
	fs.IntVar(&c.retries, "retries", 1, "retries, with the same request_id, of an acquire whose outcome is unknown (timeout, unavailable)")
	fs.BoolVar(&c.check, "check", true, "check the answers for double grants and tokens going backwards (off for ramp)")

	fs.IntVar(&c.resources, "resources", 100_000, "lockable resources")
	fs.IntVar(&c.leases, "leases", 20_000, "leases held at once (acquired in a warm-up before measuring)")
	fs.Float64Var(&c.acquireRate, "acquire-rate", 2000, "acquires per second")
	fs.Float64Var(&c.releaseRate, "release-rate", -1, "releases per second; the default equals --acquire-rate")
	fs.Float64Var(&c.renewRate, "renew-rate", -1, "renewals per second; the default is --leases / --renew-interval")
	fs.DurationVar(&c.renewInterval, "renew-interval", 10*time.Second, "each lease is renewed about this often")
	fs.Float64Var(&c.renewJitter, "renew-jitter", 0.2, "jitter of the renew interval, as a ± fraction")
	fs.DurationVar(&c.ttl, "ttl", 30*time.Second, "lease TTL")
	fs.Float64Var(&c.warmupRate, "warmup-rate", 4000, "acquires per second of the unmeasured warm-up at most (and at most 256 in flight); also the clean-up release rate")

	fs.DurationVar(&c.p99Target, "p99-target", 200*time.Millisecond, "ramp: the acquire p99 a step must meet")
	fs.Float64Var(&c.rampStart, "ramp-start", 250, "ramp: acquire rate of the first step")
	fs.Float64Var(&c.rampStep, "ramp-step", 250, "ramp: acquire rate added each step")
	fs.Float64Var(&c.rampMax, "ramp-max", 20000, "ramp: highest acquire rate tried")
	fs.DurationVar(&c.rampStepDur, "ramp-step-duration", 10*time.Second, "ramp: duration of each step")

	fs.IntVar(&c.hotResources, "hot-resources", 10, "hotlock: contended resources")
	fs.IntVar(&c.waiters, "waiters", 20, "hotlock: callers per resource, each acquiring again as soon as it released")
	fs.DurationVar(&c.hold, "hold", 5*time.Millisecond, "hotlock: how long a caller holds the lock")
	fs.DurationVar(&c.wait, "wait", 30*time.Second, "hotlock: wait_ms of the waiting acquires")
	fs.DurationVar(&c.poll, "poll", 20*time.Millisecond, "hotlock: retry interval when the service refuses waiting and the bench polls instead")
	fs.StringVar(&c.wakeSubject, "wake-subject", "", "hotlock: subject to count wake messages on; the default is '<prefix>.>' minus the request subjects")

	fs.DurationVar(&c.killAt, "kill-at", 0, "failover: when to kill the stream leader; the default is a third of --duration")
	fs.DurationVar(&c.restartAfter, "restart-after", 15*time.Second, "failover: restart the killed node this long after; 0 never")
	fs.StringVar(&c.failoverMode, "failover-mode", "kill", "failover: kill (SIGKILL the leader's process) or stepdown (ask the leader to step down; works with --url)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench process (load generator and, with --service inproc, the service) to this file")
	fs.StringVar(&c.memProfile, "memprofile", "", "write an allocation profile of the bench process to this file at the end")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./bench [flags]\n\nMeasures jetlock under the design workload and beyond. Flags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) { c.tuned = c.tuned || strings.HasPrefix(f.Name, "service-") })
	return c, c.finish()
}

// finish fills derived defaults and refuses unusable combinations.
func (c *config) finish() error {
	ok := false
	for _, s := range scenarios {
		ok = ok || s == c.scenario
	}
	if !ok {
		return fmt.Errorf("unknown scenario %q (want one of %s)", c.scenario, strings.Join(scenarios, ", "))
	}
	if c.target != "service" && c.target != "raw" {
		return fmt.Errorf("--target %q: want service or raw", c.target)
	}
	if c.serviceMode == "" {
		c.serviceMode = "inproc"
		if c.url != "" {
			c.serviceMode = "none"
		}
	}
	switch c.leader {
	case "any", "service", "away":
	default:
		return fmt.Errorf("--leader %q: want any, service or away", c.leader)
	}
	switch c.serviceMode {
	case "inproc", "proc", "none":
	default:
		return fmt.Errorf("--service %q: want inproc, proc or none", c.serviceMode)
	}
	switch {
	case c.clients != "any" && c.clients != "service":
		return fmt.Errorf("--clients %q: want any or service", c.clients)
	case c.serviceMode != "inproc" && c.clients != "any":
		return fmt.Errorf("--clients %s needs --service inproc (the bench knows only that service's node)", c.clients)
	case c.serviceMode != "inproc" && c.leader != "any":
		return fmt.Errorf("--leader %s needs --service inproc (the bench knows only that service's node)", c.leader)
	}
	if c.url == "" && c.serviceMode == "none" {
		return fmt.Errorf("--service none needs --url")
	}
	if c.tuned && c.serviceMode == "none" {
		return fmt.Errorf("the --service-* flags tune the service the bench starts; with --service none (the default with --url) set them on lockd")
	}
	scfg := service.DefaultConfig()
	c.tune.apply(&scfg)
	if err := scfg.Validate(); err != nil {
		return err
	}
	if c.instances < 1 || (c.instances > 1 && c.serviceMode != "inproc") {
		return fmt.Errorf("--instances %d: want 1, or more with --service inproc", c.instances)
	}
	if c.releaseRate < 0 {
		c.releaseRate = c.acquireRate
	}
	if c.renewRate < 0 {
		c.renewRate = float64(c.leases) / c.renewInterval.Seconds()
	}
	if c.killAt == 0 {
		c.killAt = c.duration / 3
	}
	switch {
	case c.resources < 1 || c.leases < 0 || c.leases > c.resources:
		return fmt.Errorf("need 0 <= --leases (%d) <= --resources (%d)", c.leases, c.resources)
	case c.duration <= 0 || c.timeout <= 0 || c.ttl <= 0 || c.renewInterval <= 0:
		return fmt.Errorf("durations must be positive")
	case c.conns < 1 || c.maxInFlight < 1:
		return fmt.Errorf("--conns and --max-inflight must be at least 1")
	case c.acquireRate < 0 || c.renewRate < 0 || c.releaseRate < 0 || c.warmupRate <= 0:
		return fmt.Errorf("rates must not be negative (warm-up rate positive)")
	case c.rampStart <= 0 || c.rampStep <= 0 || c.rampMax < c.rampStart:
		return fmt.Errorf("ramp: need 0 < --ramp-start <= --ramp-max and --ramp-step > 0")
	case c.hotResources < 1 || c.waiters < 1:
		return fmt.Errorf("hotlock: need at least one resource and one waiter")
	case c.failoverMode != "kill" && c.failoverMode != "stepdown":
		return fmt.Errorf("--failover-mode %q: want kill or stepdown", c.failoverMode)
	case c.scenario == "failover" && c.failoverMode == "kill" && c.url != "":
		return fmt.Errorf("failover with --url can only use --failover-mode stepdown: the bench kills only nodes it started")
	case c.killAt >= c.duration:
		return fmt.Errorf("--kill-at %v must lie within --duration %v", c.killAt, c.duration)
	}
	return nil
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case cmdNode:
			os.Exit(nodeMain(os.Args[2:]))
		case cmdService:
			os.Exit(serviceMain(os.Args[2:]))
		}
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		if err == flag.ErrHelp {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: cpu profile:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if cfg.memProfile != "" {
		defer writeAllocProfile(cfg.memProfile)
	}
	if err := run(ctx, cfg); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

func writeAllocProfile(path string) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		f.Close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: allocation profile:", err)
	}
}

// run sets up the environment, runs the scenario and writes the reports.
func run(ctx context.Context, cfg *config) (err error) {
	e, err := setup(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		e.failed = err != nil
		e.close()
	}()
	sum := &Summary{Scenario: cfg.scenario, Started: time.Now().UTC(), Command: strings.Join(os.Args, " "),
		Machine: machineInfo(), Settings: cfg.settings()}
	sum.Machine.Cluster, sum.Machine.Service = e.describe()
	fmt.Fprintf(e.out, "jetlock bench: scenario %s on %s; service %s; %d cores\n", cfg.scenario, sum.Machine.Cluster, sum.Machine.Service, sum.Machine.Cores)
	if err := e.placeLeader(ctx); err != nil {
		return err
	}
	sum.Machine.ServiceServer, sum.Machine.StreamLeader = e.placement(ctx)
	if sum.Machine.ServiceServer != "" && sum.Machine.StreamLeader != "" {
		fmt.Fprintf(e.out, "placement: service connected to %s, lock stream led by %s\n", sum.Machine.ServiceServer, sum.Machine.StreamLeader)
	}
	var serr error
	switch cfg.scenario {
	case "steady":
		serr = runSteady(ctx, e, sum)
	case "ramp":
		serr = runRamp(ctx, e, sum)
	case "raw":
		serr = runRaw(ctx, e, sum)
	case "all":
		serr = runAll(ctx, e, sum)
	case "hotlock":
		serr = runHotlock(ctx, e, sum)
	case "failover":
		serr = runFailover(ctx, e, sum)
	}
	if ctx.Err() != nil {
		sum.Notes = append(sum.Notes, "interrupted: the figures cover only the part that ran")
	}
	for _, ph := range sum.Phases {
		if !ph.compact {
			printPhase(e.out, ph)
		}
	}
	printSummary(e.out, sum)
	if cfg.jsonPath != "" {
		if err := writeJSON(cfg.jsonPath, sum); err != nil {
			return err
		}
		fmt.Fprintf(e.out, "wrote %s\n", cfg.jsonPath)
	}
	if cfg.htmlPath != "" {
		if err := writeHTML(cfg.htmlPath, sum); err != nil {
			return err
		}
		fmt.Fprintf(e.out, "wrote %s\n", cfg.htmlPath)
	}
	return serr
}

// settings lists the flags that shape the load, for the reports.
func (c *config) settings() map[string]string {
	m := map[string]string{
		"duration": c.duration.String(), "resources": fmt.Sprint(c.resources), "leases": fmt.Sprint(c.leases),
		"acquire_rate": fmt.Sprint(c.acquireRate), "release_rate": fmt.Sprint(c.releaseRate),
		"renew_rate": fmt.Sprint(c.renewRate), "renew_interval": c.renewInterval.String(),
		"renew_jitter": fmt.Sprint(c.renewJitter), "ttl": c.ttl.String(), "timeout": c.timeout.String(),
		"conns": fmt.Sprint(c.conns), "p99_target": c.p99Target.String(), "ramp_start": fmt.Sprint(c.rampStart),
		"ramp_step": fmt.Sprint(c.rampStep), "ramp_step_duration": c.rampStepDur.String(),
		"hot_resources": fmt.Sprint(c.hotResources), "waiters": fmt.Sprint(c.waiters), "hold": c.hold.String(),
		"wait": c.wait.String(), "service": c.serviceMode, "target": c.target, "retries": fmt.Sprint(c.retries), "failover_mode": c.failoverMode,
		"leader": c.leader, "clients": c.clients, "instances": fmt.Sprint(c.instances),
	}
	if c.serviceMode != "none" {
		c.tune.settings(m)
	}
	return m
}
