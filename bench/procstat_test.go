package main

import (
	"os"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// The command name may hold spaces and parentheses.
	stat := "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100 1000000 500 18446744073709551615"
	cpu, err := parseStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if cpu != 3*time.Second { // (250 + 50) ticks at 100/s
		t.Fatalf("cpu %v, want 3s", cpu)
	}
	if _, err := parseStatCPU("garbage"); err == nil {
		t.Fatal("garbage parsed")
	}
}

func TestReadProcSelf(t *testing.T) {
	s, err := readProc(os.Getpid())
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	if s.rss <= 0 || s.hwm < s.rss {
		t.Fatalf("rss %d hwm %d", s.rss, s.hwm)
	}
}

func TestProcTrackerCountsRestartApart(t *testing.T) {
	pt := newProcTracker(time.Now())
	self := proc{name: "me", pid: os.Getpid()}
	pt.sample([]proc{self}, 0)
	pt.sample([]proc{self}, time.Second)
	sum := pt.summary(time.Now())
	if _, ok := sum["me"]; !ok {
		t.Fatalf("summary %v lacks me", sum)
	}
	if sum["me"].Restart != 0 {
		t.Fatal("restart counted without a new pid")
	}
}
