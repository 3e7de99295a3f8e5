package service

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// reporter turns what the service does into metrics, audit records and
// logs. The audit log has one record per grant, renew refusal, release,
// expiry, hand-over, cancel and revoke, with fixed keys — event, resource,
// token, owner, outcome, instance, and the caller's account and user when
// the NATS server vouched for them — and never a lease id.
type reporter struct {
	m        *metrics
	hot      *hot
	audit    *slog.Logger // nil: no audit log
	log      *slog.Logger
	instance string
	// warnings limits the warnings a flood of bad requests can log.
	warnings *rate.Limiter
}

func newReporter(m *metrics, audit, log *slog.Logger, instance string) *reporter {
	return &reporter{m: m, hot: newHot(), audit: audit, log: log, instance: instance, warnings: rate.NewLimiter(10, 20)}
}

// record writes one audit record.
func (r *reporter) record(event, resource string, token uint64, owner, outcome string, who origin, attrs ...slog.Attr) {
	if r.audit == nil {
		return
	}
	all := append([]slog.Attr{slog.String("event", event), slog.String("resource", resource), slog.Uint64("token", token),
		slog.String("owner", owner), slog.String("outcome", outcome), slog.String("instance", r.instance)}, attrs...)
	if who.user != "" || who.account != "" {
		all = append(all, slog.String("account", who.account), slog.String("user", who.user))
	}
	r.audit.LogAttrs(context.Background(), slog.LevelInfo, "audit", all...)
}

// granted: a lease was granted, through an acquire or a hand-over.
func (r *reporter) granted(resource string, token uint64, owner string, who origin, via string) {
	r.record("grant", resource, token, owner, via, who)
}

// renewRefused: a renewal was answered lease_lost.
func (r *reporter) renewRefused(resource, reason string, who origin) {
	r.m.renewFailures.WithLabelValues(reason).Inc()
	r.record("renew_refused", resource, 0, "", reason, who)
}

// ended: a release, revoke, cancel or expiry ended a lease (outcome
// "ended") or found none to end ("not_held").
func (r *reporter) ended(why endReason, resource string, token uint64, owner, outcome string, who origin, attrs ...slog.Attr) {
	switch {
	case outcome != "ended":
	case why == endExpiry:
		r.m.expired.Inc()
	case why == endRevoke:
		r.m.revokes.Inc()
	}
	if why == endCancel {
		return // the cancel's own record says it
	}
	r.record(string(why), resource, token, owner, outcome, who, attrs...)
}

// session: a session was opened, closed (session_close) or expired
// (session_expiry). The audit record names its owner, never its id.
func (r *reporter) session(event, owner string, who origin) {
	r.m.sessionEvents.WithLabelValues(event).Inc()
	r.record("session_"+event, "", 0, owner, "ok", who)
}

// keptAlive: a session was kept alive, holding leases leases.
func (r *reporter) keptAlive(leases int) { r.m.sessionLeases.Observe(float64(leases)) }

// sessionBatch: n grants to one session committed together in one batch.
func (r *reporter) sessionBatch(n int) { r.m.sessionBatch.Observe(float64(n)) }

// handedOver: a lease ended with its resource granted to the head waiter.
func (r *reporter) handedOver(resource string, d time.Duration) {
	r.m.handovers.Inc()
	r.m.handoverTime.Observe(d.Seconds())
	r.record("handover", resource, 0, "", "granted", origin{})
}

// cancelled: a cancel released the request's lease, dequeued its waiter,
// or found neither.
func (r *reporter) cancelled(resource string, released, dequeued bool, who origin) {
	outcome := "nothing"
	switch {
	case released:
		outcome = "released"
	case dequeued:
		outcome = "dequeued"
	}
	r.record("cancel", resource, 0, "", outcome, who)
}

func (r *reporter) conflict() { r.m.conflicts.Inc() }

// refusedReply: a request named a reply subject the service must not
// publish on, or none (its outcome could reach nobody), and was dropped
// unexecuted.
func (r *reporter) refusedReply(op, subject string) {
	if subject == "" {
		r.m.refused.WithLabelValues(op, "no_reply").Inc()
		return
	}
	r.m.refused.WithLabelValues(op, "reply_subject").Inc()
	if r.warnings.Allow() {
		r.log.Warn("request dropped: its reply subject is one the service never publishes on", "op", op, "reply", subject)
	}
}

// foreign: a value that is not a jetlock record was seen at key.
func (r *reporter) foreign(key string, rev uint64, err error) {
	r.m.foreign.Inc()
	if r.warnings.Allow() {
		r.log.Warn("value in the bucket that jetlock did not write: it is nobody's lease", "key", key, "rev", rev, "err", err)
	}
}

// request: a request was answered with code ("" for success) d after its
// receipt.
func (r *reporter) request(op, code string, d time.Duration) { r.m.observe(op, code, d) }

// shed: a request was answered unavailable by the gate after waiting.
func (r *reporter) shed(op, reason string, waited time.Duration) {
	r.m.shedCount.WithLabelValues(op, reason).Inc()
	r.m.observe(op, "unavailable", waited)
}

// touched: an acquire of resource was answered.
func (r *reporter) touched(resource string) { r.hot.touch(resource) }

// commit: a write to the bucket took d.
func (r *reporter) commit(op string, d time.Duration) {
	r.m.commitTime.WithLabelValues(op).Observe(d.Seconds())
}

// limited: a request was refused for fair use.
func (r *reporter) limited(scope string) { r.m.rateLimited.WithLabelValues(scope).Inc() }

// hot finds the resources that get the most requests, over windows of
// hotWindow, with the Space-Saving algorithm: at most hotSlots counters,
// so its memory is bounded whatever names callers send, and a resource
// with more than 1/hotSlots of a window's requests is always among them.
type hot struct {
	mu     sync.Mutex
	counts map[string]int64
	start  time.Time
	last   []ranked // the previous full window's top
}

const (
	hotSlots  = 64
	hotWindow = time.Minute
	hotTop    = 10 // exported per scrape
)

type ranked struct {
	resource string
	n        int64
}

func newHot() *hot { return &hot{counts: make(map[string]int64, hotSlots), start: time.Now()} }

// touch counts one request for resource.
func (h *hot) touch(resource string) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.start) >= hotWindow {
		h.last = topOf(h.counts, hotTop)
		clear(h.counts)
		h.start = now
	}
	if _, ok := h.counts[resource]; ok || len(h.counts) < hotSlots {
		h.counts[resource]++
		return
	}
	// Replace the smallest counter; the newcomer inherits its count.
	var minKey string
	minN := int64(-1)
	for k, n := range h.counts {
		if minN < 0 || n < minN {
			minKey, minN = k, n
		}
	}
	delete(h.counts, minKey)
	h.counts[resource] = minN + 1
}

// top returns the top of the last full window, or of the current one
// before the first window has passed.
func (h *hot) top() []ranked {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last != nil {
		return h.last
	}
	return topOf(h.counts, hotTop)
}

// topOf returns the n largest counts, largest first.
func topOf[K ~string](m map[K]int64, n int) []ranked {
	out := make([]ranked, 0, len(m))
	for k, c := range m {
		out = append(out, ranked{resource: string(k), n: c})
	}
	slices.SortFunc(out, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.resource, b.resource))
	})
	return out[:min(n, len(out))]
}

// hotCollector exports the hottest resources by requests and by waiters,
// at most hotTop of each per scrape, and the counts of leases and waiters
// this instance knows.
type hotCollector struct {
	hot      *hot
	tracker  *tracker
	requests *prometheus.Desc
	waiters  *prometheus.Desc
	leases   *prometheus.Desc
	queued   *prometheus.Desc
	sessions *prometheus.Desc
}

func newHotCollector(h *hot, t *tracker) *hotCollector {
	return &hotCollector{hot: h, tracker: t,
		requests: prometheus.NewDesc("jetlock_hot_resource_requests", "Acquires answered for the busiest resources over the last minute (the top 10, by rank).", []string{"rank", "resource"}, nil),
		waiters:  prometheus.NewDesc("jetlock_hot_resource_waiters", "Waiters queued on the resources with the longest queues (the top 10, by rank).", []string{"rank", "resource"}, nil),
		leases:   prometheus.NewDesc("jetlock_leases_active", "Leases held, as this instance knows them.", nil, nil),
		queued:   prometheus.NewDesc("jetlock_waiters", "Waiters queued, as this instance knows them.", nil, nil),
		sessions: prometheus.NewDesc("jetlock_sessions_open", "Sessions open, as this instance knows them.", nil, nil),
	}
}

func (c *hotCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.requests
	ch <- c.waiters
	ch <- c.leases
	ch <- c.queued
	ch <- c.sessions
}

func (c *hotCollector) Collect(ch chan<- prometheus.Metric) {
	for i, r := range c.hot.top() {
		ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(r.n), strconv.Itoa(i+1), r.resource)
	}
	for i, r := range c.tracker.longestQueues(hotTop) {
		ch <- prometheus.MustNewConstMetric(c.waiters, prometheus.GaugeValue, float64(r.n), strconv.Itoa(i+1), r.resource)
	}
	leases, waiters := c.tracker.counts()
	ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(leases))
	ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(waiters))
	_, sessions := c.tracker.sessionIx.sessionCounts("")
	ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(sessions))
}
