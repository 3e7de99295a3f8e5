// Package testenv starts what jetlock's tests run against: the real
// three-node cluster (internal/devcluster) on loopback with fresh storage,
// and service instances on it. Everything is stopped by t.Cleanup.
package testenv

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jetlock/jetlock/internal/batchconn"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

// Env is a running cluster.
type Env struct {
	T       testing.TB
	Cluster *devcluster.Cluster
}

// Start starts a three-node cluster.
func Start(t testing.TB) *Env {
	t.Helper()
	c, err := devcluster.Start(devcluster.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	return &Env{T: t, Cluster: c}
}

// Connect opens a caller's connection to the cluster that reconnects
// forever.
func (e *Env) Connect() *nats.Conn {
	e.T.Helper()
	return e.ConnectAs(devcluster.Caller)
}

// ConnectAs opens a connection with the rights of role that reconnects
// forever: devcluster.Store for tests that read or write the bucket (or
// buckets of their own) directly.
func (e *Env) ConnectAs(role devcluster.Role, opts ...nats.Option) *nats.Conn {
	e.T.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(e.Cluster.URLs(), append(opts, e.Cluster.ConnectOptions(role)...)...)
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(nc.Close)
	return nc
}

// Config returns a service config for tests: short sweep interval and
// grace, quiet logs.
func Config() service.Config {
	cfg := service.DefaultConfig()
	cfg.ExpiryGrace = 500 * time.Millisecond
	cfg.SweepInterval = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return cfg
}

// Instance is a running service instance.
type Instance struct {
	Svc       *service.Service
	Conn      *nats.Conn // requests
	StoreConn *nats.Conn // the bucket
	stop      context.CancelFunc
	done      chan error
}

// Stop drains the instance and waits for Run to return.
func (i *Instance) Stop() error {
	i.stop()
	return <-i.done
}

// Serve starts a service instance with cfg on connections of its own (the
// service's two users, gathering their writes as lockd's do) and waits
// until it serves. It is stopped at cleanup.
func (e *Env) Serve(cfg service.Config) *Instance {
	e.T.Helper()
	return e.ServeOn(e.ConnectAs(devcluster.Service, batchconn.Option()), e.ConnectAs(devcluster.Store, batchconn.Option()), cfg)
}

// ServeOn starts a service instance with cfg on the connections given (see
// service.New) and waits until it serves. It is stopped at cleanup.
func (e *Env) ServeOn(nc, store *nats.Conn, cfg service.Config) *Instance {
	e.T.Helper()
	svc, err := service.New(nc, store, cfg)
	if err != nil {
		e.T.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inst := &Instance{Svc: svc, Conn: nc, StoreConn: store, stop: cancel, done: make(chan error, 1)}
	go func() { inst.done <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-inst.done:
		e.T.Fatalf("service did not start: %v", err)
	case <-time.After(60 * time.Second):
		e.T.Fatal("service not ready in 60s")
	}
	e.waitReachable()
	stopped := false
	e.T.Cleanup(func() {
		if !stopped {
			cancel()
			<-inst.done
		}
	})
	inst.stop = func() { stopped = true; cancel() }
	return inst
}

// waitReachable waits until a request sent through every node reaches a
// service instance: interest in the request subjects spreads between nodes
// asynchronously.
func (e *Env) waitReachable() {
	e.T.Helper()
	for i := 0; i < devcluster.Size; i++ {
		if e.Cluster.Server(i) == nil {
			continue
		}
		nc, err := nats.Connect(e.Cluster.ClientURL(i), e.Cluster.ConnectOptions(devcluster.Caller)...)
		if err != nil {
			e.T.Fatal(err)
		}
		Eventually(e.T, 10*time.Second, func() bool {
			_, err := nc.Request(streams.Subject(streams.DefaultPrefix, streams.OpStatus), []byte(`{"resource":"ping"}`), time.Second)
			return err == nil
		}, "service unreachable through node %d", i)
		nc.Close()
	}
}

// Eventually polls cond every 20ms until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met in %v: "+format, append([]any{timeout}, args...)...)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Metric returns the sum of the samples of metric name on reg whose labels
// include every pair in labels (for a histogram, its sample count).
func Metric(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !HasLabels(m, labels) {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// HasLabels reports whether the labels of m include every one of want.
func HasLabels(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
