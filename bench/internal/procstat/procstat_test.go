package procstat

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// fakeProc returns a proc file system of files, by path below it.
func fakeProc(t *testing.T, files map[string]string) procfs.FS {
	dir := t.TempDir()
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs, err := procfs.NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func TestReadProcess(t *testing.T) {
	// The command name may hold spaces and parentheses.
	fs := fakeProc(t, map[string]string{
		"1234/stat": "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100 1000000 500 18446744073709551615 " +
			"1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 1 1 1 0 0 0 0 0\n",
		"1234/status": "Name:\ta (b) c\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\n",
		"99/stat":     "garbage",
	})
	s, err := read(fs, 1234)
	if err != nil {
		t.Fatal(err)
	}
	if s.CPU != 3*time.Second { // (250 + 50) ticks at 100/s
		t.Fatalf("cpu %v, want 3s", s.CPU)
	}
	if s.RSS != 1024<<10 || s.HWM != 2048<<10 {
		t.Fatalf("rss %d hwm %d, want 1 MiB and 2 MiB", s.RSS, s.HWM)
	}
	if _, err := read(fs, 99); err == nil {
		t.Fatal("garbage parsed")
	}
}

func TestReadSelf(t *testing.T) {
	s, err := Read(os.Getpid())
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	if s.RSS <= 0 || s.HWM < s.RSS {
		t.Fatalf("rss %d hwm %d", s.RSS, s.HWM)
	}
}

func TestTrackerCountsRestartApart(t *testing.T) {
	pt := NewTracker(time.Now())
	self := Proc{Name: "me", PID: os.Getpid()}
	pt.Sample([]Proc{self})
	pt.Sample([]Proc{self})
	sum := pt.Summary(time.Now())
	if _, ok := sum["me"]; !ok {
		t.Skipf("no /proc here: summary %v", sum)
	}
	if sum["me"].Restarts != 0 {
		t.Fatal("restart counted without a new pid")
	}
	pt.Sample([]Proc{{Name: "me", PID: os.Getppid()}})
	if sum := pt.Summary(time.Now()); sum["me"].Restarts != 1 || sum["me"].PID != os.Getppid() {
		t.Fatalf("a new pid under the same name: %+v, want one restart", sum["me"])
	}
}

// A reading that comes late (the sampler waited on a slow request before
// reading) must not count the extra CPU time into a nominal interval.
func TestShareIsOverTheTimeBetweenReadings(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prev := Sample{At: t0, CPU: 10 * time.Second}
	late := Sample{At: t0.Add(1500 * time.Millisecond), CPU: 10*time.Second + 750*time.Millisecond}
	if pct, ok := Share(prev, late); !ok || pct != 50 {
		t.Fatalf("750 ms of CPU over 1.5 s: %v %v, want 50", pct, ok)
	}
	if _, ok := Share(late, late); ok {
		t.Fatal("a share over no time")
	}
}

func TestMachineShares(t *testing.T) {
	machine := func(stat string) (MachineSample, error) {
		return readMachine(fakeProc(t, map[string]string{"stat": stat}))
	}
	a, err := machine("cpu  1000 0 200 5000 100 0 50 20 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
	if err != nil {
		t.Fatal(err)
	}
	// 200 ticks pass: 120 user, 20 system, 40 idle, 10 iowait, 10 steal.
	b, err := machine("cpu  1120 0 220 5040 110 0 50 30 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	m := Machine(a, b, 2)
	want := MachineCPU{Cores: 2, BusyPct: 70, IOWaitPct: 5, IdlePct: 20, StealPct: 5}
	if m == nil || *m != want {
		t.Fatalf("shares %+v, want %+v", m, want)
	}
	if Machine(b, b, 2) != nil {
		t.Fatal("no time passed, yet shares were computed")
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 x 4 5 6 7 8"} {
		if _, err := machine(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
