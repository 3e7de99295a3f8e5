package load

import (
	"cmp"
	"slices"
	"strings"
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

// Recorder collects the outcomes of one operation kind in one phase: a
// histogram of every latency, counts by outcome, and an interval histogram
// that Tick turns into one point of the latency-over-time series. It is
// safe for concurrent use.
type Recorder struct {
	Name       string
	targetRate float64

	mu              sync.Mutex
	total, interval *hdrhistogram.Histogram
	count, errs     int64
	ivCount, ivErrs int64
	byCode          map[string]int64
	skipped         int64 // intended sends that had nothing to act on
	series          []Point
}

// Point is one interval of the latency-over-time series.
type Point struct {
	T      float64 `json:"t"` // seconds since phase start, end of interval
	Count  int64   `json:"count"`
	Errors int64   `json:"errors"`
	Rate   float64 `json:"rate"`
	P50    float64 `json:"p50_ms"`
	P99    float64 `json:"p99_ms"`
	Max    float64 `json:"max_ms"`
}

// NewRecorder returns an empty recorder of op, whose schedule aims at
// targetRate per second (0: closed loop).
func NewRecorder(op string, targetRate float64) *Recorder {
	return &Recorder{Name: op, targetRate: targetRate, byCode: map[string]int64{},
		total: hdrhistogram.New(histMin, histMax, histDigits), interval: hdrhistogram.New(histMin, histMax, histDigits)}
}

// Record adds one completed operation: its latency and its outcome code
// (CodeOK or an error code).
func (r *Recorder) Record(lat time.Duration, code string) {
	us := min(max(lat.Microseconds(), histMin), histMax)
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.total.RecordValue(us)
	_ = r.interval.RecordValue(us)
	r.counted(code)
}

// Fail counts an operation that was never sent (backlog, say): an error
// without a latency.
func (r *Recorder) Fail(code string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counted(code)
}

// counted counts an operation of outcome code. The caller holds r.mu.
func (r *Recorder) counted(code string) {
	r.count++
	r.ivCount++
	if code != CodeOK {
		r.errs++
		r.ivErrs++
		r.byCode[code]++
	}
}

// Skip counts an intended send that had nothing to act on (no free
// resource, no held lease).
func (r *Recorder) Skip() {
	r.mu.Lock()
	r.skipped++
	r.mu.Unlock()
}

// Tick closes the current interval, of length iv, ending t seconds into
// the phase, and adds it to the series unless drop (a stub of an interval
// at the end of a phase, whose rate would mislead).
func (r *Recorder) Tick(t float64, iv time.Duration, drop bool) Point {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := Point{T: t, Count: r.ivCount, Errors: r.ivErrs, Rate: float64(r.ivCount) / iv.Seconds()}
	if r.interval.TotalCount() > 0 {
		p.P50, p.P99, p.Max = ms(r.interval.ValueAtQuantile(50)), ms(r.interval.ValueAtQuantile(99)), ms(r.interval.Max())
	}
	r.interval.Reset()
	r.ivCount, r.ivErrs = 0, 0
	if !drop {
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

// Answered returns how many operations got an answer: all but those
// that timed out, found nobody listening or were never sent.
func (s OpSummary) Answered() int64 {
	n := s.Count
	for _, c := range []string{CodeTimeout, CodeBacklog, CodeNoResponders, CodePublish} {
		n -= s.ErrorsByCode[c]
	}
	return n
}

// Summary summarises the recorder over a phase of length d.
func (r *Recorder) Summary(d time.Duration) OpSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := OpSummary{Count: r.count, Errors: r.errs, ErrorsByCode: map[string]int64{}, TargetRate: r.targetRate, Skipped: r.skipped}
	for k, v := range r.byCode {
		s.ErrorsByCode[k] = v
	}
	if d > 0 {
		s.Rate = Round2(float64(r.count) / d.Seconds())
	}
	if r.total.TotalCount() > 0 {
		h := r.total
		s.P50, s.P95, s.P99 = ms(h.ValueAtQuantile(50)), ms(h.ValueAtQuantile(95)), ms(h.ValueAtQuantile(99))
		s.P999, s.Max = ms(h.ValueAtQuantile(99.9)), ms(h.Max())
	}
	return s
}

// Points returns the latency-over-time series.
func (r *Recorder) Points() []Point {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.series)
}

// Round2 rounds f to two decimals.
func Round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

// Recorders is the set of recorders of one phase, by operation name. It is
// safe for concurrent use.
type Recorders struct {
	mu sync.Mutex
	m  map[string]*Recorder
}

// NewRecorders returns an empty set.
func NewRecorders() *Recorders { return &Recorders{m: map[string]*Recorder{}} }

// Get returns the recorder of op, creating it (with targetRate) on first
// use.
func (rs *Recorders) Get(op string, targetRate float64) *Recorder {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r := rs.m[op]
	if r == nil {
		r = NewRecorder(op, targetRate)
		rs.m[op] = r
	}
	return r
}

// All returns the recorders in table order (see OpOrder).
func (rs *Recorders) All() []*Recorder {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make([]*Recorder, 0, len(rs.m))
	for _, r := range rs.m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *Recorder) int { return OpOrder(a.Name, b.Name) })
	return out
}

// Operation names in reports.
const (
	OpAcquire      = "acquire"
	OpRenew        = "renew"
	OpRelease      = "release"
	OpAcquireRetry = "acquire_retry"
	OpWaitAcquire  = "wait_acquire"
	OpCycle        = "cycle"
	OpWarmup       = "warmup_acquire"
	OpCleanup      = "cleanup_release"
	// Session mode: keepalives during the load, opens and closes before
	// and after it.
	OpKeepalive    = "keepalive"
	OpSessionOpen  = "session_open"
	OpSessionClose = "session_close"
)

var opRank = map[string]int{OpAcquire: 1, OpRenew: 2, OpRelease: 3, OpKeepalive: 4, OpWaitAcquire: 5, OpAcquireRetry: 6, OpCycle: 7}

// OpOrder orders operations in tables: the contract's order, then the rest
// by name. It compares like strings.Compare.
func OpOrder(a, b string) int {
	rank := func(op string) int { return cmp.Or(opRank[op], len(opRank)+1) }
	return cmp.Or(cmp.Compare(rank(a), rank(b)), strings.Compare(a, b))
}
