package service

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/streams"
)

var resultCodes = []string{"ok", streams.CodeInvalidRequest, streams.CodeLocked, streams.CodeLeaseLost,
	streams.CodeTooManyWaiters, streams.CodeUnavailable, streams.CodeInternal}

// metrics are the service's Prometheus metrics, plus per-endpoint result
// counts that `nats micro stats jetlock` shows as endpoint data.
type metrics struct {
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	expired   prometheus.Counter
	conflicts prometheus.Counter
	wakes     prometheus.Counter
	following prometheus.Gauge
	shedCount *prometheus.CounterVec
	queued    prometheus.Gauge

	counts map[string][]atomic.Int64 // op -> index in resultCodes
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetlock_requests_total", Help: "Requests answered, by operation and result code.",
		}, []string{"op", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "jetlock_request_duration_seconds", Help: "Time from receipt to reply, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"op"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetlock_leases_expired_total", Help: "Leases deleted by the expiry sweeper.",
		}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetlock_cas_conflicts_total", Help: "Compare-and-set writes that lost a race and were decided again.",
		}),
		wakes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetlock_wakes_total", Help: "Wake messages sent to head waiters.",
		}),
		following: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetlock_following_writes", Help: "1 while this instance follows every write to the bucket (another instance serves it too), else 0.",
		}),
		shedCount: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetlock_requests_shed_total", Help: "Requests answered unavailable without being processed, by operation and reason: queue_full (MaxQueued were waiting) or waited (longer than QueueWait).",
		}, []string{"op", "reason"}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetlock_requests_queued", Help: "Requests waiting for one of the MaxInFlight places.",
		}),
		counts: map[string][]atomic.Int64{},
	}
	for _, op := range streams.Operations {
		m.counts[op] = make([]atomic.Int64, len(resultCodes))
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.latency, m.expired, m.conflicts, m.wakes, m.following, m.shedCount, m.queued} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) observe(op, code string, d time.Duration) {
	if code == "" {
		code = "ok"
	}
	m.requests.WithLabelValues(op, code).Inc()
	m.latency.WithLabelValues(op).Observe(d.Seconds())
	if cs, ok := m.counts[op]; ok {
		for i, c := range resultCodes {
			if c == code {
				cs[i].Add(1)
			}
		}
	}
}

// shed counts a request answered unavailable by the gate, after waiting
// for waited.
func (m *metrics) shed(op, reason string, waited time.Duration) {
	m.shedCount.WithLabelValues(op, reason).Inc()
	m.observe(op, streams.CodeUnavailable, waited)
}

// endpointStats returns the result counts of one endpoint, keyed by code.
func (m *metrics) endpointStats(op string) map[string]int64 {
	out := map[string]int64{}
	cs := m.counts[op]
	for i := range cs {
		if n := cs[i].Load(); n > 0 {
			out[resultCodes[i]] = n
		}
	}
	return out
}
