package main

import (
	"encoding/json"
	"testing"
	"time"
)

func TestRecorderSummary(t *testing.T) {
	r := newRecorder(opAcquire, 100)
	for i := 1; i <= 100; i++ {
		r.record(time.Duration(i)*time.Millisecond, codeOK)
	}
	r.record(5*time.Second, codeTimeout)
	r.fail(codeBacklog)
	r.skip()
	s := r.summary(10 * time.Second)
	if s.Count != 102 || s.Errors != 2 || s.Skipped != 1 {
		t.Fatalf("count %d errors %d skipped %d, want 102, 2, 1", s.Count, s.Errors, s.Skipped)
	}
	if s.ErrorsByCode[codeTimeout] != 1 || s.ErrorsByCode[codeBacklog] != 1 {
		t.Fatalf("errors by code %v", s.ErrorsByCode)
	}
	if s.Rate != 10.2 {
		t.Fatalf("rate %v, want 10.2", s.Rate)
	}
	within := func(name string, got, want float64) {
		t.Helper()
		if got < want*0.99 || got > want*1.01 {
			t.Fatalf("%s %v ms, want about %v", name, got, want)
		}
	}
	within("p50", s.P50, 51)
	within("p95", s.P95, 96)
	within("max", s.Max, 5000)
}

func TestRecorderTickResetsInterval(t *testing.T) {
	r := newRecorder(opRenew, 0)
	r.record(10*time.Millisecond, codeOK)
	r.record(20*time.Millisecond, streamsLocked)
	p := r.tick(1, time.Second)
	if p.Count != 2 || p.Errors != 1 || p.Rate != 2 || p.Max < 19.9 {
		t.Fatalf("first interval %+v", p)
	}
	p = r.tick(2, 500*time.Millisecond)
	if p.Count != 0 || p.P99 != 0 {
		t.Fatalf("second interval not empty: %+v", p)
	}
	if len(r.points()) != 2 {
		t.Fatalf("%d points, want 2", len(r.points()))
	}
}

const streamsLocked = "locked"

func TestRecorderClampsOutOfRange(t *testing.T) {
	r := newRecorder(opAcquire, 0)
	r.record(-time.Second, codeOK)
	r.record(time.Hour, codeOK)
	s := r.summary(time.Second)
	if s.Count != 2 || s.Max < 599_000 {
		t.Fatalf("out-of-range latencies not clamped: %+v", s)
	}
}

// The JSON summary has an ops map keyed by operation with the fields the
// capacity reports quote.
func TestSummaryJSONShape(t *testing.T) {
	ph := newPhase("steady", "service")
	ph.rec.get(opAcquire, 2000).record(3*time.Millisecond, codeOK)
	ph.rec.get(opRelease, 2000).record(2*time.Millisecond, codeOK)
	ph.start, ph.end = time.Now().Add(-time.Second), time.Now()
	ph.Ops = map[string]OpSummary{}
	for _, r := range ph.rec.all() {
		ph.Ops[r.name] = r.summary(time.Second)
	}
	s := &Summary{Scenario: "steady", Machine: machineInfo(), Phases: []*phase{ph}}
	s.use(ph)
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	ops, ok := got["ops"].(map[string]any)
	if !ok {
		t.Fatalf("no ops object in %s", b)
	}
	for _, op := range []string{opAcquire, opRelease} {
		o, ok := ops[op].(map[string]any)
		if !ok {
			t.Fatalf("ops has no %q: %v", op, ops)
		}
		for _, k := range []string{"count", "errors", "rate", "p50_ms", "p95_ms", "p99_ms", "max_ms"} {
			if _, ok := o[k].(float64); !ok {
				t.Fatalf("ops.%s.%s missing or not a number: %v", op, k, o)
			}
		}
	}
	for _, k := range []string{"scenario", "machine", "commits_per_s", "phases"} {
		if _, ok := got[k]; !ok {
			t.Fatalf("summary lacks %q", k)
		}
	}
}
