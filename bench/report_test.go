package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/bench/internal/procstat"
	"github.com/jetlock/jetlock/streams"
)

// CPU per operation is the CPU time of the phase over the operations that
// got an answer, and over the commits; the service's only when the load
// went to it.
func TestCPUCost(t *testing.T) {
	procs := map[string]procstat.Summary{
		"bench": {CPUSeconds: 9}, "service": {CPUSeconds: 0.5},
		"n1": {CPUSeconds: 1}, "n2": {CPUSeconds: 0.75}, "n3": {CPUSeconds: 0.25},
	}
	ops := map[string]load.OpSummary{
		load.OpAcquire: {Count: 6000, ErrorsByCode: map[string]int64{load.CodeTimeout: 1000, streams.CodeLocked: 500}},
		load.OpRelease: {Count: 5000},
	}
	c := cpuCost(procs, ops, 8000, true)
	want := CPUCost{Answered: 10000, Commits: 8000, ServiceProcess: "service", ServiceUsPerOp: 50, ServiceUsPerCommit: 62.5,
		ClusterUsPerOp: 200, ClusterUsPerCommit: 250}
	if *c != want {
		t.Fatalf("cost %+v, want %+v", *c, want)
	}
	if c := cpuCost(procs, ops, 0, false); c.ServiceUsPerOp != 0 || c.ClusterUsPerCommit != 0 || c.ClusterUsPerOp != 200 {
		t.Fatalf("raw phase, no commits: %+v", *c)
	}
	procs = map[string]procstat.Summary{"bench+service": {CPUSeconds: 1}}
	if c := cpuCost(procs, ops, 8000, true); c.ServiceProcess != "bench+service" || c.ServiceUsPerOp != 100 || c.ClusterUsPerOp != 0 {
		t.Fatalf("in-process service: %+v", *c)
	}
}

// The service's figures of a phase sum every instance's metrics; the
// store's commit times and conflicts are read from one here.
func TestParseMetricsSumsInstances(t *testing.T) {
	st := newSvcStats()
	for _, text := range []string{`# HELP jetlock_request_duration_seconds Time from receipt to reply, by operation.
# TYPE jetlock_request_duration_seconds histogram
jetlock_request_duration_seconds_bucket{op="acquire",le="0.005"} 3
jetlock_request_duration_seconds_sum{op="acquire"} 1.5
jetlock_request_duration_seconds_count{op="acquire"} 3
# TYPE jetlock_requests_shed_total counter
jetlock_requests_shed_total{op="acquire",reason="waited"} 1
jetlock_requests_shed_total{op="renew",reason="waited"} 1
# TYPE jetlock_wakes_total counter
jetlock_wakes_total 5
`, `# TYPE jetlock_request_duration_seconds histogram
jetlock_request_duration_seconds_sum{op="acquire"} 2
jetlock_request_duration_seconds_count{op="acquire"} 1
# TYPE jetlock_requests_shed_total counter
jetlock_requests_shed_total{op="acquire",reason="queue_full"} 7
jetlock_requests_shed_total{op="acquire",reason="waited"} 8
# TYPE jetlock_wakes_total counter
jetlock_wakes_total 2
# TYPE jetlock_store_commit_duration_seconds histogram
jetlock_store_commit_duration_seconds_sum{op="grant"} 0.5
jetlock_store_commit_duration_seconds_count{op="grant"} 10
# TYPE jetlock_cas_conflicts_total counter
jetlock_cas_conflicts_total 4
`} {
		if err := parseMetrics(strings.NewReader(text), st); err != nil {
			t.Fatal(err)
		}
	}
	if got := st.ops["acquire"]; got.count != 4 || got.sum != 3.5 {
		t.Errorf("acquire time %+v, want 4 requests in 3.5 s", got)
	}
	if st.shed["waited"] != 10 || st.shed["queue_full"] != 7 {
		t.Errorf("shed %v, want waited 10 and queue_full 7", st.shed)
	}
	if *st.wakes != 7 {
		t.Errorf("wakes %v, want 7", *st.wakes)
	}
	if got := st.commits["grant"]; got.count != 10 || got.sum != 0.5 || *st.conflicts != 4 {
		t.Errorf("grant commits %+v, conflicts %v; want 10 in 0.5 s, 4", got, *st.conflicts)
	}
}

func TestJain(t *testing.T) {
	if j, lo, hi := jain([]int64{5, 5, 5, 5}); j != 1 || lo != 5 || hi != 5 {
		t.Fatalf("even: %v %d %d", j, lo, hi)
	}
	if j, _, _ := jain([]int64{10, 0, 0, 0}); j != 0.25 {
		t.Fatalf("one takes all: %v, want 0.25", j)
	}
}

func testPhase() *phase {
	ph := newPhase("steady", &load.Service{}, nil, 0)
	ph.start, ph.end = time.Now().Add(-5*time.Second), time.Now()
	r := ph.rec.Get(load.OpAcquire, 100)
	for i := range 5 {
		r.Record(time.Duration(i+1)*time.Millisecond, load.CodeOK)
		r.Tick(float64(i+1), time.Second, false)
	}
	ph.rec.Get(load.OpRelease, 100).Record(2*time.Millisecond, load.CodeOK)
	ph.commits = []seriesPoint{{1, 100}, {2, 120}}
	ph.cpu["n1"] = []seriesPoint{{1, 30}, {2, 40}}
	ph.Events = []Event{{T: 2, What: "killed n1 <leader>"}}
	ph.DurationS = 5
	ph.Processes = map[string]procstat.Summary{"n1": {CPUSeconds: 1}, "service": {CPUSeconds: 0.5}}
	ph.Ops = map[string]load.OpSummary{}
	for _, r := range ph.rec.All() {
		ph.Ops[r.Name] = r.Summary(5 * time.Second)
	}
	ph.CPU = cpuCost(ph.Processes, ph.Ops, 6, true)
	return ph
}

// The JSON summary has an ops map keyed by operation with the fields the
// capacity reports quote, the phases, and the CPU per operation.
func TestSummaryJSONShape(t *testing.T) {
	ph := testPhase()
	s := &Summary{Scenario: "steady", Machine: machineInfo(), Phases: []*phase{ph},
		Hotlock: &HotlockResult{HandoverP50: 1, HandoverP99: 2, GrantsPerS: 3}}
	s.use(ph)
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	ops, _ := got["ops"].(map[string]any)
	for _, op := range []string{load.OpAcquire, load.OpRelease} {
		o, ok := ops[op].(map[string]any)
		if !ok {
			t.Fatalf("ops has no %q: %s", op, b)
		}
		for _, k := range []string{"count", "errors", "rate", "p50_ms", "p95_ms", "p99_ms", "max_ms"} {
			if _, ok := o[k].(float64); !ok {
				t.Fatalf("ops.%s.%s missing or not a number: %v", op, k, o)
			}
		}
	}
	for _, k := range []string{"scenario", "machine", "commits_per_s", "phases", "cpu_per_op"} {
		if _, ok := got[k]; !ok {
			t.Fatalf("summary lacks %q", k)
		}
	}
	if cpu := got["cpu_per_op"].(map[string]any); cpu["service_us_per_op"] == nil || cpu["cluster_us_per_commit"] == nil {
		t.Fatalf("cpu_per_op %v", cpu)
	}
	for _, k := range []string{"handover_p50_ms", "handover_p99_ms", "grants_per_s", "wakes_per_release"} {
		if _, ok := got["hotlock"].(map[string]any)[k]; !ok {
			t.Fatalf("hotlock lacks %q", k)
		}
	}
}

// The HTML report is one self-contained file: inline SVG, no scripts or
// external resources.
func TestWriteHTMLSelfContained(t *testing.T) {
	ph := testPhase()
	s := &Summary{Scenario: "steady", Machine: machineInfo(), Phases: []*phase{ph},
		Ramp: &RampResult{Target: "service", P99TargetMs: 200, Steps: []RampStep{{TargetRate: 1000, P99: 5, Pass: true}}}}
	s.use(ph)
	path := filepath.Join(t.TempDir(), "r.html")
	if err := writeHTML(path, s); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := string(b)
	if strings.Count(h, "<svg") < 4 || !strings.Contains(h, "<polyline") {
		t.Fatal("no charts in the report")
	}
	if strings.Contains(h, "<script") || strings.Contains(h, "src=") || strings.Contains(h, "<link") {
		t.Fatal("report loads something external")
	}
	if !strings.Contains(h, "killed n1 &lt;leader&gt;") {
		t.Fatal("event label not escaped or missing")
	}
}

// A temporary data directory is removed after a run, but kept, with its
// logs, after a failed one.
func TestCloseKeepsTheDataOfAFailedRun(t *testing.T) {
	for _, failed := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "run")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		e := &env{cfg: &config{}, out: &out, dir: dir, tempDir: true, failed: failed}
		e.close()
		_, err := os.Stat(dir)
		if kept := err == nil; kept != failed {
			t.Fatalf("failed %v: directory kept %v; output %q", failed, kept, out.String())
		}
		if failed && !strings.Contains(out.String(), dir) {
			t.Fatalf("a failed run's output %q does not say where its logs are", out.String())
		}
	}
}

// Several service processes (--instances with --service proc) are the
// service together: their CPU is summed, and named in order of start.
func TestCPUCostSumsServiceProcesses(t *testing.T) {
	procs := map[string]procstat.Summary{
		"bench": {CPUSeconds: 9}, "service": {CPUSeconds: 0.25}, "service-2": {CPUSeconds: 0.5}, "service-10": {CPUSeconds: 0.25},
		"n1": {CPUSeconds: 1}, "n2": {CPUSeconds: 0.75}, "n3": {CPUSeconds: 0.25},
	}
	ops := map[string]load.OpSummary{load.OpAcquire: {Count: 10000}}
	c := cpuCost(procs, ops, 8000, true)
	want := CPUCost{Answered: 10000, Commits: 8000, ServiceProcess: "service+service-2+service-10", ServiceUsPerOp: 100,
		ServiceUsPerCommit: 125, ClusterUsPerOp: 200, ClusterUsPerCommit: 250}
	if *c != want {
		t.Fatalf("cost %+v, want %+v", *c, want)
	}
	if c := cpuCost(procs, ops, 8000, false); c.ServiceUsPerOp != 0 || c.ServiceProcess != "" {
		t.Fatalf("raw phase: %+v", *c)
	}
}

// sessionPhase returns a phase as measure fills it in: granted acquires
// (first tries and retries), stream messages, the service's batch commits
// of grants and its conflicts, and the CPU per operation.
func sessionPhase(granted, msgs int64, commits map[string]int64, conflicts int64, clusterUs, serviceUs float64) *phase {
	return &phase{Name: "sessions", DurationS: 10, Commits: msgs, CommitsPerSec: float64(msgs) / 10,
		Ops: map[string]load.OpSummary{
			load.OpAcquire:      {Count: granted - 10, P50: 2, P99: 9},
			load.OpAcquireRetry: {Count: 10},
		},
		ServiceCommits: commits, ServiceConflicts: conflicts, CPU: &CPUCost{ClusterUsPerOp: clusterUs, ServiceUsPerOp: serviceUs}}
}

// Session mode's check messages are the service's batch commits of kind
// grant: a lone instance's grants to sessions, each a lease and a check.
// Two or more instances grant with plain writes (no such commit), and
// without the service's metrics (--service none) none is counted. The
// per-lease mode has none.
func TestSessionFiguresCountChecksFromTheServiceBatches(t *testing.T) {
	for _, tc := range []struct {
		name    string
		commits map[string]int64
		checks  int64
		writes  float64 // per grant
	}{
		{"a lone instance", map[string]int64{"grant": 1000, "put": 500, "delete": 1000}, 1000, 2.5},
		{"two instances", map[string]int64{"put": 1500, "delete": 1000}, 0, 3.5},
		{"a deployed service", nil, 0, 3.5},
	} {
		ph := sessionPhase(1000, 3500, tc.commits, 50, 300, 120)
		f := sessionFigures(ph, 200, load.Losses{}, true)
		if f.CheckMsgs != tc.checks || f.Granted != 1000 || f.WritesPerGrant != tc.writes || f.Errors != 0 {
			t.Errorf("%s: check messages %d, granted %d, writes per grant %v, errors %d; want %d, 1000, %v, 0",
				tc.name, f.CheckMsgs, f.Granted, f.WritesPerGrant, f.Errors, tc.checks, tc.writes)
		}
		if f.ClusterUsPerOp != 300 || f.ServiceUsPerOp != 120 || f.Conflicts != 50 || f.ConflictsPerGrantPct != 5 {
			t.Errorf("%s: cpu %v/%v µs per op, conflicts %d (%v %%)", tc.name, f.ClusterUsPerOp, f.ServiceUsPerOp, f.Conflicts, f.ConflictsPerGrantPct)
		}
		if f := sessionFigures(ph, 200, load.Losses{}, false); f.CheckMsgs != 0 || f.WritesPerGrant != 3.5 {
			t.Errorf("%s: per-lease mode counts %d check messages, %v writes per grant", tc.name, f.CheckMsgs, f.WritesPerGrant)
		}
	}
}

// The comparison gives session mode's CPU per operation over per-lease
// mode's, and prints the ratios that both modes measured; they do not
// change the target.
func TestCompareSessionsCPURatio(t *testing.T) {
	perPh := sessionPhase(1000, 6000, map[string]int64{"put": 5000}, 0, 400, 150)
	sesPh := sessionPhase(1000, 3000, map[string]int64{"grant": 1000}, 20, 300, 120)
	// The same load: session mode answers fewer operations (keepalives
	// for renewals).
	perPh.CPU.Answered, sesPh.CPU.Answered = 6000, 4800
	per := sessionFigures(perPh, 200, load.Losses{}, false)
	ses := sessionFigures(sesPh, 200, load.Losses{}, true)
	per.RaftCommitsPerSec, ses.RaftCommitsPerSec = 500, 300
	r := &SessionsResult{Sessions: 20, Opened: 20, RaftRead: true, ServiceRead: true, PerLease: per, Session: ses}
	compareSessions(r, 200*time.Millisecond)
	if r.ClusterCPURatio != 0.75 || r.ServiceCPURatio != 0.8 || !r.Met || !r.MetByWrites || r.WritesReductionPct != 66.67 {
		t.Fatalf("ratios %v %v, met %v (%s) by writes %v (%s), writes %v %% lower",
			r.ClusterCPURatio, r.ServiceCPURatio, r.Met, r.Why, r.MetByWrites, r.WhyByWrites, r.WritesReductionPct)
	}
	if per.ClusterCPUSeconds != 2.4 || ses.ClusterCPUSeconds != 1.44 || r.ClusterLoadCPURatio != 0.6 || r.ServiceLoadCPURatio != 0.64 {
		t.Fatalf("cpu in all: cluster %v s / %v s, ratios %v %v; want 2.4 / 1.44, 0.6 and 0.64",
			per.ClusterCPUSeconds, ses.ClusterCPUSeconds, r.ClusterLoadCPURatio, r.ServiceLoadCPURatio)
	}
	var out strings.Builder
	printSessions(&out, r)
	for _, want := range []string{"cluster µs/op", "service µs/op", "conflicts", "20 (2.00%)",
		"writes: stream messages less the 1000 check messages of session grants",
		"session mode against per-lease mode: cluster CPU per operation 0.75×, service CPU per operation 0.80×, " +
			"cluster CPU for the load in all 0.60×, service CPU for the load in all 0.64×\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// A deployed service: its CPU and its batches are unknown.
	r.PerLease.ServiceUsPerOp, r.Session.ServiceUsPerOp, r.ServiceRead = 0, 0, false
	r.PerLease.ServiceCPUSeconds, r.Session.ServiceCPUSeconds = 0, 0
	compareSessions(r, 200*time.Millisecond)
	out.Reset()
	printSessions(&out, r)
	if r.ServiceCPURatio != 0 || !strings.Contains(out.String(), "cluster CPU per operation 0.75×, cluster CPU for the load in all 0.60×\n") ||
		!strings.Contains(out.String(), "none is counted") {
		t.Fatalf("service ratio %v; output:\n%s", r.ServiceCPURatio, out.String())
	}
}
