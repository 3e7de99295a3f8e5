package main

import (
	"flag"
	"strconv"
	"time"

	"github.com/jetlock/jetlock/service"
)

// tuning is the service's overload settings the bench can change, with
// lockd's flag names: the bench registers them with a "service-" prefix,
// and the service child process (--service proc) without.
type tuning struct {
	maxInFlight, maxQueued int
	queueWait, opTimeout   time.Duration
}

// register adds the settings' flags to fs, each prefixed, with the
// service's defaults.
func (t *tuning) register(fs *flag.FlagSet, prefix string) {
	d := service.DefaultConfig()
	fs.IntVar(&t.maxInFlight, prefix+"max-in-flight", d.MaxInFlight, "service: requests processed at once (lockd --max-in-flight)")
	fs.IntVar(&t.maxQueued, prefix+"max-queued", d.MaxQueued, "service: requests waiting for a place (lockd --max-queued)")
	fs.DurationVar(&t.queueWait, prefix+"queue-wait", d.QueueWait, "service: how long a request may wait for a place (lockd --queue-wait)")
	fs.DurationVar(&t.opTimeout, prefix+"op-timeout", d.OpTimeout, "service: store work bound; a request's budget is --queue-wait plus this (lockd --op-timeout)")
}

// apply sets the settings in cfg; config.finish (before the cluster
// starts) and service.New validate them.
func (t tuning) apply(cfg *service.Config) {
	cfg.MaxInFlight, cfg.MaxQueued, cfg.QueueWait, cfg.OpTimeout = t.maxInFlight, t.maxQueued, t.queueWait, t.opTimeout
}

// args returns the flags that pass the settings to a service child.
func (t tuning) args() []string {
	return []string{"-max-in-flight", strconv.Itoa(t.maxInFlight), "-max-queued", strconv.Itoa(t.maxQueued),
		"-queue-wait", t.queueWait.String(), "-op-timeout", t.opTimeout.String()}
}

// settings adds the settings to a report's settings map.
func (t tuning) settings(m map[string]string) {
	m["service_max_in_flight"] = strconv.Itoa(t.maxInFlight)
	m["service_max_queued"] = strconv.Itoa(t.maxQueued)
	m["service_queue_wait"] = t.queueWait.String()
	m["service_op_timeout"] = t.opTimeout.String()
}
