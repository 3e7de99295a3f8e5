package service

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/streams"
)

var resultCodes = []string{"ok", streams.CodeInvalidRequest, streams.CodeLocked, streams.CodeLeaseLost,
	streams.CodeTooManyWaiters, streams.CodeForbidden, streams.CodeUnavailable, streams.CodeInternal}

// metrics are the service's Prometheus metrics, plus per-endpoint result
// counts that `nats micro stats jetlock` shows as endpoint data. Every
// label takes values from a fixed set, except the hottest resources' (at
// most hotTop of them at any scrape).
type metrics struct {
	requests      *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	shedCount     *prometheus.CounterVec
	queued        prometheus.Gauge
	refused       *prometheus.CounterVec
	rateLimited   *prometheus.CounterVec
	expired       prometheus.Counter
	renewFailures *prometheus.CounterVec
	handovers     prometheus.Counter
	handoverTime  prometheus.Histogram
	revokes       prometheus.Counter
	commitTime    *prometheus.HistogramVec
	conflicts     prometheus.Counter
	wakes         prometheus.Counter
	following     prometheus.Gauge
	foreign       prometheus.Counter
	leaderChanges prometheus.Counter
	leaderless    prometheus.Counter
	ready         prometheus.Gauge
	belowHW       prometheus.Gauge
	permission    *prometheus.CounterVec
	sessionEvents *prometheus.CounterVec
	sessionLeases prometheus.Histogram
	sessionBatch  prometheus.Histogram

	counts map[string][]atomic.Int64 // op -> index in resultCodes
}

func newMetrics() *metrics {
	latencyBuckets := prometheus.ExponentialBuckets(0.0005, 2, 16)
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetlock_requests_total", Help: "Requests answered, by operation and result code.",
		}, []string{"op", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "jetlock_request_duration_seconds", Help: "Time from receipt to reply, by operation.", Buckets: latencyBuckets,
		}, []string{"op"}),
		shedCount: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetlock_requests_shed_total", Help: "Requests answered unavailable without being processed, by operation and reason: queue_full (MaxQueued were waiting), waited (longer than QueueWait) or renewals (renewals and releases were waiting: they go first).",
		}, []string{"op", "reason"}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "jetlock_requests_queued", Help: "Requests waiting for one of the MaxInFlight places.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetlock_requests_refused_total", Help: "Requests dropped unanswered, by operation and reason: reply_subject (it named a reply subject starting with $ or with the service's prefix), no_reply (it named none: nobody could learn its outcome).",
		}, []string{"op", "reason"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetlock_rate_limited_total", Help: "Requests answered unavailable for fair use, by scope: owner (acquires per owner) or user (operations per tenant, by cost).",
		}, []string{"scope"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "jetlock_leases_expired_total", Help: "Leases ended by the expiry sweeper.",
		}),
		renewFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetlock_renew_failures_total", Help: "Renewals refused, by reason: not_current (lease_lost) or max_hold.",
		}, []string{"reason"}),
		counts: map[string][]atomic.Int64{},
	}
	for _, op := range streams.Operations {
		m.counts[op] = make([]atomic.Int64, len(resultCodes))
	}
	m.newLeaseMetrics(latencyBuckets)
	m.newInstanceMetrics()
	return m
}

// newLeaseMetrics makes the metrics of handovers, revokes, commits,
// conflicts and wakes.
func (m *metrics) newLeaseMetrics(latencyBuckets []float64) {
	m.handovers = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetlock_handovers_total", Help: "Leases ended with the resource granted to the head waiter in the same write.",
	})
	m.handoverTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "jetlock_handover_duration_seconds", Help: "Time from deciding to end a lease to the waiter's grant committed.", Buckets: latencyBuckets,
	})
	m.revokes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetlock_revokes_total", Help: "Leases ended by an operator's revoke.",
	})
	m.commitTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "jetlock_store_commit_duration_seconds", Help: "Round trip of the writes to the bucket, by kind: put, delete, confirm, tombstone, handover.", Buckets: latencyBuckets,
	}, []string{"op"})
	m.conflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetlock_cas_conflicts_total", Help: "Compare-and-set writes that lost a race and were decided again.",
	})
	m.wakes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetlock_wakes_total", Help: "Wake messages sent to waiting requests.",
	})
}

// newInstanceMetrics makes the metrics of the instance's state: following,
// the stream leader, readiness, permissions and sessions.
func (m *metrics) newInstanceMetrics() {
	m.following = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "jetlock_following_writes", Help: "1 while this instance follows every write to the bucket (another instance serves it too), else 0.",
	})
	m.foreign = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetlock_foreign_records_total", Help: "Values seen under lease. or wait. that are not complete jetlock records (they are nobody's lease).",
	})
	m.leaderChanges = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetlock_stream_leader_changes_total", Help: "Changes of the bucket stream's leader seen by this instance.",
	})
	m.leaderless = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "jetlock_stream_leaderless_seconds_total", Help: "Time the bucket's stream had no leader (or did not answer), as this instance saw it.",
	})
	m.ready = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "jetlock_ready", Help: "1 while /readyz would answer ready, else 0.",
	})
	m.belowHW = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "jetlock_stream_below_high_water", Help: "1 while grants are refused because the stream went back below the token high-water mark (recreated or restored behind the service's back).",
	})
	m.permission = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetlock_permission_errors_total", Help: "Permission violations the NATS server reported to the service, by connection: requests or store.",
	}, []string{"conn"})
	m.sessionEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jetlock_session_events_total", Help: "Sessions opened, closed and expired, by event: opened, session_close, session_expiry.",
	}, []string{"event"})
	m.sessionLeases = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "jetlock_session_leases", Help: "Leases a session held, observed at each of its keepalives.",
		Buckets: []float64{0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000},
	})
	m.sessionBatch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "jetlock_session_grants_per_commit", Help: "Grants to one session committed together in one atomic batch, observed at each batch that carried more than one and committed.",
		Buckets: []float64{2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64},
	})
}

// register registers every metric, plus the collectors of the gauges
// computed at scrape time, on reg.
func (m *metrics) register(reg prometheus.Registerer, more ...prometheus.Collector) error {
	for _, c := range append([]prometheus.Collector{m.requests, m.latency, m.shedCount, m.queued, m.refused, m.rateLimited,
		m.expired, m.renewFailures, m.handovers, m.handoverTime, m.revokes, m.commitTime, m.conflicts, m.wakes, m.following,
		m.foreign, m.leaderChanges, m.leaderless, m.ready, m.belowHW, m.permission, m.sessionEvents, m.sessionLeases, m.sessionBatch}, more...) {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
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
