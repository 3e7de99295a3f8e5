package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jetlock/jetlock/bench/internal/load"
)

// newEnv starts the bench's environment of args (a small load) and stops
// it when the test ends.
func newEnv(t *testing.T, args ...string) (context.Context, *env, *Summary) {
	t.Helper()
	base := []string{"--data-dir", t.TempDir(), "--progress", "0", "--resources", "2000", "--leases", "200",
		"--acquire-rate", "100", "--duration", "2s", "--timeout", "5s", "--warmup-rate", "1000"}
	cfg, err := parseFlags(append(base, args...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	e, err := setup(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.out = io.Discard
	t.Cleanup(e.close)
	return ctx, e, &Summary{Scenario: cfg.scenario, Settings: cfg.settings()}
}

// The bench's own cluster runs the least-privilege model: the load reaches
// the service process as callers, through the import, and the closed loop
// of cycles runs against it, against the bare KV as the store user, and
// so does hotlock's waiting.
func TestCyclesAndHotlockOnTheLeastPrivilegeCluster(t *testing.T) {
	ctx, e, sum := newEnv(t, "--workers", "8", "--hot-resources", "2", "--waiters", "3", "--wait", "2s")
	if e.cluster.Open() || e.svc.proc == nil {
		t.Fatal("want the accounts and a service process by default")
	}
	if err := runCycles(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	if c := sum.Cycles; c == nil || c.Cycles == 0 || c.Target != "service" || sum.Ops[load.OpCycle].Count != c.Cycles {
		t.Fatalf("service cycles %+v", c)
	}
	if sum.Safety == nil || sum.Safety.Grants == 0 {
		t.Fatalf("cycles not checked for double grants: %+v", sum.Safety)
	}
	if cpu := sum.CPU; cpu == nil || cpu.Answered < 2*sum.Cycles.Cycles || cpu.ServiceProcess != "service" {
		t.Fatalf("cpu per op %+v", cpu)
	}

	e.cfg.target = "raw"
	if err := runCycles(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	if c := sum.Cycles; c.Cycles == 0 || c.Target != "raw" {
		t.Fatalf("raw cycles %+v", c)
	}

	e.cfg.target = "service"
	if err := runHotlock(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	if h := sum.Hotlock; h.Grants == 0 || h.HolderOverlaps != 0 {
		t.Fatalf("hotlock %+v", h)
	}
}

// degraded stops a replica that does not lead the lock stream, runs the
// load, and restarts it.
func TestDegraded(t *testing.T) {
	ctx, e, sum := newEnv(t, "--scenario", "degraded")
	if err := runDegraded(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	d := sum.Degraded
	if d == nil || d.StoppedNode == "" || d.StoppedNode == d.StreamLeader || d.Commits == 0 || d.BlocksMB[1] == 0 {
		t.Fatalf("degraded %+v", d)
	}
	if sum.Ops[load.OpAcquire].Answered() == 0 || d.P99TargetMs != 200 {
		t.Fatalf("acquires %+v, target %v", sum.Ops[load.OpAcquire], d.P99TargetMs)
	}
	if i := e.cluster.Node(d.StoppedNode); e.cluster.PID(i) == 0 {
		t.Fatalf("%s not restarted: %s", d.StoppedNode, d.Note)
	}
}

// --clients service connects every load connection to the node the
// in-process service is connected to, so that requests and replies cross
// no route.
func TestClientsServiceConnectsTheLoadToTheServiceNode(t *testing.T) {
	_, e, _ := newEnv(t, "--service", "inproc", "--clients", "service", "--conns", "4")
	want := e.svc.node()
	for i, nc := range e.conns {
		if got := nc.ConnectedServerName(); got != want {
			t.Errorf("load connection %d on %s, the service on %s", i, got, want)
		}
	}
}

// overload runs the design load, then acquires and releases at
// --overload-rate beside the same renewals, and reports the renewals lost
// and the acquires shed from the answers of the overload phase.
func TestOverload(t *testing.T) {
	ctx, e, sum := newEnv(t, "--scenario", "overload", "--overload-rate", "400")
	if err := runOverload(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	o := sum.Overload
	if o == nil || o.OverloadAcquireRate != 400 || o.Leases != 200 || o.RenewBudgetMs != 20000 {
		t.Fatalf("overload %+v", o)
	}
	ren, acq := sum.Ops[load.OpRenew], sum.Ops[load.OpAcquire]
	if ren.Count == 0 || acq.Count == 0 || o.AcquiresGranted+acq.Errors != acq.Count || o.RenewalsLost != ren.ErrorsByCode["lease_lost"] {
		t.Fatalf("overload %+v from renewals %+v and acquires %+v", o, ren, acq)
	}
	if len(sum.Phases) != 3 || sum.Phases[2].Name != "overload" || sum.Phases[2].Rates[load.OpAcquire] != 400 {
		t.Fatalf("phases %+v", sum.Phases)
	}
}

// noisy floods from a tenant of its own (account APP) held to a small rate
// while the design load's tenant (account CALLERS) has none: the flood is
// answered, partly refused for fair use with retry_after_ms, and the
// design load's requests are not refused for it.
func TestNoisy(t *testing.T) {
	ctx, e, sum := newEnv(t, "--scenario", "noisy", "--flood-rate", "400")
	if e.cfg.tune.userRate != noisyUserRate || e.cfg.tune.tenantRates != "CALLERS=0" {
		t.Fatalf("noisy's service rates: %v, %q", e.cfg.tune.userRate, e.cfg.tune.tenantRates)
	}
	if err := runNoisy(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	n := sum.Noisy
	if n == nil || n.FloodRate != 400 || len(n.Flood) == 0 {
		t.Fatalf("noisy %+v", n)
	}
	var answered, refused int64
	for op, byCode := range n.Flood {
		for code, c := range byCode {
			answered += c
			if code == "unavailable" {
				refused += c
			}
			if code == "timeout" || code == "backlog" {
				t.Errorf("the flood's %s got %d %s", op, c, code)
			}
		}
	}
	if answered < 400 || refused == 0 {
		t.Fatalf("the flood: %d answered, %d refused for fair use: %v", answered, refused, n.Flood)
	}
	if n.Quiet.Errors != 0 || n.Noisy.Errors != 0 || n.Noisy.LeasesLost != 0 || n.Quiet.AcquireP99 == 0 || n.Noisy.AcquireP99 == 0 {
		t.Fatalf("the design load's tenant: quiet %+v, noisy %+v", n.Quiet, n.Noisy)
	}
}
