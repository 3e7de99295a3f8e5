// Command bench measures a jetlock deployment: how many locks it holds, at
// what latency, what each operation costs in CPU, how it behaves when a
// node dies or is down, and when many callers wait for one lock.
//
// With no flags it starts a three-node NATS cluster of its own, each node a
// separate process (this binary re-executed, see internal/devcluster), with
// fsync after every write and the least-privilege accounts of deploy/,
// starts the jetlock service in a process of its own, and runs the design
// workload for a minute: 100,000 resources, 20,000 leases held and renewed
// every 10s, 2,000 acquires and 2,000 releases a second. With --server it
// measures an existing deployment instead.
//
// Load is open-loop: each operation has an intended send time on a fixed
// schedule, and its latency is measured from that time, so a stall shows
// as latency rather than as a quietly lower rate (no coordinated omission).
//
// Scenarios (--scenario): steady, ramp, raw, all, hotlock, failover,
// cycles, degraded, overload, noisy, sets, semaphore, election, rolling,
// waiters. See
// README.md in this directory.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/jetlock/jetlock/bench/internal/load"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
)

var runners = map[string]func(context.Context, *env, *Summary) error{
	"steady": runSteady, "ramp": runRamp, "raw": runRaw, "all": runAll, "hotlock": runHotlock,
	"failover": runFailover, "cycles": runCycles, "degraded": runDegraded,
	"overload": runOverload, "noisy": runNoisy, "sets": runSets, "semaphore": runSemaphore, "election": runElection,
	"rolling": runRolling,
	"waiters": runWaiters,
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case devcluster.NodeCommand:
			os.Exit(devcluster.NodeMain())
		case cmdService:
			os.Exit(serviceMain(os.Args[2:]))
		}
	}
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := profiled(cfg, func() error { return run(ctx, cfg) }); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

// profiled runs f under the profiles the flags ask for: the bench
// process's, into --cpuprofile and --memprofile, or with --profile and
// --service inproc into that directory (the service runs in this
// process). With --service proc, the service process writes its own (see
// serviceProfiles).
func profiled(cfg *config, f func() error) error {
	cpu, mem, kind := cfg.cpuProfile, cfg.memProfile, "allocs"
	if cfg.profileDir != "" && cfg.serviceMode == "inproc" {
		cpu, mem, kind = filepath.Join(cfg.profileDir, "bench.cpu.pprof"), filepath.Join(cfg.profileDir, "bench.heap.pprof"), "heap"
	}
	err := withProfiles(cpu, mem, kind, f)
	if cfg.profileDir != "" {
		// The service process wrote its profiles as it stopped, when the
		// run ended.
		files, _ := filepath.Glob(filepath.Join(cfg.profileDir, "*.pprof"))
		fmt.Printf("profiles (go tool pprof): %s\n", strings.Join(files, " "))
	}
	return err
}

// withProfiles runs f with a CPU profile written to cpu, and then writes
// the memory profile of kind ("allocs" or "heap": the same samples, read
// by default as allocations or as what is in use) to mem; an empty path
// leaves that profile out. Their directories are made if missing.
func withProfiles(cpu, mem, kind string, f func() error) error {
	create := func(path string) (*os.File, error) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		return os.Create(path)
	}
	if cpu != "" {
		out, err := create(cpu)
		if err == nil {
			err = pprof.StartCPUProfile(out)
		}
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer func() {
			pprof.StopCPUProfile()
			out.Close()
		}()
	}
	err := f()
	if mem != "" {
		out, perr := create(mem)
		if perr == nil {
			perr = errors.Join(pprof.Lookup(kind).WriteTo(out, 0), out.Close())
		}
		err = errors.Join(err, perr)
	}
	return err
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
	if e.svc != nil {
		sum.Machine.ServiceServer = e.svc.node()
	}
	sum.Machine.StreamLeader, _ = e.streamLeader(ctx)
	if sum.Machine.ServiceServer != "" && sum.Machine.StreamLeader != "" {
		fmt.Fprintf(e.out, "placement: service connected to %s, lock stream led by %s\n", sum.Machine.ServiceServer, sum.Machine.StreamLeader)
	}
	serr := runners[cfg.scenario](ctx, e, sum)
	if ctx.Err() != nil {
		sum.Notes = append(sum.Notes, "interrupted: the figures cover only the part that ran")
	}
	sum.ErrorMessages = load.ErrorSamples()
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
