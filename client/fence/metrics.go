package fence

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// Rejecter is the part of a guard a metrics collector reads: every Guard
// (Memory, KV, SQL) is one.
type Rejecter interface {
	// Rejected returns how many tokens the guard has rejected as stale.
	Rejected() uint64
}

// RejectedMetric is the name of the counter NewCollector exports.
const RejectedMetric = "jetlock_fence_rejected_total"

// NewCollector returns a Prometheus collector that exports, for every
// named guard, the counter jetlock_fence_rejected_total{guard="<name>"}:
// the stale fencing tokens the guard has rejected since it was created
// (its Rejected). The names become label values, so use a fixed few (one
// per protected store, say "orders-db"), never one per resource. The map
// is copied: guards added to it later are not exported. Register the
// collector once, for example
//
//	prometheus.MustRegister(fence.NewCollector(map[string]fence.Rejecter{"orders-db": sqlGuard}))
//
// A rising counter means holders that had lost their lease tried to
// write: paused processes, or clocks and TTLs set too tight.
func NewCollector(guards map[string]Rejecter) prometheus.Collector {
	c := &collector{
		desc:   prometheus.NewDesc(RejectedMetric, "Stale fencing tokens rejected by the guard.", []string{"guard"}, nil),
		names:  slices.Sorted(maps.Keys(guards)),
		guards: maps.Clone(guards),
	}
	return c
}

type collector struct {
	desc   *prometheus.Desc
	names  []string
	guards map[string]Rejecter
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, name := range c.names {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(c.guards[name].Rejected()), name)
	}
}
