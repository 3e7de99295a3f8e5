package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

// config is the parsed command line.
type config struct {
	url, serviceMode, lockd string
	auth, check             bool
	instances               int
	tune                    tuning // of the service the bench starts
	tuned, authSet          bool   // a --service-* flag, --auth was given
	leader, clients         string
	scenario, target        string
	duration, progress      time.Duration
	jsonPath, htmlPath      string
	dataDir                 string
	keep                    bool
	prefix, bucket          string
	rawBucket               string
	conns, maxInFlight      int
	timeout                 time.Duration
	retries                 int

	resources, leases                    int
	acquireRate, releaseRate, renewRate  float64
	renewInterval, ttl                   time.Duration
	renewJitter, warmupRate              float64
	p99Target, rampStepDur               time.Duration
	rampStart, rampStep, rampMax         float64
	hotResources, waiters, workers       int
	rawBatch                             int
	hold, wait                           time.Duration
	wakeSubject                          string
	killAt, restartAfter, settle         time.Duration
	failoverMode, cpuProfile, memProfile string
	// restart is what the rolling scenario restarts: nodes, services or all.
	restart string
	// preStop is what runs before a node is stopped in lame duck mode:
	// handover (deploy/'s pre-stop step) or none.
	preStop                     string
	profileDir                  string
	carriedRate, overloadFactor float64
	floodRate                   float64
	sessions                    int
	sessionsPause               time.Duration
	setMin, setMax, setHot      int
	limit, candidates, rounds   int

	flags *flag.FlagSet // the parsed flags, holding the derived values too
}

// noisyUserRate is the service's per-tenant rate in the noisy scenario
// unless --service-user-rate sets one: the flooding tenant's.
const noisyUserRate = 500

var scenarios = []string{"steady", "ramp", "raw", "all", "hotlock", "failover", "cycles", "degraded", "overload", "noisy",
	"sets", "semaphore", "election", "rolling", "waiters"}

// The rolling scenario's defaults: it restarts three nodes (each up to its
// lame duck duration, then until it is current again) and the service
// instances one after another, under load.
const (
	rollingDuration = 5 * time.Minute
	rollingStartAt  = 15 * time.Second
)

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	c := &config{flags: fs}
	fs.StringVar(&c.url, "server", "", "NATS URL(s) of an existing deployment (as the nats CLI's and jetlock's --server); the default starts a 3-node cluster of separate processes")
	fs.StringVar(&c.url, "s", "", "short for --server")
	fs.StringVar(&c.url, "url", "", "the old name of --server")
	fs.BoolVar(&c.auth, "auth", true, "run the bench's cluster with the least-privilege accounts of deploy/ (callers through imports, the service's two users); false: no accounts, for a service that connects without credentials (an older lockd)")
	fs.StringVar(&c.serviceMode, "service", "", "where the jetlock service runs: proc (a process of its own, measured apart), inproc (in this process), none (already deployed). The default is proc, or none with --server")
	fs.StringVar(&c.lockd, "lockd", "", "run this lockd binary as the service process (--service proc), to compare with another build. It is started with the flags every lockd takes: --url (the current lockd's hidden old name of --server), --user, --password, --store-user, --store-password (the cluster's service users; none with --auth=false), --prefix, --bucket, --metrics, --max-in-flight, --max-queued, --queue-wait, --op-timeout; and --user-rate and --tenant-rates only when set (noisy sets them), which a lockd older than fair use lacks")
	c.tune.register(fs, "service-")
	fs.IntVar(&c.instances, "instances", 1, "service instances the bench starts: with --service proc (and --lockd) as many processes of their own, each with its own metrics port and log (service.log, service-2.log...), their CPU counted together as the service's; with --service inproc in this process, each on its own connections. Two or more instances follow the bucket (each delivery of a write costs the stream leader a message per instance)")
	fs.StringVar(&c.leader, "leader", "any", "with --service inproc, the lock stream's leader: any (where JetStream put it), service (on the service's node), away (on another node)")
	fs.StringVar(&c.clients, "clients", "any", "with --service inproc, where the load connects: any (a node at random) or service (the service's node: requests cross no route)")
	fs.StringVar(&c.scenario, "scenario", "steady", "one of "+strings.Join(scenarios, ", "))
	fs.StringVar(&c.target, "target", "service", "steady, ramp and cycles: service, or raw (the same load as bare KV compare-and-set writes, no service)")
	fs.DurationVar(&c.duration, "duration", 60*time.Second, "measured duration of steady, hotlock, failover, cycles, degraded, semaphore, rolling (5m unless given), and of each phase of raw, overload (design, overload), noisy (quiet, noisy) and sets (sets, sets contended, cycles)")
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
	fs.BoolVar(&c.check, "check", true, "check the answers for double grants and tokens going backwards (not in ramp)")
	registerLoadFlags(fs, c)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./bench [flags]\n\nMeasures jetlock under the design workload and beyond. Flags:\n")
		printFlags(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	userRate, ttlSet, durationSet, modeSet, waitSet := false, false, false, false, false
	fs.Visit(func(f *flag.Flag) {
		durationSet = durationSet || f.Name == "duration"
		modeSet = modeSet || f.Name == "failover-mode"
		c.tuned = c.tuned || strings.HasPrefix(f.Name, "service-")
		c.authSet = c.authSet || f.Name == "auth"
		userRate = userRate || f.Name == "service-user-rate"
		ttlSet = ttlSet || f.Name == "ttl"
		waitSet = waitSet || f.Name == "wait"
	})
	if c.scenario == "waiters" && !waitSet {
		// The waits last the whole run: the queue, idle and beside phases.
		c.wait = 5 * time.Minute
	}
	if c.scenario == "election" && !ttlSet {
		// A killed leader's election passes on when its lease expires:
		// the TTL bounds the failover.
		c.ttl = electionTTL
	}
	if c.scenario == "rolling" {
		// A rolling restart stops each node as a deployment does.
		if !modeSet {
			c.failoverMode = "stop"
		}
		if !durationSet {
			c.duration = rollingDuration
		}
		if c.killAt == 0 {
			c.killAt = min(rollingStartAt, c.duration/3)
		}
	}
	if c.scenario == "noisy" && !userRate {
		// The flood is held to a rate, as a deployment holds every tenant,
		// and the design load's tenant, as large as the deployment, has a
		// rate of its own.
		c.tune.userRate = noisyUserRate
		if c.tune.tenantRates == "" {
			c.tune.tenantRates = devcluster.CallersAccount + "=0"
		}
	}
	return c, errors.Join(c.finishModes(), c.finishLoad())
}

// registerLoadFlags adds the flags that shape the load of the scenarios.
func registerLoadFlags(fs *flag.FlagSet, c *config) {
	fs.IntVar(&c.resources, "resources", 100_000, "lockable resources")
	fs.IntVar(&c.leases, "leases", 20_000, "leases held at once (acquired in a warm-up before measuring)")
	fs.Float64Var(&c.acquireRate, "acquire-rate", 2000, "acquires per second")
	fs.Float64Var(&c.releaseRate, "release-rate", -1, "releases per second; the default equals --acquire-rate")
	fs.Float64Var(&c.renewRate, "renew-rate", -1, "renewals per second; the default is --leases / --renew-interval")
	fs.DurationVar(&c.renewInterval, "renew-interval", 10*time.Second, "each lease is renewed about this often")
	fs.Float64Var(&c.renewJitter, "renew-jitter", 0.2, "jitter of the renew interval, as a ± fraction")
	fs.DurationVar(&c.ttl, "ttl", 30*time.Second, "lease TTL (election: 5s unless given)")
	fs.Float64Var(&c.warmupRate, "warmup-rate", 4000, "acquires per second of the unmeasured warm-up at most (and at most 256 in flight); also the clean-up release rate")
	fs.DurationVar(&c.p99Target, "p99-target", 200*time.Millisecond, "ramp and degraded: the acquire p99 to meet")
	fs.Float64Var(&c.rampStart, "ramp-start", 250, "ramp: acquire rate of the first step")
	fs.Float64Var(&c.rampStep, "ramp-step", 250, "ramp: acquire rate added each step")
	fs.Float64Var(&c.rampMax, "ramp-max", 20000, "ramp: highest acquire rate tried")
	fs.DurationVar(&c.rampStepDur, "ramp-step-duration", 10*time.Second, "ramp: duration of each step")
	fs.IntVar(&c.hotResources, "hot-resources", 10, "hotlock: contended resources; semaphore: semaphores; waiters: held locks")
	fs.IntVar(&c.waiters, "waiters", 20, "hotlock, semaphore: callers per resource (semaphore), each acquiring again as soon as it released; waiters: idle waiting acquires on each held lock (raise --service-max-waiters-per-tenant for more than 1,000 in all)")
	fs.DurationVar(&c.hold, "hold", 5*time.Millisecond, "hotlock, semaphore: how long a caller holds the lock (permit)")
	fs.DurationVar(&c.wait, "wait", 30*time.Second, "hotlock, semaphore and the contended phase of sets: wait_ms of the waiting acquires; waiters: 5m unless given, and at least twice --duration plus a minute")
	fs.StringVar(&c.wakeSubject, "wake-subject", "", "hotlock: subject to count wake messages on; the default is '<prefix>.>' minus the request and heartbeat subjects")
	fs.IntVar(&c.workers, "workers", 64, "cycles, sets, waiters: closed-loop workers, each acquiring and releasing one resource (set) after another")
	fs.IntVar(&c.rawBatch, "raw-batch", 1, "cycles --target raw: the keys each worker creates in one atomic batch (one commit), and then deletes in another: what committing the writes of several requests together would cost the cluster")
	fs.IntVar(&c.setMin, "set-min", 2, "sets: the fewest resources of a lock set (sizes are drawn at random between --set-min and --set-max)")
	fs.IntVar(&c.setMax, "set-max", 8, "sets: the most resources of a lock set")
	fs.IntVar(&c.setHot, "set-hot", 64, "sets: the resources the contended phase draws its sets from (acquired with wait_ms --wait)")
	fs.IntVar(&c.limit, "limit", 5, "semaphore: permits of each semaphore")
	fs.IntVar(&c.candidates, "candidates", 3, "election: candidates, each on a connection of its own")
	fs.IntVar(&c.rounds, "rounds", 5, "election: rounds, each killing the leader (its connection closed, no release) and then making the next one resign")
	fs.DurationVar(&c.killAt, "kill-at", 0, "failover: when to stop the stream leader; the default is a third of --duration. rolling: when the first restart begins; the default is 15s")
	fs.DurationVar(&c.restartAfter, "restart-after", 15*time.Second, "failover: restart the stopped node this long after the stop (or when it has exited, if later); 0 never")
	fs.StringVar(&c.failoverMode, "failover-mode", "kill", "failover: kill (SIGKILL the leader's process), stop (stop it as deploy/ does: the pre-stop step of --pre-stop, then SIGUSR2, lame duck mode with deploy/nats/common.conf's settings), term (SIGTERM: a shutdown without lame duck mode) or stepdown (ask the leader to step down; works with --server). rolling: how each node is stopped, stop (the default), term or kill")
	fs.StringVar(&c.preStop, "pre-stop", "handover", "failover and rolling with --failover-mode stop: what runs before a node enters lame duck mode: handover (deploy/'s pre-stop step, lockd handover: if the node leads the lock stream, its most current replica takes over first) or none (lame duck mode alone, the server's own step-down)")
	fs.DurationVar(&c.settle, "settle", 0, "rolling: after each restart is back (a node's replica current, an instance ready), wait this long before the next restart, counting what the load sees meanwhile toward that restart; 0: the request timeout, so that every request sent meanwhile has its answer")
	fs.StringVar(&c.restart, "restart", "all", "rolling: what to restart in turn: nodes (the three NATS servers), services (each lockd instance; needs --instances 2 or more) or all (the nodes, then the services)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench process (load generator and, with --service inproc, the service) to this file")
	fs.StringVar(&c.memProfile, "memprofile", "", "write an allocation profile of the bench process to this file at the end")
	fs.StringVar(&c.profileDir, "profile", "", "write CPU and heap profiles of the service the bench starts, for the whole run, into this directory (created if missing): service.cpu.pprof and service.heap.pprof (the heap as the service ends, with every allocation of the run) for --service proc, of the first process only with --instances above 1; with --service inproc the bench process's, bench.cpu.pprof and bench.heap.pprof, which hold the service and the load generator together. With the bench's own cluster, also each node's CPU profile for each measured phase of a scheduled length, <node>.<n>-<phase>.cpu.pprof. Read them with go tool pprof")
	fs.Float64Var(&c.carriedRate, "carried-rate", 0, "overload: the acquire rate the deployment carries at the design mix, as --scenario ramp reports it; 0: the overload scenario runs that ramp first to find it")
	fs.Float64Var(&c.overloadFactor, "overload-factor", 3, "overload: acquires (and releases in the design proportion) at this many times --carried-rate, beside the design load's renewals")
	fs.IntVar(&c.sessions, "sessions", 0, "steady (and the service's steady phase of raw and all): after the design load with each lease renewed on its own, run it again with the same leases and acquire and release rates spread over this many sessions, opened before and closed after, each kept alive every TTL/3 (± --renew-jitter) instead of renewing each lease, and compare the two: raft commits, stream messages and writes, errors, acquire latency")
	fs.DurationVar(&c.sessionsPause, "sessions-pause", -time.Second, "with --sessions: the longest wait between the two modes for the first mode's delete markers to expire (they expire a retry window after their release, and expiring costs the nodes work the first mode did not bear); negative: the stream's duplicate window (the retry window) plus 30s; 0: none")
	fs.Float64Var(&c.floodRate, "flood-rate", 5000, "noisy: requests per second of the flooding tenant (user app of account APP: cancels of random request ids, renewals and releases of bogus lease ids, list pages of 1,000, 2s waits on resources it holds); unless --service-user-rate is set, the service holds every tenant to 500 a second and the design load's account, CALLERS, to none (--service-tenant-rates CALLERS=0)")
}

// printFlags prints the flags as the other commands do, with two dashes
// (flag.PrintDefaults prints one; the bench takes both).
func printFlags(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		dash := "--"
		if len(f.Name) == 1 {
			dash = "-"
		}
		line := "  " + dash + f.Name
		if name != "" {
			line += " " + name
		}
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(fs.Output(), "%s\n    \t%s\n", line, usage)
	})
}

// finishModes fills in where the service runs and refuses combinations
// that cannot work.
func (c *config) finishModes() error {
	if c.serviceMode == "" {
		c.serviceMode = "proc"
		if c.url != "" && c.lockd == "" {
			c.serviceMode = "none"
		}
	}
	own := c.url == ""
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(!slices.Contains(scenarios, c.scenario), "unknown scenario %q (want one of %s)", c.scenario, strings.Join(scenarios, ", "))
	check(c.target != "service" && c.target != "raw", "--target %q: want service or raw", c.target)
	check(!slices.Contains([]string{"inproc", "proc", "none"}, c.serviceMode), "--service %q: want proc, inproc or none", c.serviceMode)
	check(c.lockd != "" && c.serviceMode != "proc", "--lockd runs the service as a process: it needs --service proc")
	check(c.profileDir != "" && (c.lockd != "" || c.serviceMode == "none"),
		"--profile profiles the service the bench runs itself: it needs --service proc or inproc, without --lockd (a lockd serves its profiles with --metrics and --pprof)")
	check(c.profileDir != "" && c.serviceMode == "inproc" && (c.cpuProfile != "" || c.memProfile != ""),
		"--profile with --service inproc writes the bench process's profiles itself: leave out --cpuprofile and --memprofile")
	check(!slices.Contains([]string{"any", "service", "away"}, c.leader), "--leader %q: want any, service or away", c.leader)
	check(c.clients != "any" && c.clients != "service", "--clients %q: want any or service", c.clients)
	check(c.serviceMode != "inproc" && (c.clients != "any" || c.leader != "any"),
		"--clients and --leader other than any need --service inproc (the bench knows only that service's node)")
	check(own && c.serviceMode == "none", "--service none needs --server")
	check(!own && c.authSet, "--auth applies to the bench's own cluster, not to --server")
	check(c.tuned && c.serviceMode == "none", "the --service-* flags tune the service the bench starts; with --service none set them on lockd")
	check(c.instances < 1 || (c.instances > 1 && c.serviceMode == "none"), "--instances %d: want 1, or more with --service proc or inproc (the bench starts them)", c.instances)
	check(!own && (c.scenario == "degraded" || c.scenario == "rolling" || c.scenario == "failover" && c.failoverMode != "stepdown"),
		"%s stops nodes: it needs the bench's own cluster (failover also runs with --failover-mode stepdown)", c.scenario)
	check(!slices.Contains([]string{"kill", "stepdown", "stop", "term"}, c.failoverMode),
		"--failover-mode %q: want kill, stepdown, stop or term", c.failoverMode)
	check(c.scenario == "rolling" && c.failoverMode == "stepdown", "rolling restarts nodes: --failover-mode stop, term or kill")
	check(!slices.Contains([]string{"handover", "none"}, c.preStop), "--pre-stop %q: want handover or none", c.preStop)
	check(!slices.Contains([]string{"all", "nodes", "services"}, c.restart), "--restart %q: want all, nodes or services", c.restart)
	check(c.scenario == "rolling" && c.restart == "services" && c.instances < 2, "--restart services restarts each lockd instance in turn: give --instances 2 or more")
	check(c.scenario == "noisy" && (!own || !c.auth), "noisy floods as a tenant of the bench's own cluster's accounts: it needs no --server and --auth")
	check(c.carriedRate < 0 || c.overloadFactor <= 0 || c.floodRate <= 0, "--carried-rate must not be negative, --overload-factor and --flood-rate must be positive")
	check(c.sessions < 0, "--sessions must not be negative")
	check(c.sessions > 0 && (!slices.Contains([]string{"steady", "raw", "all"}, c.scenario) || c.target != "service"),
		"--sessions runs the steady design load against the service a second time in sessions: it needs --scenario steady, raw or all, and --target service")
	errs = append(errs, c.checkShapes()...)
	if _, err := c.tune.rates(); err != nil {
		errs = append(errs, err)
	}
	if err := c.tune.config(service.DefaultConfig()).Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkShapes checks the flags of the sets, semaphore and election
// scenarios.
func (c *config) checkShapes() []error {
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	shaped := slices.Contains([]string{"sets", "semaphore", "election"}, c.scenario)
	check(shaped && c.target != "service", "%s runs against the service: it needs --target service", c.scenario)
	// The service the bench starts allows sets of its default size at
	// most (lockd --max-set-size); a deployment may allow up to the
	// contract's bound.
	maxSet := streams.DefaultSetSize
	if c.url != "" {
		maxSet = streams.MaxSetSize
	}
	check(c.setMin < streams.MinSetSize || c.setMax < c.setMin || c.setMax > maxSet,
		"--set-min %d, --set-max %d: want %d <= --set-min <= --set-max <= %d", c.setMin, c.setMax, streams.MinSetSize, maxSet)
	check(c.setHot < c.setMax, "--set-hot %d: the contended sets are drawn from it, so it must be at least --set-max (%d)", c.setHot, c.setMax)
	check(c.scenario == "sets" && c.workers > 0 && c.resources/c.workers < c.setMax,
		"sets: each of --workers %d draws its uncontended sets from its own share of --resources %d, which must hold --set-max %d", c.workers, c.resources, c.setMax)
	check(c.limit < 1 || c.limit > streams.MaxLimit, "--limit %d: want 1 to %d permits", c.limit, streams.MaxLimit)
	check(c.candidates < 2, "--candidates %d: an election needs at least 2, one to take over", c.candidates)
	check(c.rounds < 1, "--rounds %d: want at least 1", c.rounds)
	check(c.scenario == "election" && c.ttl < time.Second, "election: --ttl %v is below the service's minimum TTL, 1s", c.ttl)
	check((c.scenario == "sets" || c.scenario == "semaphore") && (c.wait <= 0 || c.wait > 5*time.Minute),
		"%s: --wait %v: want wait_ms above 0 and at most 5m (the service's bound)", c.scenario, c.wait)
	check(c.scenario == "waiters" && (c.wait < 2*c.duration+time.Minute || c.wait > 5*time.Minute),
		"waiters: --wait %v: the waits last the run, want at least twice --duration (%v) plus a minute, and at most 5m (the service's bound)", c.wait, c.duration)
	check(c.scenario == "waiters" && c.target != "service", "waiters runs against the service: it needs --target service")
	return errs
}

// finishLoad fills in the derived rates and checks the load's shape.
func (c *config) finishLoad() error {
	if c.releaseRate < 0 {
		c.releaseRate = c.acquireRate
	}
	if c.renewRate < 0 && c.renewInterval > 0 {
		c.renewRate = float64(c.leases) / c.renewInterval.Seconds()
	}
	if c.killAt == 0 {
		c.killAt = c.duration / 3
	}
	switch {
	case c.resources < 1 || c.leases < 0 || c.leases > c.resources:
		return fmt.Errorf("need 0 <= --leases (%d) <= --resources (%d)", c.leases, c.resources)
	case c.duration <= 0 || c.timeout <= 0 || c.ttl <= 0 || c.renewInterval <= 0:
		return errors.New("durations must be positive")
	case c.conns < 1 || c.maxInFlight < 1 || c.workers < 1:
		return errors.New("--conns, --max-inflight and --workers must be at least 1")
	case c.rawBatch < 1 || c.rawBatch > 1000:
		return errors.New("--raw-batch must lie within 1..1000 (a stream's atomic batch holds at most 1,000 messages)")
	case c.rawBatch > 1 && (c.scenario != "cycles" || c.target != "raw"):
		return errors.New("--raw-batch is for --scenario cycles --target raw")
	case c.rawBatch > 1 && c.resources/c.workers < 2*c.rawBatch:
		return fmt.Errorf("--raw-batch %d: each of --workers %d draws from its own share of --resources %d, which must hold twice the batch", c.rawBatch, c.workers, c.resources)
	case c.acquireRate < 0 || c.renewRate < 0 || c.releaseRate < 0 || c.warmupRate <= 0:
		return errors.New("rates must not be negative (warm-up rate positive)")
	case c.rampStart <= 0 || c.rampStep <= 0 || c.rampMax < c.rampStart:
		return errors.New("ramp: need 0 < --ramp-start <= --ramp-max and --ramp-step > 0")
	case c.hotResources < 1 || c.waiters < 1:
		return errors.New("hotlock: need at least one resource and one waiter")
	case c.settle < 0:
		return errors.New("--settle must not be negative")
	case c.killAt >= c.duration:
		return fmt.Errorf("--kill-at %v must lie within --duration %v", c.killAt, c.duration)
	}
	return nil
}

// reported names the flags that shape the run, for the reports; the
// service's tuning too when the bench runs the service.
var reported = strings.Fields(`duration resources leases acquire-rate release-rate renew-rate renew-interval
	renew-jitter ttl timeout conns p99-target ramp-start ramp-step ramp-step-duration hot-resources waiters
	hold wait service target retries failover-mode leader clients instances workers raw-batch carried-rate overload-factor
	flood-rate sessions sessions-pause set-min set-max set-hot limit candidates rounds`)

// settings lists the reported flags' values (the derived ones as
// finishModes and finishLoad filled them in), with "_" for "-".
func (c *config) settings() map[string]string {
	m := map[string]string{"auth": fmt.Sprint(c.auth && c.url == "")}
	names := slices.Clone(reported)
	if c.lockd != "" {
		names = append(names, "lockd")
	}
	if c.serviceMode != "none" {
		names = append(names, "service-max-in-flight", "service-max-queued", "service-queue-wait", "service-op-timeout",
			"service-user-rate", "service-tenant-rates", "service-max-waiters-per-resource", "service-max-waiters-per-tenant")
	}
	for _, name := range names {
		m[strings.ReplaceAll(name, "-", "_")] = c.flags.Lookup(name).Value.String()
	}
	return m
}

// tuning is the service's overload settings the bench can change, with
// lockd's flag names: the bench registers them with a "service-" prefix,
// the service process without.
type tuning struct {
	maxInFlight, maxQueued int
	queueWait, opTimeout   time.Duration
	userRate               float64
	tenantRates            string // lockd's --tenant-rates: TENANT=RATE;...
	// The waiter caps (lockd --max-waiters-per-resource, -per-tenant).
	maxWaitersPerResource, maxWaitersPerTenant int
}

// register adds the settings' flags to fs, each prefixed, with the
// service's defaults.
func (t *tuning) register(fs *flag.FlagSet, prefix string) {
	d := service.DefaultConfig()
	fs.IntVar(&t.maxInFlight, prefix+"max-in-flight", d.MaxInFlight, "service: requests processed at once (lockd --max-in-flight)")
	fs.IntVar(&t.maxQueued, prefix+"max-queued", d.MaxQueued, "service: requests waiting for a place (lockd --max-queued)")
	fs.DurationVar(&t.queueWait, prefix+"queue-wait", d.QueueWait, "service: how long a request may wait for a place (lockd --queue-wait)")
	fs.DurationVar(&t.opTimeout, prefix+"op-timeout", d.OpTimeout, "service: store work bound; a request's budget is --queue-wait plus this (lockd --op-timeout)")
	fs.Float64Var(&t.userRate, prefix+"user-rate", d.UserRate, "service: fair use, operations a second per tenant by cost (lockd --user-rate; 0: off)")
	fs.StringVar(&t.tenantRates, prefix+"tenant-rates", "", "service: tenants' own rates, TENANT=RATE;... (lockd --tenant-rates)")
	fs.IntVar(&t.maxWaitersPerResource, prefix+"max-waiters-per-resource", d.MaxWaitersPerResource, "service: waiting acquires one resource may queue (lockd --max-waiters-per-resource)")
	fs.IntVar(&t.maxWaitersPerTenant, prefix+"max-waiters-per-tenant", d.MaxWaitersPerTenant, "service: waiting acquires one tenant may have queued (lockd --max-waiters-per-tenant)")
}

// rates returns the tenants' own rates of --tenant-rates.
func (t tuning) rates() (map[string]float64, error) {
	if t.tenantRates == "" {
		return nil, nil
	}
	m := map[string]float64{}
	for _, kv := range strings.Split(t.tenantRates, ";") {
		k, v, ok := strings.Cut(kv, "=")
		r, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("tenant rate %q: want TENANT=RATE", kv)
		}
		m[k] = r
	}
	return m, nil
}

// config returns cfg with the settings; finishModes (before the cluster
// starts) and service.New validate them.
func (t tuning) config(cfg service.Config) service.Config {
	cfg.MaxInFlight, cfg.MaxQueued, cfg.QueueWait, cfg.OpTimeout = t.maxInFlight, t.maxQueued, t.queueWait, t.opTimeout
	cfg.UserRate = t.userRate
	cfg.TenantRates, _ = t.rates() // checked by finishModes
	cfg.MaxWaitersPerResource, cfg.MaxWaitersPerTenant = t.maxWaitersPerResource, t.maxWaitersPerTenant
	return cfg
}

// args returns the flags that pass the settings to a service process, in
// lockd's spelling.
func (t tuning) args() []string {
	args := []string{"--max-in-flight", strconv.Itoa(t.maxInFlight), "--max-queued", strconv.Itoa(t.maxQueued),
		"--queue-wait", t.queueWait.String(), "--op-timeout", t.opTimeout.String()}
	// Only when set: a lockd older than fair use (or than tenants' own
	// rates) has no such flag, and its default is none.
	if t.userRate > 0 {
		args = append(args, "--user-rate", strconv.FormatFloat(t.userRate, 'f', -1, 64))
	}
	if t.tenantRates != "" {
		args = append(args, "--tenant-rates", t.tenantRates)
	}
	if d := service.DefaultConfig(); t.maxWaitersPerResource != d.MaxWaitersPerResource || t.maxWaitersPerTenant != d.MaxWaitersPerTenant {
		args = append(args, "--max-waiters-per-resource", strconv.Itoa(t.maxWaitersPerResource),
			"--max-waiters-per-tenant", strconv.Itoa(t.maxWaitersPerTenant))
	}
	return args
}
