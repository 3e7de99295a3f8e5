package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// grantTimes records when each successful acquire was sent and answered,
// for the failover report. A nil *grantTimes records nothing.
type grantTimes struct {
	mu   sync.Mutex
	sent []time.Time
	recv []time.Time
}

func (g *grantTimes) add(sent, recv time.Time) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.sent = append(g.sent, sent)
	g.recv = append(g.recv, recv)
	g.mu.Unlock()
}

// Event marks a moment in a phase (a node killed, a ramp step).
type Event struct {
	T    float64 `json:"t"` // seconds since phase start
	What string  `json:"what"`
}

// seriesPoint is one value of a time series.
type seriesPoint struct {
	T float64 `json:"t"`
	V float64 `json:"v"`
}

// phase is one measured stretch of a run: its recorders and what the
// sampler saw meanwhile.
type phase struct {
	Name          string                 `json:"name"`
	Target        string                 `json:"target"` // service or raw
	Rates         map[string]float64     `json:"target_rates,omitempty"`
	DurationS     float64                `json:"duration_s"`
	Ops           map[string]OpSummary   `json:"ops"`
	CommitsPerSec float64                `json:"commits_per_s"`
	Processes     map[string]ProcSummary `json:"processes"`
	Events        []Event                `json:"events,omitempty"`
	// ServiceMs is the service's own mean time per operation, receipt to
	// reply, from its metrics (only with the service in this process).
	ServiceMs map[string]float64 `json:"service_mean_ms,omitempty"`
	// ServiceShed counts the requests the service answered unavailable
	// without processing them, by reason: waited (longer than its queue
	// wait) or queue_full (only with the service in this process).
	ServiceShed map[string]int64 `json:"service_shed,omitempty"`
	// Machine is how the whole machine's CPU time went.
	Machine *MachineCPU `json:"machine_cpu,omitempty"`

	rec     *recorders
	sched   time.Duration // scheduled length: rates are counted over it
	compact bool          // a ramp step: printed in the ramp table only
	start   time.Time
	end     time.Time
	grants  grantTimes
	commits []seriesPoint
	cpu     map[string][]seriesPoint
	evMu    sync.Mutex
}

func newPhase(name, target string) *phase {
	return &phase{Name: name, Target: target, rec: newRecorders(), cpu: map[string][]seriesPoint{}}
}

// event records what happened now.
func (p *phase) event(what string) {
	p.evMu.Lock()
	p.Events = append(p.Events, Event{T: round2(time.Since(p.start).Seconds()), What: what})
	p.evMu.Unlock()
}

// sampler takes a reading every second while a phase runs: an interval
// point for every recorder, the commit rate from the stream's last
// sequence, and the CPU and memory of the processes; and prints a
// progress line every progress interval.
type sampler struct {
	js       jetstream.JetStream
	procs    func() []proc
	progress time.Duration
	out      io.Writer
	inflight func() int64
}

type seqReading struct {
	seq uint64
	at  time.Time
}

func (s *sampler) lastSeq(ctx context.Context, stream string) (seqReading, bool) {
	ctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
	defer cancel()
	st, err := s.js.Stream(ctx, stream)
	if err != nil {
		return seqReading{}, false
	}
	info, err := st.Info(ctx)
	if err != nil {
		return seqReading{}, false
	}
	return seqReading{seq: info.State.LastSeq, at: time.Now()}, true
}

// start begins sampling ph (whose commits are writes to stream) and
// returns the function that stops it and fills in ph's summary.
func (s *sampler) start(ctx context.Context, ph *phase, stream string) (stop func()) {
	ph.start = time.Now()
	first, firstOK := s.lastSeq(ctx, stream)
	pt := newProcTracker(ph.start)
	pt.sample(s.procs())
	m0, m0err := readMachine()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var last seqReading = first
	lastOK := firstOK
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		prevTick := ph.start
		lastProgress := ph.start
		for {
			var now time.Time
			final := false
			select {
			case <-sctx.Done():
				now, final = time.Now(), true
			case now = <-t.C:
			}
			iv := now.Sub(prevTick)
			prevTick = now
			el := round2(now.Sub(ph.start).Seconds())
			stub := final && iv < 500*time.Millisecond
			pts := map[string]point{}
			for _, r := range ph.rec.all() {
				pts[r.name] = r.tick(el, iv, stub)
			}
			var commits float64 = -1
			if rd, ok := s.lastSeq(context.WithoutCancel(ctx), stream); ok {
				if lastOK && rd.seq >= last.seq && !stub {
					commits = float64(rd.seq-last.seq) / rd.at.Sub(last.at).Seconds()
					ph.commits = append(ph.commits, seriesPoint{el, round2(commits)})
				}
				if !firstOK {
					first, firstOK = rd, true
				}
				last, lastOK = rd, true
			}
			cpu := pt.sample(s.procs())
			for name, v := range cpu {
				if !stub {
					ph.cpu[name] = append(ph.cpu[name], seriesPoint{el, v})
				}
			}
			if s.out != nil && s.progress > 0 && (now.Sub(lastProgress) >= s.progress-50*time.Millisecond) && !final {
				lastProgress = now
				fmt.Fprintln(s.out, progressLine(ph.Name, el, pts, commits, cpu, s.inflight()))
			}
			if final {
				ph.end = now
				ph.DurationS = round2(now.Sub(ph.start).Seconds())
				ph.Processes = pt.summary(now)
				if m1, err := readMachine(); err == nil && m0err == nil {
					ph.Machine = machineCPU(m0, m1, runtime.NumCPU())
				}
				if firstOK && lastOK && last.at.After(first.at) {
					ph.CommitsPerSec = round2(float64(last.seq-first.seq) / last.at.Sub(first.at).Seconds())
				}
				return
			}
		}
	}()
	return func() {
		cancel()
		<-done
		d := ph.end.Sub(ph.start)
		if ph.sched > 0 && ph.sched < d {
			d = ph.sched
		}
		ph.Ops = map[string]OpSummary{}
		for _, r := range ph.rec.all() {
			ph.Ops[r.name] = r.summary(d)
		}
	}
}

// progressLine renders one line of progress.
func progressLine(name string, el float64, pts map[string]point, commits float64, cpu map[string]float64, inflight int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s %4.0fs]", name, el)
	var ops []string
	for op := range pts {
		ops = append(ops, op)
	}
	sort.Slice(ops, func(i, j int) bool { return opOrder(ops[i]) < opOrder(ops[j]) })
	var errs int64
	for _, op := range ops {
		p := pts[op]
		errs += p.Errors
		if p.Count == 0 {
			continue
		}
		fmt.Fprintf(&b, " %s %.0f/s p99 %s |", op, p.Rate, fmtMs(p.P99))
	}
	if commits >= 0 {
		fmt.Fprintf(&b, " commits %.0f/s |", commits)
	}
	fmt.Fprintf(&b, " errors %d | in flight %d", errs, inflight)
	var names []string
	for n := range cpu {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) > 0 {
		b.WriteString(" | cpu")
		for _, n := range names {
			fmt.Fprintf(&b, " %s %.0f%%", n, cpu[n])
		}
	}
	return b.String()
}

// fmtMs formats milliseconds compactly.
func fmtMs(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2fs", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0fms", v)
	default:
		return fmt.Sprintf("%.2fms", v)
	}
}
