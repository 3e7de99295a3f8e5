package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

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
	if e.cluster.Open() || len(e.svc.procs) != 1 {
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
	// --raw-batch 4: every four keys created in one atomic batch, and
	// deleted in another; a batch counts as four of each operation.
	e.cfg.rawBatch = 4
	if err := runCycles(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	if c := sum.Cycles; c.Cycles == 0 || c.Cycles%4 != 0 || c.Errors != 0 || sum.Ops[load.OpAcquire].Count != c.Cycles {
		t.Fatalf("raw batched cycles %+v, acquires %+v, releases %+v", c, sum.Ops[load.OpAcquire], sum.Ops[load.OpRelease])
	}
	e.cfg.rawBatch = 1

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

// overload finds the carried rate with a short ramp, runs the design load,
// then acquires and releases at three times that rate beside the same
// renewals, and reports from the answers of each phase.
func TestOverload(t *testing.T) {
	ctx, e, sum := newEnv(t, "--scenario", "overload", "--ramp-start", "50", "--ramp-step", "50", "--ramp-max", "100",
		"--ramp-step-duration", "1s", "--p99-target", "2s")
	if err := runOverload(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	o := sum.Overload
	if o == nil || o.CarriedFrom != "ramp" || o.CarriedRate == 0 || o.CarriedRate != sum.Ramp.MaxAcquireRate ||
		o.AcquireRate != 3*o.CarriedRate || o.RenewBudgetMs != 20000 || o.Leases == 0 {
		t.Fatalf("overload %+v, ramp %+v", o, sum.Ramp)
	}
	ren, acq := sum.Ops[load.OpRenew], sum.Ops[load.OpAcquire]
	f := o.Overload
	if f.Renewals == 0 || f.Renewals != ren.Count || f.RenewP99 != ren.P99 || f.Acquires == 0 || f.Acquires != acq.Count ||
		f.AcquiresGranted+acq.Errors != acq.Count || f.AcquireP99 != acq.P99 || f.LeasesLost != f.LostAnswered+f.LostExpired {
		t.Fatalf("overload figures %+v from renewals %+v and acquires %+v", f, ren, acq)
	}
	if (sum.Ramp.StoppedBy == rampMaxReached) != (o.Note != "") {
		t.Fatalf("ramp stopped by %q, note %q", sum.Ramp.StoppedBy, o.Note)
	}
	if o.Design.Renewals == 0 || o.Design.Acquires == 0 {
		t.Fatalf("design figures %+v", o.Design)
	}
	last := sum.Phases[len(sum.Phases)-1]
	if last.Name != "overload" || last.Rates[load.OpAcquire] != o.AcquireRate || sum.Phases[len(sum.Phases)-2].Name != "design" {
		t.Fatalf("phases end with %s at %v", last.Name, last.Rates)
	}
	if sum.Safety == nil || sum.Safety.Grants == 0 || sum.Safety.Violations != 0 {
		t.Fatalf("safety %+v", sum.Safety)
	}
}

// --carried-rate (given, the scenario runs no ramp) must not be negative,
// --overload-factor and --flood-rate positive; noisy needs the bench's own
// cluster with its accounts; --sessions runs only with the steady design
// load against the service.
func TestOverloadFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--scenario", "overload", "--carried-rate", "700", "--overload-factor", "2.5"})
	if err != nil || cfg.carriedRate != 700 || cfg.overloadFactor != 2.5 {
		t.Fatalf("flags: %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{{"--carried-rate", "-1"}, {"--overload-factor", "0"}, {"--flood-rate", "0"},
		{"--scenario", "noisy", "--auth=false"}, {"--scenario", "noisy", "--server", "nats://a:4222"},
		{"--sessions", "-1"}, {"--sessions", "10", "--scenario", "hotlock"}, {"--sessions", "10", "--target", "raw"},
		{"--profile", "p", "--lockd", "/bin/lockd"}, {"--profile", "p", "--server", "nats://a:4222"},
		{"--profile", "p", "--service", "inproc", "--cpuprofile", "c"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// noisy floods from a tenant of its own (user app of account APP) held to
// a small rate while the design load's tenant (user caller of account
// CALLERS) has none: every kind of flood request is answered, part of them
// refused for fair use, and the design load's requests are not refused
// for it: the service told the two apart.
func TestNoisy(t *testing.T) {
	// Phases of 4s: the flood of 400 a second offers four times the 400
	// answers asked for below, however busy the machine.
	ctx, e, sum := newEnv(t, "--scenario", "noisy", "--flood-rate", "400", "--duration", "4s")
	if e.cfg.tune.userRate != noisyUserRate || e.cfg.tune.tenantRates != "CALLERS=0" {
		t.Fatalf("noisy's service rates: %v, %q", e.cfg.tune.userRate, e.cfg.tune.tenantRates)
	}
	if err := runNoisy(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	n := sum.Noisy
	if n == nil || n.FloodRate != 400 || n.HonestTenant != "CALLERS/caller" || n.FloodTenant != "APP/app" || n.UserRate != "500" {
		t.Fatalf("noisy %+v", n)
	}
	for _, op := range floodOps {
		if len(n.Flood[op]) == 0 {
			t.Errorf("the flood's %s got no answer: %v", op, n.Flood)
		}
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
	if n.Quiet.Errors != 0 || n.Noisy.Errors != 0 || n.Noisy.LeasesLost != 0 || n.Quiet.Acquires == 0 || n.Noisy.Acquires == 0 ||
		n.Quiet.Renewals == 0 || n.Noisy.Renewals == 0 || n.Quiet.AcquireP99 == 0 || n.Noisy.AcquireP99 == 0 {
		t.Fatalf("the design load's tenant: quiet %+v, noisy %+v", n.Quiet, n.Noisy)
	}
	if n.AcquireP99Ratio != ratio(n.Noisy.AcquireP99, n.Quiet.AcquireP99) || n.RenewP50Ratio != ratio(n.Noisy.RenewP50, n.Quiet.RenewP50) {
		t.Fatalf("ratios %+v", n)
	}
}

// --sessions runs the design load with each lease renewed, then the same
// leases, acquires and releases in sessions kept alive instead, in one
// run, and counts both modes' replicated commits from the lock stream's
// raft log. The renewals are made heavy (every 2s, TTL 6s) so that a
// session's one keepalive for its ten leases shows in the commits; the
// pause for the first mode's delete markers is left out.
func TestSteadyWithSessions(t *testing.T) {
	ctx, e, sum := newEnv(t, "--sessions", "20", "--leases", "200", "--acquire-rate", "50", "--ttl", "6s",
		"--renew-interval", "2s", "--duration", "3s", "--sessions-pause", "0")
	if err := runSteady(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	s := sum.Sessions
	if s == nil {
		t.Fatal("no sessions result")
	}
	if s.Opened != 20 || s.Session.LeasesHeld != 200 || s.LeasesPerSession != 10 || s.KeepaliveEveryS != 2 {
		t.Fatalf("sessions %+v", s)
	}
	// Leases were held in the sessions across the phase: closing them
	// released every one held then.
	if s.HeldAtClose < 100 || s.ClosedReleased != int64(s.HeldAtClose) {
		t.Fatalf("%d leases held at the close, %d released by it", s.HeldAtClose, s.ClosedReleased)
	}
	var ph *phase
	for _, x := range sum.Phases {
		if x.Name == "sessions" {
			ph = x
		}
	}
	if ph == nil || ph.Ops[load.OpKeepalive].Count == 0 || ph.Ops[load.OpRenew].Count != 0 || !ph.RaftRead {
		t.Fatalf("session phase %+v", ph)
	}
	// A lone instance grants to a session in a batch with a check
	// message: its batch commits of kind grant are the check messages.
	p, q := s.PerLease, s.Session
	if q.Errors != 0 || q.LeasesLost != 0 || q.Granted == 0 || p.CheckMsgs != 0 || p.Errors != 0 ||
		!s.ServiceRead || q.CheckMsgs == 0 || q.CheckMsgs != ph.ServiceCommits["grant"] {
		t.Fatalf("per-lease %+v, session %+v (service commits %v)", p, q, ph.ServiceCommits)
	}
	if p.ClusterUsPerOp == 0 || q.ClusterUsPerOp == 0 || p.ServiceUsPerOp == 0 || q.ServiceUsPerOp == 0 ||
		s.ClusterCPURatio != ratio(q.ClusterUsPerOp, p.ClusterUsPerOp) || s.ServiceCPURatio != ratio(q.ServiceUsPerOp, p.ServiceUsPerOp) {
		t.Fatalf("cpu per op: per-lease %+v, session %+v, ratios %v %v", p, q, s.ClusterCPURatio, s.ServiceCPURatio)
	}
	if !s.RaftRead || p.RaftCommits == 0 || q.RaftCommits == 0 || p.StreamMsgs == 0 || q.StreamMsgs < q.CheckMsgs {
		t.Fatalf("commits: raft read %v, per-lease %+v, session %+v", s.RaftRead, p, q)
	}
	// A raft commit is an append of the raft group: never more than the
	// stream's messages (a session grant's atomic batch of two messages
	// is one).
	if p.RaftCommitsPerSec > 1.1*p.StreamMsgsPerSec || q.RaftCommitsPerSec > 1.1*q.StreamMsgsPerSec {
		t.Fatalf("more raft commits than messages: per-lease %+v, session %+v", p, q)
	}
	// A session's keepalive stands for its ten leases' renewals: fewer
	// writes per grant. (Raft appends are not compared: an append carries
	// as many proposals as arrived during the last round, so their number
	// follows the machine's speed, not the writes; the bench reports them.)
	if q.WritesPerGrant >= p.WritesPerGrant {
		t.Fatalf("per grant: raft commits %v in sessions, %v per lease; writes %v, %v (%v %% fewer raft commits/s)",
			q.RaftCommitsPerGrant, p.RaftCommitsPerGrant, q.WritesPerGrant, p.WritesPerGrant, s.RaftCommitsReductionPct)
	}
	if sum.Safety == nil || sum.Safety.Grants == 0 || sum.Safety.Violations != 0 {
		t.Fatalf("safety %+v", sum.Safety)
	}
}

// logSummary logs the summary's text (go test -v shows it).
func logSummary(t *testing.T, sum *Summary) {
	var b strings.Builder
	for _, ph := range sum.Phases {
		printPhase(&b, ph)
	}
	printSummary(&b, sum)
	t.Log(b.String())
}

// phaseNames returns the names of the summary's phases.
func phaseNames(sum *Summary) []string {
	var names []string
	for _, ph := range sum.Phases {
		names = append(names, ph.Name)
	}
	return names
}

// sets runs lock sets uncontended, then drawn from 16 resources with
// waits, then single-key cycles, in one run; every resource of every set
// grant goes to the double-grant check.
func TestSetsBesideCycles(t *testing.T) {
	ctx, e, sum := newEnv(t, "--scenario", "sets", "--workers", "8", "--set-hot", "16", "--wait", "5s", "--duration", "1s")
	err := runSets(ctx, e, sum)
	logSummary(t, sum)
	if err != nil {
		t.Fatal(err)
	}
	r := sum.Sets
	if r == nil || r.Sets == nil || r.Contended == nil || r.Cycles == nil {
		t.Fatalf("sets %+v", r)
	}
	if got := phaseNames(sum); len(got) != 3 || got[0] != "sets" || got[1] != "sets contended" || got[2] != "cycles" {
		t.Fatalf("phases %v", got)
	}
	for _, f := range []*SetsFigures{r.Sets, r.Contended} {
		if f.Granted == 0 || f.Cycles == 0 || f.Errors != 0 || f.MeanSetSize < 2 || f.MeanSetSize > 8 ||
			f.ResourcesLocked < 2*f.Granted || f.ResourcesPerS <= f.GrantsPerS || f.AcquireP50 == 0 || f.ReleaseP99 == 0 {
			t.Fatalf("%s: %+v", f.Phase, f)
		}
	}
	// 8 workers' sets of up to 8 of 16 resources overlap: some waited in
	// the queues (granted with the hand-over TTL).
	if w := r.Contended.Waited; w == nil || *w == 0 || r.Contended.WaitedP50 == 0 {
		t.Fatalf("contended waits: %+v", r.Contended)
	}
	if r.Cycles.Cycles == 0 || sum.Cycles != r.Cycles {
		t.Fatalf("cycles %+v", r.Cycles)
	}
	if sum.Ops[load.OpAcquire].Count != r.Sets.Acquires {
		t.Fatalf("the main phase is not sets: %+v", sum.Ops)
	}
	// Each set member's grant, and each cycle's, was checked.
	want := r.Sets.ResourcesLocked + r.Contended.ResourcesLocked + r.Cycles.Cycles
	if sf := sum.Safety; sf == nil || int64(sf.Grants) < want || sf.Violations != 0 {
		t.Fatalf("safety %+v, want at least %d grants", sf, want)
	}
}

// semaphore: callers on two semaphores of 3 permits each wait, hold and
// release; permits are held in parallel, never more than the limit. A
// hold far longer than a request on a busy machine makes the six callers
// of a semaphore share its permits whatever the scheduling.
func TestSemaphore(t *testing.T) {
	ctx, e, sum := newEnv(t, "--scenario", "semaphore", "--hot-resources", "2", "--waiters", "6", "--limit", "3",
		"--hold", "300ms", "--wait", "5s")
	err := runSemaphore(ctx, e, sum)
	logSummary(t, sum)
	if err != nil {
		t.Fatal(err)
	}
	r := sum.Semaphore
	if r == nil || r.Grants == 0 || r.Errors != 0 || r.Releases != r.Grants || r.WaitP99 == 0 || r.Handovers == 0 {
		t.Fatalf("semaphore %+v", r)
	}
	if r.MaxHeld > 3 || r.MaxHeld < 2 || r.OverLimit != 0 || len(r.MaxHeldBySemaphore) != 2 {
		t.Fatalf("permits held at once: %d (%v), over the limit %d", r.MaxHeld, r.MaxHeldBySemaphore, r.OverLimit)
	}
	// Each permit is a key of its own: more than one per semaphore used.
	if sf := sum.Safety; sf == nil || int64(sf.Grants) != r.Grants || sf.Resources <= 2 || sf.Resources > 6 || sf.Violations != 0 {
		t.Fatalf("safety %+v", sf)
	}
}

// election: the leader's connection closed under it passes the election
// on only when its lease expires; a resign passes it on at once; leaders'
// tokens rise and never overlap.
func TestElection(t *testing.T) {
	ctx, e, sum := newEnv(t, "--scenario", "election", "--candidates", "3", "--rounds", "2", "--ttl", "2s")
	err := runElection(ctx, e, sum)
	logSummary(t, sum)
	if err != nil {
		t.Fatal(err)
	}
	r := sum.Election
	if r == nil || len(r.Kills) != 2 || len(r.Resigns) != 2 || r.Leaders != 5 || r.TokenViolations != 0 || r.Overlaps != 0 {
		t.Fatalf("election %+v", r)
	}
	last := r.Kills[0].FromToken
	for i := range r.Kills {
		for _, k := range []ElectionRound{r.Kills[i], r.Resigns[i]} {
			if k.From == k.To || k.FromToken != last || k.ToToken <= k.FromToken || k.ObservedAfterMs == nil || *k.ObservedAfterMs < 0 {
				t.Fatalf("round %+v after token %d", k, last)
			}
			last = k.ToToken
		}
		// No release: the lease expires, TTL and the service's 2s grace
		// after the last renewal (a third of the TTL at most before).
		if k := r.Kills[i]; k.ElectedAfterMs < 2000 || k.ElectedAfterMs > 2000+2000+5000 || k.LostBeforeMs == nil || *k.LostBeforeMs <= 0 {
			t.Fatalf("kill %+v", k)
		}
		if k := r.Resigns[i]; k.ElectedAfterMs < 0 || k.ElectedAfterMs >= r.KillElected.Min {
			t.Fatalf("resign %+v, kills from %v", k, r.KillElected)
		}
	}
	if r.KillElected.N != 2 || math.Abs(r.KillOverTTL.Min-(r.KillElected.Min-2000)) > 0.02 || r.ResignObserved.N != 2 {
		t.Fatalf("spreads %+v", r)
	}
	if ops := sum.Ops; ops[opKillFailover].Count != 2 || ops[opResignHandover].Count != 2 {
		t.Fatalf("ops %+v", ops)
	}
	// The reports carry it: the JSON under election, the HTML's results.
	dir := t.TempDir()
	if err := writeJSON(filepath.Join(dir, "out.json"), sum); err != nil {
		t.Fatal(err)
	}
	if err := writeHTML(filepath.Join(dir, "out.html"), sum); err != nil {
		t.Fatal(err)
	}
	js, _ := os.ReadFile(filepath.Join(dir, "out.json"))
	page, _ := os.ReadFile(filepath.Join(dir, "out.html"))
	if !strings.Contains(string(js), `"kill_elected_ms"`) || !strings.Contains(string(page), "== election:") {
		t.Fatalf("reports without the election:\n%s", js)
	}
}

// The flags of sets, semaphore and election: checked, with the election's
// own TTL unless --ttl is given.
func TestShapeFlags(t *testing.T) {
	c, err := parseFlags([]string{"--scenario", "election"})
	if err != nil || c.ttl != electionTTL || c.candidates != 3 || c.rounds != 5 {
		t.Fatalf("election defaults: %+v, %v", c, err)
	}
	if c, err = parseFlags([]string{"--scenario", "election", "--ttl", "2s"}); err != nil || c.ttl != 2*time.Second {
		t.Fatalf("--ttl 2s: %v, %v", c.ttl, err)
	}
	c, err = parseFlags([]string{"--scenario", "sets"})
	if err != nil || c.setMin != 2 || c.setMax != 8 || c.setHot != 64 || c.workers != 64 || c.ttl != 30*time.Second || c.settings()["set_hot"] != "64" {
		t.Fatalf("sets defaults: %+v, %v", c, err)
	}
	if c, err = parseFlags([]string{"--scenario", "semaphore"}); err != nil || c.limit != 5 || c.waiters != 20 || c.hotResources != 10 {
		t.Fatalf("semaphore defaults: %+v, %v", c, err)
	}
	for _, bad := range [][]string{{"--set-min", "1"}, {"--set-min", "5", "--set-max", "4"}, {"--set-max", "65"},
		{"--set-max", "20", "--set-hot", "10"}, {"--scenario", "sets", "--resources", "100", "--leases", "10", "--workers", "20"},
		{"--scenario", "sets", "--target", "raw"}, {"--scenario", "sets", "--wait", "0s"}, {"--limit", "0"}, {"--limit", "1001"},
		{"--candidates", "1"}, {"--rounds", "0"}, {"--scenario", "election", "--ttl", "500ms"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// --profile writes the service process's CPU profile of the run and its
// heap as it ends: both parse, the CPU profile covers the run, and the
// heap profile carries what was allocated and what is in use.
func TestProfile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "profiles")
	ctx, e, sum := newEnv(t, "--profile", dir, "--workers", "4", "--duration", "1s")
	if len(e.svc.procs) != 1 {
		t.Fatal("want a service process")
	}
	if err := runCycles(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	e.svc.stop() // the service process writes its profiles as it stops
	e.svc = nil
	cpuPath, heapPath := serviceProfiles(dir)
	read := func(path string) *profile.Profile {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		p, err := profile.Parse(f)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return p
	}
	cpu := read(cpuPath)
	if cpu.DurationNanos < int64(time.Second) || len(cpu.SampleType) == 0 || cpu.SampleType[0].Type != "samples" {
		t.Fatalf("cpu profile of %v, sample types %v", time.Duration(cpu.DurationNanos), cpu.SampleType)
	}
	// Each node's CPU profile of the phase, through its profiling port.
	for i := range 3 {
		p := read(filepath.Join(dir, fmt.Sprintf("n%d.01-cycles.cpu.pprof", i+1)))
		// Profiled for the phase's scheduled second (the server's clock
		// may count a hair less).
		if p.DurationNanos < int64(900*time.Millisecond) || len(p.SampleType) == 0 || p.SampleType[0].Type != "samples" {
			t.Fatalf("node n%d: cpu profile of %v, sample types %v", i+1, time.Duration(p.DurationNanos), p.SampleType)
		}
	}
	heap := read(heapPath)
	var types []string
	for _, st := range heap.SampleType {
		types = append(types, st.Type)
	}
	// The heap is sampled (one sample per 512 KiB allocated, on average):
	// a short run has a few samples, in whatever code allocated them.
	if !slices.Contains(types, "alloc_space") || !slices.Contains(types, "inuse_space") || len(heap.Sample) == 0 {
		t.Fatalf("heap profile: sample types %v, %d samples", types, len(heap.Sample))
	}
}

// rolling restarts the three nodes (here with SIGTERM, which hands the
// leadership over as lame duck mode does, without its grace period) and
// the two service processes, each back before the next, under load: every
// restart is measured, the stream leader's hand-over seen, and nothing is
// lost or granted twice. The request timeout is long enough that a
// timeout means a lost request, not a slow one on a busy machine; each
// restart settles for that timeout, hence the duration: five restarts of
// a few seconds each, every one back and settled before the next, took
// 45 s on a busy machine.
func TestRolling(t *testing.T) {
	ctx, e, sum := newEnv(t, "--scenario", "rolling", "--failover-mode", "term", "--instances", "2",
		"--duration", "60s", "--kill-at", "1s", "--timeout", "5s")
	if err := runRolling(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	r := sum.Rolling
	if r == nil || r.Mode != "term" || len(r.Restarts) != 5 || r.Note != "" || r.Skipped != "" {
		t.Fatalf("rolling %+v", r)
	}
	var names []string
	led := 0
	for _, x := range r.Restarts {
		names = append(names, x.Name)
		if x.BackAfterS <= 0 || x.Note != "" || x.LeasesLost != 0 {
			t.Errorf("restart %+v", x)
		}
		if x.LedStream {
			led++
			if x.NewLeader == "" || x.NewLeader == x.Name {
				t.Errorf("%s led the stream: new leader %q", x.Name, x.NewLeader)
			}
		}
		if x.Kind == "service" && x.Errors[load.CodeTimeout] != 0 {
			t.Errorf("%s's restart left %d requests unanswered", x.Name, x.Errors[load.CodeTimeout])
		}
	}
	if want := []string{"n3", "n2", "n1", "service", "service-2"}; !slices.Equal(names, want) || led == 0 {
		t.Fatalf("restarts %v (%d of the stream leader), want %v with the leader's among them", names, led, want)
	}
	if r.LeasesLost != 0 || sum.Safety == nil || sum.Safety.Grants == 0 || sum.Safety.Violations != 0 {
		t.Fatalf("leases lost %d, safety %+v", r.LeasesLost, sum.Safety)
	}
	for i := range 3 {
		if e.cluster.PID(i) == 0 {
			t.Errorf("%s not running after the rolling restart", e.cluster.Name(i))
		}
	}
	logSummary(t, sum)
}

// failover stops the stream leader's node (here with SIGTERM, which hands
// the leadership over), sees another node lead, and restarts it once it
// has exited and --restart-after has passed.
func TestFailoverStopsTheLeaderAsTold(t *testing.T) {
	ctx, e, sum := newEnv(t, "--scenario", "failover", "--failover-mode", "term", "--duration", "8s", "--kill-at", "2s",
		"--restart-after", "3s")
	if err := runFailover(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	f := sum.Failover
	if f == nil || f.Mode != "term" || f.OldLeader == "" || f.NewLeader == "" || f.NewLeader == f.OldLeader || f.RestartAtS == 0 || f.Note != "" {
		t.Fatalf("failover %+v", f)
	}
	if i := e.cluster.Node(f.OldLeader); e.cluster.PID(i) == 0 {
		t.Fatalf("%s not running again", f.OldLeader)
	}
	if sum.Safety == nil || sum.Safety.Grants == 0 || sum.Safety.Violations != 0 {
		t.Fatalf("safety %+v", sum.Safety)
	}
}

// waiters queues idle waiters on held locks past the service's default
// tenant cap (raised for the run), counts the stream's writes while they
// wait (none: a waiter is written once), and runs the unrelated callers
// alone and beside them; no waiter is refused or answered before the
// bench cancels it at the end.
func TestWaitersScenario(t *testing.T) {
	ctx, e, sum := newEnv(t, "--scenario", "waiters", "--hot-resources", "3", "--waiters", "400", "--workers", "2",
		"--duration", "2s", "--service-max-waiters-per-tenant", "1200")
	if e.cfg.wait != 5*time.Minute {
		t.Fatalf("waiters' wait_ms %v, want 5m unless given", e.cfg.wait)
	}
	if err := runWaiters(ctx, e, sum); err != nil {
		t.Fatal(err)
	}
	w := sum.Waiters
	if w == nil || w.Waiters != 1200 || w.Queued != 1200 || w.QueueS < 0 || len(w.Answered) != 0 {
		t.Fatalf("waiters %+v", w)
	}
	if w.IdleS == 0 || w.IdleWrites != 0 {
		t.Fatalf("idle waiters wrote %d messages in %.1fs, want none", w.IdleWrites, w.IdleS)
	}
	if w.Alone.Cycles == 0 || w.Beside.Cycles == 0 || w.Alone.Errors != 0 || w.Beside.Errors != 0 || w.TryHot.Count == 0 ||
		w.TryHot.ErrorsByCode["locked"] != w.TryHot.Count {
		t.Fatalf("the callers: alone %+v, beside %+v, try-acquire of a held name %+v", w.Alone, w.Beside, w.TryHot)
	}
	if settings := sum.Settings; settings["service_max_waiters_per_tenant"] != "1200" {
		t.Fatalf("settings %v", settings)
	}
}
