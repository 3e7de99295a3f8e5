// Package procstat reads the CPU time and memory of processes and of the
// whole machine from Linux's /proc. Elsewhere the readings fail and the
// reports leave them out.
package procstat

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

// Sample is one reading of a process's CPU time and memory.
type Sample struct {
	At  time.Time     // when CPU was read
	CPU time.Duration // user + system time so far
	RSS int64         // resident set, bytes
	HWM int64         // peak resident set, bytes
}

// Read reads /proc/<pid>/stat and /proc/<pid>/status.
func Read(pid int) (Sample, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Sample{}, err
	}
	cpu, err := ParseStatCPU(string(b))
	if err != nil {
		return Sample{}, err
	}
	s := Sample{At: time.Now(), CPU: cpu}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && (k == "VmRSS" || k == "VmHWM") {
			kb, _, _ := strings.Cut(strings.TrimSpace(v), " ")
			n, _ := strconv.ParseInt(kb, 10, 64)
			if k == "VmRSS" {
				s.RSS = n << 10
			} else {
				s.HWM = n << 10
			}
		}
	}
	return s, sc.Err()
}

// ParseStatCPU returns utime + stime from the content of /proc/<pid>/stat.
// The command name (field 2) may hold spaces and parentheses, so fields
// are counted from the last ')'.
func ParseStatCPU(stat string) (time.Duration, error) {
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

// Proc names a process to watch.
type Proc struct {
	Name string
	PID  int
}

// Summary is the resource use of one process over a stretch of time.
type Summary struct {
	PID        int     `json:"pid"`
	CPUPct     float64 `json:"cpu_pct"`     // average, 100 = one core
	CPUSeconds float64 `json:"cpu_seconds"` // CPU time used
	RSSMB      float64 `json:"rss_mb"`      // at the end
	PeakMB     float64 `json:"peak_rss_mb"`
	Restarts   int     `json:"restarts,omitempty"`
}

// Tracker accumulates CPU time per process name across samples, so that a
// process restarted under a new pid keeps one account. It is not safe for
// concurrent use.
type Tracker struct {
	start time.Time
	last  map[string]int // pid
	prev  map[string]Sample
	cpu   map[string]time.Duration
	sum   map[string]*Summary
}

// NewTracker returns a tracker whose averages count from start.
func NewTracker(start time.Time) *Tracker {
	return &Tracker{start: start, last: map[string]int{}, prev: map[string]Sample{}, cpu: map[string]time.Duration{},
		sum: map[string]*Summary{}}
}

// Sample reads every process and returns each one's CPU use since the
// previous sample, in percent of one core over the time between the two
// readings (not a nominal tick: a reading that comes late would otherwise
// count more CPU time into one tick).
func (t *Tracker) Sample(ps []Proc) map[string]float64 {
	out := map[string]float64{}
	for _, p := range ps {
		s, err := Read(p.PID)
		if err != nil {
			continue
		}
		sum := t.sum[p.Name]
		if sum == nil {
			sum = &Summary{}
			t.sum[p.Name] = sum
		}
		prev, seen := t.prev[p.Name]
		if pid, ok := t.last[p.Name]; ok && pid != p.PID {
			seen = false // restarted: its CPU time starts again from zero
			sum.Restarts++
		}
		if seen {
			t.cpu[p.Name] += s.CPU - prev.CPU
			if pct, ok := Share(prev, s); ok {
				out[p.Name] = pct
			}
		}
		t.last[p.Name], t.prev[p.Name] = p.PID, s
		sum.PID = p.PID
		sum.RSSMB = round2(float64(s.RSS) / (1 << 20))
		sum.PeakMB = max(sum.PeakMB, round2(float64(s.HWM)/(1<<20)))
	}
	return out
}

// Share is the CPU a process used between two readings, in percent of one
// core over the time between them; ok is false when no time passed.
func Share(prev, cur Sample) (pct float64, ok bool) {
	iv := cur.At.Sub(prev.At)
	if iv <= 0 {
		return 0, false
	}
	return round2(100 * (cur.CPU - prev.CPU).Seconds() / iv.Seconds()), true
}

// Summary returns the per-process summary, CPU averaged up to now.
func (t *Tracker) Summary(now time.Time) map[string]Summary {
	out := map[string]Summary{}
	el := now.Sub(t.start).Seconds()
	for name, s := range t.sum {
		v := *s
		v.CPUSeconds = round2(t.cpu[name].Seconds())
		if el > 0 {
			v.CPUPct = round2(100 * t.cpu[name].Seconds() / el)
		}
		out[name] = v
	}
	return out
}

// MachineSample is one reading of the first line of /proc/stat: the
// machine's CPU time in ticks, summed over all cores, by state.
type MachineSample struct {
	idle, iowait, steal, total int64
}

// ReadMachine reads /proc/stat.
func ReadMachine() (MachineSample, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return MachineSample{}, err
	}
	return ParseMachineStat(string(b))
}

// ParseMachineStat reads the "cpu" line of /proc/stat: user nice system
// idle iowait irq softirq steal (guest time is already in user).
func ParseMachineStat(stat string) (MachineSample, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return MachineSample{}, fmt.Errorf("malformed /proc/stat line %q", line)
	}
	var v [8]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return MachineSample{}, fmt.Errorf("bad /proc/stat field %q: %w", f[i+1], err)
		}
		v[i] = n
	}
	s := MachineSample{idle: v[3], iowait: v[4], steal: v[7]}
	for _, n := range v {
		s.total += n
	}
	return s, nil
}

// MachineCPU is how the whole machine's CPU time went over a stretch of
// time, in percent of all its cores: busy (running anything), iowait,
// idle, and steal (taken by the hypervisor for other guests: a virtual
// machine that is slower than usual shows it here).
type MachineCPU struct {
	Cores     int     `json:"cores"`
	BusyPct   float64 `json:"busy_pct"`
	IOWaitPct float64 `json:"iowait_pct"`
	IdlePct   float64 `json:"idle_pct"`
	StealPct  float64 `json:"steal_pct"`
}

// Machine returns the shares of the time between a and b, or nil when no
// time passed.
func Machine(a, b MachineSample, cores int) *MachineCPU {
	d := b.total - a.total
	if d <= 0 {
		return nil
	}
	pct := func(n int64) float64 { return round2(100 * float64(n) / float64(d)) }
	idle, iow, steal := b.idle-a.idle, b.iowait-a.iowait, b.steal-a.steal
	return &MachineCPU{Cores: cores, BusyPct: pct(d - idle - iow - steal), IOWaitPct: pct(iow), IdlePct: pct(idle), StealPct: pct(steal)}
}

func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }
