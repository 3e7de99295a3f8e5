package service

import (
	"cmp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

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
		requests: prometheus.NewDesc("jetlock_hot_resource_requests", "Requests for the busiest resources over the last minute (the top 10, by rank).", []string{"rank", "resource"}, nil),
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
