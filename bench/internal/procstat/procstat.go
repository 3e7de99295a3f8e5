// Package procstat reads the CPU time and memory of processes and of the
// whole machine from Linux's /proc, through github.com/prometheus/procfs.
// Elsewhere the readings fail and the reports leave them out.
package procstat

import (
	"errors"
	"time"

	"github.com/prometheus/procfs"
)

// Sample is one reading of a process's CPU time and memory.
type Sample struct {
	At  time.Time     // when CPU was read
	CPU time.Duration // user + system time so far
	RSS int64         // resident set, bytes
	HWM int64         // peak resident set, bytes
}

// Read reads /proc/<pid>/stat and /proc/<pid>/status.
func Read(pid int) (Sample, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return Sample{}, err
	}
	return read(fs, pid)
}

func read(fs procfs.FS, pid int) (Sample, error) {
	p, err := fs.Proc(pid)
	if err != nil {
		return Sample{}, err
	}
	stat, err := p.Stat()
	if err != nil {
		return Sample{}, err
	}
	s := Sample{At: time.Now(), CPU: time.Duration(stat.CPUTime() * float64(time.Second))}
	status, err := p.NewStatus()
	s.RSS, s.HWM = int64(status.VmRSS), int64(status.VmHWM)
	return s, err
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
	prev  map[string]Sample
	cpu   map[string]time.Duration
	sum   map[string]*Summary
}

// NewTracker returns a tracker whose averages count from start.
func NewTracker(start time.Time) *Tracker {
	return &Tracker{start: start, prev: map[string]Sample{}, cpu: map[string]time.Duration{}, sum: map[string]*Summary{}}
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
			sum = &Summary{PID: p.PID}
			t.sum[p.Name] = sum
		}
		prev, seen := t.prev[p.Name]
		if seen && sum.PID != p.PID {
			seen = false // restarted: its CPU time starts again from zero
			sum.Restarts++
		}
		if seen {
			t.cpu[p.Name] += s.CPU - prev.CPU
			if pct, ok := Share(prev, s); ok {
				out[p.Name] = pct
			}
		}
		t.prev[p.Name] = s
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

// MachineSample is one reading of the "cpu" line of /proc/stat: the
// machine's CPU time in seconds, summed over all cores, by state.
type MachineSample struct {
	idle, iowait, steal, total float64
}

// ReadMachine reads /proc/stat.
func ReadMachine() (MachineSample, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return MachineSample{}, err
	}
	return readMachine(fs)
}

// readMachine sums user nice system idle iowait irq softirq steal (guest
// time is already in user).
func readMachine(fs procfs.FS) (MachineSample, error) {
	st, err := fs.Stat()
	if err != nil {
		return MachineSample{}, err
	}
	c := st.CPUTotal
	s := MachineSample{idle: c.Idle, iowait: c.Iowait, steal: c.Steal,
		total: c.User + c.Nice + c.System + c.Idle + c.Iowait + c.IRQ + c.SoftIRQ + c.Steal}
	if s.total <= 0 {
		return MachineSample{}, errors.New("no cpu line in /proc/stat")
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
	pct := func(v float64) float64 { return round2(100 * v / d) }
	idle, iow, steal := b.idle-a.idle, b.iowait-a.iowait, b.steal-a.steal
	return &MachineCPU{Cores: cores, BusyPct: pct(d - idle - iow - steal), IOWaitPct: pct(iow), IdlePct: pct(idle), StealPct: pct(steal)}
}

// Host returns the machine's CPU model (Linux only) and memory in bytes,
// each zero when unknown.
func Host() (cpu string, mem uint64) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return "", 0
	}
	if mi, err := fs.Meminfo(); err == nil && mi.MemTotalBytes != nil {
		mem = *mi.MemTotalBytes
	}
	return cpuModel(fs), mem
}

func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }
