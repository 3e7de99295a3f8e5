package main

import (
	"sort"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram range: 1µs to 10 minutes at 3 significant digits. Latencies
// are recorded in microseconds; larger ones are clamped to the maximum.
const (
	histMin    = 1
	histMax    = int64(10 * time.Minute / time.Microsecond)
	histDigits = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histDigits) }

// codeOK is the outcome of a successful operation.
const codeOK = "ok"

// recorder collects the outcomes of one operation kind in one phase: a
// histogram of every latency, counts by outcome, and an interval histogram
// that the sampler turns into one point of the latency-over-time series
// each second. It is safe for concurrent use.
type recorder struct {
	name       string
	targetRate float64

	mu       sync.Mutex
	total    *hdrhistogram.Histogram
	interval *hdrhistogram.Histogram
	count    int64
	errs     int64
	byCode   map[string]int64
	skipped  int64 // intended sends that had nothing to act on
	ivCount  int64
	ivErrs   int64
	series   []point
}

// point is one interval of the latency-over-time series.
type point struct {
	T      float64 `json:"t"` // seconds since phase start, end of interval
	Count  int64   `json:"count"`
	Errors int64   `json:"errors"`
	Rate   float64 `json:"rate"`
	P50    float64 `json:"p50_ms"`
	P99    float64 `json:"p99_ms"`
	Max    float64 `json:"max_ms"`
}

func newRecorder(name string, targetRate float64) *recorder {
	return &recorder{name: name, targetRate: targetRate, total: newHist(), interval: newHist(), byCode: map[string]int64{}}
}

func micros(d time.Duration) int64 {
	us := d.Microseconds()
	if us < histMin {
		us = histMin
	}
	if us > histMax {
		us = histMax
	}
	return us
}

// record adds one completed operation: its latency (from the intended send
// time) and its outcome code (codeOK or an error code).
func (r *recorder) record(lat time.Duration, code string) {
	us := micros(lat)
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.total.RecordValue(us)
	_ = r.interval.RecordValue(us)
	r.count++
	r.ivCount++
	if code != codeOK {
		r.errs++
		r.ivErrs++
		r.byCode[code]++
	}
}

// fail counts an operation that was never sent (for example backlog): an
// error without a latency.
func (r *recorder) fail(code string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.count++
	r.ivCount++
	r.errs++
	r.ivErrs++
	r.byCode[code]++
}

// skip counts an intended send that had nothing to act on (no free
// resource, no held lease).
func (r *recorder) skip() {
	r.mu.Lock()
	r.skipped++
	r.mu.Unlock()
}

// tick closes the current interval, of length iv, ending t seconds into
// the phase, and adds it to the series unless drop (a stub of an interval
// at the end of a phase, whose rate would mislead).
func (r *recorder) tick(t float64, iv time.Duration, drop ...bool) point {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := point{T: t, Count: r.ivCount, Errors: r.ivErrs, Rate: float64(r.ivCount) / iv.Seconds()}
	if r.interval.TotalCount() > 0 {
		p.P50 = ms(r.interval.ValueAtQuantile(50))
		p.P99 = ms(r.interval.ValueAtQuantile(99))
		p.Max = ms(r.interval.Max())
	}
	r.interval.Reset()
	r.ivCount, r.ivErrs = 0, 0
	if len(drop) == 0 || !drop[0] {
		r.series = append(r.series, p)
	}
	return p
}

func ms(us int64) float64 { return float64(us) / 1000 }

// OpSummary is the summary of one operation kind, as written to JSON.
type OpSummary struct {
	Count        int64            `json:"count"`
	Errors       int64            `json:"errors"`
	ErrorsByCode map[string]int64 `json:"errors_by_code"`
	Rate         float64          `json:"rate"`
	TargetRate   float64          `json:"target_rate,omitempty"`
	P50          float64          `json:"p50_ms"`
	P95          float64          `json:"p95_ms"`
	P99          float64          `json:"p99_ms"`
	P999         float64          `json:"p999_ms"`
	Max          float64          `json:"max_ms"`
	Skipped      int64            `json:"skipped,omitempty"`
}

// summary summarises the recorder over a phase of length d.
func (r *recorder) summary(d time.Duration) OpSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := OpSummary{Count: r.count, Errors: r.errs, ErrorsByCode: map[string]int64{}, TargetRate: r.targetRate, Skipped: r.skipped}
	for k, v := range r.byCode {
		s.ErrorsByCode[k] = v
	}
	if d > 0 {
		s.Rate = round2(float64(r.count) / d.Seconds())
	}
	if r.total.TotalCount() > 0 {
		s.P50 = ms(r.total.ValueAtQuantile(50))
		s.P95 = ms(r.total.ValueAtQuantile(95))
		s.P99 = ms(r.total.ValueAtQuantile(99))
		s.P999 = ms(r.total.ValueAtQuantile(99.9))
		s.Max = ms(r.total.Max())
	}
	return s
}

func (r *recorder) points() []point {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]point(nil), r.series...)
}

func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

// recorders is the set of recorders of one phase, by operation name.
type recorders struct {
	mu sync.Mutex
	m  map[string]*recorder
}

func newRecorders() *recorders { return &recorders{m: map[string]*recorder{}} }

// get returns the recorder of op, creating it (with targetRate) on first
// use.
func (rs *recorders) get(op string, targetRate float64) *recorder {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r := rs.m[op]
	if r == nil {
		r = newRecorder(op, targetRate)
		rs.m[op] = r
	}
	return r
}

func (rs *recorders) all() []*recorder {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make([]*recorder, 0, len(rs.m))
	for _, r := range rs.m {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return opOrder(out[i].name) < opOrder(out[j].name) })
	return out
}

// opOrder orders operations in tables: the contract's order, then the rest
// by name.
func opOrder(op string) string {
	for i, o := range []string{"acquire", "renew", "release", "wait_acquire", "acquire_retry", "poll_acquire"} {
		if o == op {
			return string(rune('0' + i))
		}
	}
	return "z" + op
}
