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
	pt.sample([]proc{self})
	pt.sample([]proc{self})
	sum := pt.summary(time.Now())
	if _, ok := sum["me"]; !ok {
		t.Fatalf("summary %v lacks me", sum)
	}
	if sum["me"].Restart != 0 {
		t.Fatal("restart counted without a new pid")
	}
}

// A reading that comes late (the sampler waited on a slow request before
// reading) must not count the extra CPU time into a nominal interval.
func TestCPUShareIsOverTheTimeBetweenReadings(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prev := procSample{at: t0, cpu: 10 * time.Second}
	late := procSample{at: t0.Add(1500 * time.Millisecond), cpu: 10*time.Second + 750*time.Millisecond}
	if pct, ok := cpuShare(prev, late); !ok || pct != 50 {
		t.Fatalf("750 ms of CPU over 1.5 s: %v %v, want 50", pct, ok)
	}
	if _, ok := cpuShare(late, late); ok {
		t.Fatal("a share over no time")
	}
}

func TestMachineCPUShares(t *testing.T) {
	a, err := parseMachineStat("cpu  1000 0 200 5000 100 0 50 20 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
	if err != nil {
		t.Fatal(err)
	}
	// 200 ticks pass: 120 user, 20 system, 40 idle, 10 iowait, 10 steal.
	b, err := parseMachineStat("cpu  1120 0 220 5040 110 0 50 30 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	m := machineCPU(a, b, 2)
	want := MachineCPU{Cores: 2, BusyPct: 70, IOWaitPct: 5, IdlePct: 20, StealPct: 5}
	if m == nil || *m != want {
		t.Fatalf("shares %+v, want %+v", m, want)
	}
	if machineCPU(b, b, 2) != nil {
		t.Fatal("no time passed, yet shares were computed")
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 x 4 5 6 7 8"} {
		if _, err := parseMachineStat(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
