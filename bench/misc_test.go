package main

import (
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

func TestIDSet(t *testing.T) {
	s := newIDSet(10)
	for i := int32(0); i < 10; i++ {
		s.add(i)
	}
	s.add(3) // twice: no effect
	s.remove(4)
	s.remove(4)
	if s.len() != 9 || s.has(4) || !s.has(9) {
		t.Fatalf("set len %d has4 %v has9 %v", s.len(), s.has(4), s.has(9))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[int32]bool{}
	for {
		id, ok := s.pick(rng)
		if !ok {
			break
		}
		if seen[id] || id == 4 {
			t.Fatalf("picked %d again or a removed id", id)
		}
		seen[id] = true
	}
	if len(seen) != 9 {
		t.Fatalf("picked %d ids, want 9", len(seen))
	}
}

func TestServiceBackendParse(t *testing.T) {
	b := &serviceBackend{prefix: "jetlock", bucket: "jetlock"}
	ok := &nats.Msg{Data: []byte(`{"resource":"r","lease_id":"L","token":42,"ttl_ms":30000,"expires_at":"x"}`)}
	if r := b.parse(streams.OpAcquire, ok, nil); r.code != codeOK || r.lease != "L" || r.token != 42 {
		t.Fatalf("grant parsed as %+v", r)
	}
	locked := nats.NewMsg("x")
	locked.Header.Set(streams.HeaderErrorCode, "409")
	locked.Data = []byte(`{"error":{"code":"locked","message":"held"}}`)
	if r := b.parse(streams.OpAcquire, locked, nil); r.code != streams.CodeLocked || r.unknown {
		t.Fatalf("locked parsed as %+v", r)
	}
	unavail := nats.NewMsg("x")
	unavail.Header.Set(streams.HeaderErrorCode, "503")
	unavail.Data = []byte(`not json`)
	if r := b.parse(streams.OpRenew, unavail, nil); r.code != streams.CodeUnavailable || !r.unknown {
		t.Fatalf("503 with a bad body parsed as %+v", r)
	}
	rel := &nats.Msg{Data: []byte(`{"resource":"r","released":false}`)}
	if r := b.parse(streams.OpRelease, rel, nil); r.code != codeOK || r.released {
		t.Fatalf("release parsed as %+v", r)
	}
	if r := b.parse(streams.OpAcquire, nil, errTimeout); r.code != codeTimeout || !r.unknown {
		t.Fatalf("timeout parsed as %+v", r)
	}
	m := b.acquire("r", "q", "", 30*time.Second, 2*time.Second, 0)
	if m.Subject != "jetlock.v1.acquire" || !strings.Contains(string(m.Data), `"wait_ms":2000`) {
		t.Fatalf("acquire message %s %s", m.Subject, m.Data)
	}
}

func TestRawBackend(t *testing.T) {
	b := newRawBackend("raw", "me")
	m := b.acquire("a/b", "q1", "", 30*time.Second, 0, 7)
	if m.Subject != "$KV.raw.lease.a/b" || m.Header.Get("Nats-Expected-Last-Subject-Sequence") != "7" || m.Header.Get("Nats-Msg-Id") == "" {
		t.Fatalf("raw acquire %s %v", m.Subject, m.Header)
	}
	if d := b.release("a/b", "", 9); d.Header.Get("KV-Operation") != "DEL" {
		t.Fatalf("raw release headers %v", d.Header)
	}
	ack := &nats.Msg{Data: []byte(`{"stream":"KV_raw","seq":12}`)}
	if r := b.parse(streams.OpAcquire, ack, nil); r.code != codeOK || r.rev != 12 || r.token != 12 {
		t.Fatalf("ack parsed as %+v", r)
	}
	conflict := &nats.Msg{Data: []byte(`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence"}}`)}
	if r := b.parse(streams.OpRenew, conflict, nil); r.code != codeConflict || r.unknown {
		t.Fatalf("conflict parsed as %+v", r)
	}
}

func TestParseFlagsDefaultsAreTheDesignWorkload(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.scenario != "steady" || c.resources != 100_000 || c.leases != 20_000 || c.acquireRate != 2000 ||
		c.releaseRate != 2000 || c.renewRate != 2000 || c.serviceMode != "inproc" || c.instances != 1 || c.clients != "any" {
		t.Fatalf("defaults %+v", c)
	}
	for _, args := range [][]string{
		{"--scenario", "nope"},
		{"--leases", "10", "--resources", "5"},
		{"--scenario", "failover", "--url", "nats://127.0.0.1:4222"},
		{"--service", "none"},
		{"--target", "etcd"},
		{"--instances", "0"},
		{"--instances", "2", "--service", "proc"},
		{"--url", "nats://127.0.0.1:4222", "--service-queue-wait", "2s"},
		{"--service-max-in-flight", "0"},
		{"--service-queue-wait", "-1s"},
		{"--clients", "nearby"},
		{"--clients", "service", "--service", "proc"},
		{"--clients", "service", "--url", "nats://127.0.0.1:4222"},
		{"--leader", "away", "--service", "proc"},
		{"--leader", "service", "--url", "nats://127.0.0.1:4222"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	c, err = parseFlags([]string{"--url", "nats://127.0.0.1:4222"})
	if err != nil || c.serviceMode != "none" {
		t.Fatalf("--url: service %q err %v", c.serviceMode, err)
	}
}

// The service's overload settings default to the service's own, and reach
// the service child (--service proc) through its flags unchanged.
func TestServiceTuningFlags(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg service.Config
	c.tune.apply(&cfg)
	d := service.DefaultConfig()
	if cfg.MaxInFlight != d.MaxInFlight || cfg.MaxQueued != d.MaxQueued || cfg.QueueWait != d.QueueWait || cfg.OpTimeout != d.OpTimeout {
		t.Fatalf("default tuning %+v, want the service's defaults", c.tune)
	}
	c, err = parseFlags([]string{"--service-max-in-flight", "100", "--service-max-queued", "7", "--service-queue-wait", "1.5s", "--service-op-timeout", "2500ms"})
	if err != nil {
		t.Fatal(err)
	}
	want := tuning{maxInFlight: 100, maxQueued: 7, queueWait: 1500 * time.Millisecond, opTimeout: 2500 * time.Millisecond}
	if c.tune != want {
		t.Fatalf("tuning %+v, want %+v", c.tune, want)
	}
	if s := c.settings(); s["service_queue_wait"] != "1.5s" || s["service_max_in_flight"] != "100" {
		t.Fatalf("settings %v", s)
	}
	fs := flag.NewFlagSet(cmdService, flag.ContinueOnError)
	var child tuning
	child.register(fs, "")
	if err := fs.Parse(c.tune.args()); err != nil || child != want {
		t.Fatalf("child's tuning %+v (%v), want %+v", child, err, want)
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

func TestGrantWindow(t *testing.T) {
	t0 := time.Now()
	var g grantTimes
	for _, ms := range []int{0, 100, 200, 1500, 1600} {
		at := t0.Add(time.Duration(ms) * time.Millisecond)
		g.add(at.Add(-time.Millisecond), at)
	}
	fr := &FailoverResult{}
	grantWindow(fr, &g, t0.Add(300*time.Millisecond))
	if fr.LastGrantBeforeMs != 100 || fr.NoGrantWindowMs != 1300 || fr.FirstGrantAfterMs != 1200 {
		t.Fatalf("window %+v", fr)
	}
}

// The HTML report is one self-contained file: inline SVG, no scripts or
// external resources.
func TestWriteHTMLSelfContained(t *testing.T) {
	ph := newPhase("steady", "service")
	ph.start = time.Now()
	r := ph.rec.get(opAcquire, 100)
	for i := 0; i < 5; i++ {
		r.record(time.Duration(i+1)*time.Millisecond, codeOK)
		r.tick(float64(i+1), time.Second)
	}
	ph.commits = []seriesPoint{{1, 100}, {2, 120}}
	ph.cpu["n1"] = []seriesPoint{{1, 30}, {2, 40}}
	ph.Events = []Event{{T: 2, What: "killed n1 <leader>"}}
	ph.DurationS = 5
	ph.Ops = map[string]OpSummary{opAcquire: r.summary(5 * time.Second)}
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
		dir := t.TempDir() + "/run"
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

// The service figures of a phase cover every in-process instance.
func TestServiceStatsSumInstances(t *testing.T) {
	instance := func(acquires int, seconds float64, waited, full float64) *runningService {
		reg := prometheus.NewRegistry()
		lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "jetlock_request_duration_seconds"}, []string{"op"})
		shed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jetlock_requests_shed_total"}, []string{"op", "reason"})
		reg.MustRegister(lat, shed)
		for range acquires {
			lat.WithLabelValues("acquire").Observe(seconds)
		}
		shed.WithLabelValues("acquire", "waited").Add(waited)
		shed.WithLabelValues("renew", "waited").Add(waited)
		shed.WithLabelValues("acquire", "queue_full").Add(full)
		return &runningService{reg: reg}
	}
	e := &env{svc: instance(3, 0.5, 1, 0), moreSvcs: []*runningService{instance(1, 2, 4, 7)}}
	st := e.serviceStats()
	if got := st.ops["acquire"]; got.count != 4 || got.sum != 3.5 {
		t.Errorf("acquire time %+v, want 4 requests in 3.5 s", got)
	}
	if st.shed["waited"] != 10 || st.shed["queue_full"] != 7 {
		t.Errorf("shed %v, want waited 10 and queue_full 7", st.shed)
	}
}
