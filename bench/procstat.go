package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of CPU times in /proc/<pid>/stat. It is
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// procSample is one reading of a process's CPU time and memory.
type procSample struct {
	at  time.Time     // when cpu was read
	cpu time.Duration // user + system time so far
	rss int64         // resident set, bytes
	hwm int64         // peak resident set, bytes
}

// readProc reads /proc/<pid>/stat and /proc/<pid>/status.
func readProc(pid int) (procSample, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procSample{}, err
	}
	cpu, err := parseStatCPU(string(b))
	if err != nil {
		return procSample{}, err
	}
	s := procSample{at: time.Now(), cpu: cpu}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "VmRSS:"):
			s.rss = parseKB(line)
		case strings.HasPrefix(line, "VmHWM:"):
			s.hwm = parseKB(line)
		}
	}
	return s, sc.Err()
}

// parseStatCPU returns utime + stime from the content of /proc/<pid>/stat.
// The command name (field 2) may hold spaces and parentheses, so fields
// are counted from the last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat %q", stat)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad cpu times in stat %q", stat)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

func parseKB(line string) int64 {
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.ParseInt(f[1], 10, 64)
	return n << 10
}

// proc names a process to watch.
type proc struct {
	name string
	pid  int
}

// ProcSummary is the resource use of one process over a phase.
type ProcSummary struct {
	PID     int     `json:"pid"`
	CPUPct  float64 `json:"cpu_pct"` // average, 100 = one core
	RSSMB   float64 `json:"rss_mb"`  // at the end of the phase
	PeakMB  float64 `json:"peak_rss_mb"`
	Restart int     `json:"restarts,omitempty"`
}

// procTracker accumulates CPU time per process name across samples, so
// that a node restarted under a new pid keeps one account.
type procTracker struct {
	last  map[string]proc
	prev  map[string]procSample
	cpu   map[string]time.Duration
	sum   map[string]*ProcSummary
	start time.Time
}

func newProcTracker(start time.Time) *procTracker {
	return &procTracker{last: map[string]proc{}, prev: map[string]procSample{}, cpu: map[string]time.Duration{},
		sum: map[string]*ProcSummary{}, start: start}
}

// sample reads every process and returns each one's CPU use since the
// previous sample, in percent of one core over the time between the two
// readings (not the caller's tick: a reading that comes late, after a slow
// stream info request, would otherwise count more CPU time into one tick).
func (t *procTracker) sample(ps []proc) map[string]float64 {
	out := map[string]float64{}
	for _, p := range ps {
		s, err := readProc(p.pid)
		if err != nil {
			continue
		}
		sum := t.sum[p.name]
		if sum == nil {
			sum = &ProcSummary{}
			t.sum[p.name] = sum
		}
		prev, seen := t.prev[p.name]
		if old, ok := t.last[p.name]; ok && old.pid != p.pid {
			seen = false // restarted: its CPU time starts again from zero
			sum.Restart++
		}
		if seen {
			d := s.cpu - prev.cpu
			t.cpu[p.name] += d
			if pct, ok := cpuShare(prev, s); ok {
				out[p.name] = pct
			}
		}
		t.last[p.name], t.prev[p.name] = p, s
		sum.PID = p.pid
		sum.RSSMB = round2(float64(s.rss) / (1 << 20))
		if mb := round2(float64(s.hwm) / (1 << 20)); mb > sum.PeakMB {
			sum.PeakMB = mb
		}
	}
	return out
}

// cpuShare is the CPU a process used between two readings, in percent of
// one core over the time between them.
func cpuShare(prev, cur procSample) (float64, bool) {
	iv := cur.at.Sub(prev.at)
	if iv <= 0 {
		return 0, false
	}
	return round2(100 * (cur.cpu - prev.cpu).Seconds() / iv.Seconds()), true
}

// summary returns the per-process summary, CPU averaged up to now.
func (t *procTracker) summary(now time.Time) map[string]ProcSummary {
	out := map[string]ProcSummary{}
	el := now.Sub(t.start).Seconds()
	for name, s := range t.sum {
		v := *s
		if el > 0 {
			v.CPUPct = round2(100 * t.cpu[name].Seconds() / el)
		}
		out[name] = v
	}
	return out
}

// machineSample is one reading of the first line of /proc/stat: the
// machine's CPU time in ticks, summed over all cores, by state.
type machineSample struct {
	idle, iowait, steal, total int64
}

// readMachine reads /proc/stat.
func readMachine() (machineSample, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineSample{}, err
	}
	return parseMachineStat(string(b))
}

// parseMachineStat reads the "cpu" line of /proc/stat: user nice system
// idle iowait irq softirq steal (guest time is already in user).
func parseMachineStat(stat string) (machineSample, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machineSample{}, fmt.Errorf("malformed /proc/stat line %q", line)
	}
	var v [8]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return machineSample{}, fmt.Errorf("bad /proc/stat field %q", f[i+1])
		}
		v[i] = n
	}
	s := machineSample{idle: v[3], iowait: v[4], steal: v[7]}
	for _, n := range v {
		s.total += n
	}
	return s, nil
}

// MachineCPU is how the whole machine's CPU time went during a phase, in
// percent of all its cores: busy (running anything), iowait, idle, and
// steal (taken by the hypervisor for other guests: a virtual machine that
// is slower than usual shows it here).
type MachineCPU struct {
	Cores     int     `json:"cores"`
	BusyPct   float64 `json:"busy_pct"`
	IOWaitPct float64 `json:"iowait_pct"`
	IdlePct   float64 `json:"idle_pct"`
	StealPct  float64 `json:"steal_pct"`
}

// machineCPU returns the shares of the time between a and b.
func machineCPU(a, b machineSample, cores int) *MachineCPU {
	d := b.total - a.total
	if d <= 0 {
		return nil
	}
	pct := func(n int64) float64 { return round2(100 * float64(n) / float64(d)) }
	idle, iow, steal := b.idle-a.idle, b.iowait-a.iowait, b.steal-a.steal
	return &MachineCPU{Cores: cores, BusyPct: pct(d - idle - iow - steal), IOWaitPct: pct(iow), IdlePct: pct(idle), StealPct: pct(steal)}
}
