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
