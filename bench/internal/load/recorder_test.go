package load

import (
	"testing"
	"time"
)

func TestRecorderSummary(t *testing.T) {
	r := NewRecorder(OpAcquire, 100)
	for i := 1; i <= 100; i++ {
		r.Record(time.Duration(i)*time.Millisecond, CodeOK)
	}
	r.Record(5*time.Second, CodeTimeout)
	r.Fail(CodeBacklog)
	r.Skip()
	s := r.Summary(10 * time.Second)
	if s.Count != 102 || s.Errors != 2 || s.Skipped != 1 {
		t.Fatalf("count %d errors %d skipped %d, want 102, 2, 1", s.Count, s.Errors, s.Skipped)
	}
	if s.ErrorsByCode[CodeTimeout] != 1 || s.ErrorsByCode[CodeBacklog] != 1 {
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
	r := NewRecorder(OpRenew, 0)
	r.Record(10*time.Millisecond, CodeOK)
	r.Record(20*time.Millisecond, streamsLocked)
	p := r.Tick(1, time.Second, false)
	if p.Count != 2 || p.Errors != 1 || p.Rate != 2 || p.Max < 19.9 {
		t.Fatalf("first interval %+v", p)
	}
	p = r.Tick(2, 500*time.Millisecond, false)
	if p.Count != 0 || p.P99 != 0 {
		t.Fatalf("second interval not empty: %+v", p)
	}
	if len(r.Points()) != 2 {
		t.Fatalf("%d points, want 2", len(r.Points()))
	}
}

const streamsLocked = "locked"

func TestRecorderClampsOutOfRange(t *testing.T) {
	r := NewRecorder(OpAcquire, 0)
	r.Record(-time.Second, CodeOK)
	r.Record(time.Hour, CodeOK)
	s := r.Summary(time.Second)
	if s.Count != 2 || s.Max < 599_000 {
		t.Fatalf("out-of-range latencies not clamped: %+v", s)
	}
}
