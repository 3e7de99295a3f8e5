package service

import (
	"encoding/json"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// startCluster starts a fresh three-node cluster until the test ends.
func startCluster(t *testing.T) *devcluster.Cluster {
	t.Helper()
	cl, err := devcluster.Start(devcluster.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Shutdown)
	return cl
}

// runInternal runs a service with cfg on a fresh three-node cluster until
// the test ends, and returns it with a function that sends one request.
func runInternal(t *testing.T, cfg Config) (*Service, func(op string, body any) *nats.Msg) {
	t.Helper()
	s, _ := startInstance(t, startCluster(t), cfg, 0)
	return s, func(op string, body any) *nats.Msg {
		data, _ := json.Marshal(body)
		m, err := s.nc.Request(streams.Subject("jetlock", op), data, 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
}

// hold takes one of g's places, as a request being processed does, and
// returns it; release gives it back.
func hold(g *gate) *slot {
	g.mu.Lock()
	g.running++
	g.mu.Unlock()
	return &slot{g: g}
}

// Beyond MaxInFlight requests in progress the service queues MaxQueued
// more and serves them as places free; beyond those, or after QueueWait in
// the queue, it sheds load: it answers unavailable and changes nothing.
func TestLoadSheddingBeyondMaxInFlight(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxInFlight = 4
	cfg.MaxQueued = 1
	cfg.QueueWait = 300 * time.Millisecond
	s, req := runInternal(t, cfg)
	var held []*slot
	for range cfg.MaxInFlight {
		held = append(held, hold(s.gate)) // four requests in progress
	}
	queued := func() int { _, q := s.gate.load(); return q }
	unavailable := func(m *nats.Msg, what string) {
		t.Helper()
		var er streams.ErrorResponse
		if code := m.Header.Get(streams.HeaderErrorCode); code != "503" || json.Unmarshal(m.Data, &er) != nil || er.Error.Code != streams.CodeUnavailable {
			t.Fatalf("%s answered %q %s, want 503 unavailable", what, code, m.Data)
		}
	}
	free := func(resource string) {
		t.Helper()
		var st streams.StatusResponse
		m := req(streams.OpStatus, streams.StatusRequest{Resource: resource})
		if m.Header.Get(streams.HeaderErrorCode) != "" || json.Unmarshal(m.Data, &st) != nil || st.Held {
			t.Fatalf("status of %s: %s, want a free resource (the shed acquire changed nothing)", resource, m.Data)
		}
	}
	acquireAsync := func(resource string) <-chan *nats.Msg {
		ch := make(chan *nats.Msg, 1)
		data, _ := json.Marshal(streams.AcquireRequest{Resource: resource, RequestID: resource})
		go func() {
			m, err := s.nc.Request(streams.Subject("jetlock", streams.OpAcquire), data, 20*time.Second)
			if err != nil { // no reply: make it an answer the checks refuse
				m = &nats.Msg{Data: []byte(err.Error()), Header: nats.Header{}}
				m.Header.Set(streams.HeaderErrorCode, "no reply")
			}
			ch <- m
		}()
		return ch
	}

	// One more waits in the queue; the next finds the queue full.
	first := acquireAsync("queued")
	waitFor(t, 5*time.Second, func() bool { return queued() == 1 }, "the first acquire beyond the bound queues")
	unavailable(req(streams.OpAcquire, streams.AcquireRequest{Resource: "shed", RequestID: "shed"}), "an acquire beyond bound and queue")
	time.Sleep(150 * time.Millisecond) // within QueueWait
	held[0].release()
	if m := <-first; m.Header.Get(streams.HeaderErrorCode) != "" {
		t.Fatalf("the queued acquire, once a place freed: %s", m.Data)
	}
	// Its time in the metrics counts from receipt, the wait included.
	var hm dto.Metric
	_ = s.metrics.latency.WithLabelValues(streams.OpAcquire).(prometheus.Histogram).Write(&hm)
	if sum := hm.GetHistogram().GetSampleSum(); sum < 0.15 {
		t.Errorf("acquire time in the metrics %.3fs, want at least the 0.15s the queued one waited", sum)
	}

	// A request that waits longer than QueueWait is shed when its turn comes.
	held[0] = hold(s.gate)
	late := acquireAsync("late")
	waitFor(t, 5*time.Second, func() bool { return queued() == 1 }, "the acquire queues")
	time.Sleep(cfg.QueueWait + 100*time.Millisecond)
	held[1].release()
	unavailable(<-late, "an acquire that waited beyond QueueWait")

	for _, sl := range held {
		sl.release()
	}
	free("shed")
	free("late")
	if got := testCounter(s.metrics.shedCount.WithLabelValues(streams.OpAcquire, shedQueueFull)); got != 1 {
		t.Errorf("%v acquires counted shed for a full queue, want 1", got)
	}
	if got := testCounter(s.metrics.shedCount.WithLabelValues(streams.OpAcquire, shedWaited)); got != 1 {
		t.Errorf("%v acquires counted shed for waiting, want 1", got)
	}
	if m := req(streams.OpAcquire, streams.AcquireRequest{Resource: "shed", RequestID: "shed"}); m.Header.Get(streams.HeaderErrorCode) != "" {
		t.Fatalf("acquire after the places freed: %s", m.Data)
	}
}

// Workers are reused, the one idle last first, so that a steady load keeps
// only the workers it needs; the rest exit after one to two idle periods.
func TestWorkersAreReusedAndExitWhenIdle(t *testing.T) {
	const idle = 100 * time.Millisecond
	done := make(chan struct{})
	p := newWorkers(done)
	go p.reap(idle)
	// workers counts the worker goroutines, and those waiting for work.
	workers := func() (all, waiting int) {
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
		for _, g := range strings.Split(b.String(), "\n\n") {
			if strings.Contains(g, "service.(*workers).run(") {
				all++
				if strings.Contains(g, "[select") {
					waiting++
				}
			}
		}
		return all, waiting
	}

	// Five at once: five workers.
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(5)
	for range 5 {
		p.spawn(func() { started.Done(); <-release })
	}
	started.Wait()
	if n, _ := workers(); n != 5 {
		t.Fatalf("%d workers for 5 concurrent requests, want 5", n)
	}
	close(release)
	waitFor(t, 5*time.Second, func() bool { _, w := workers(); return w == 5 }, "the 5 workers to go back to waiting")

	// One request at a time, more often than the idle period: they all go
	// to the worker idle last, so the other four exit and that one stays.
	deadline := time.Now().Add(5 * time.Second)
	for n := 0; n != 1; n, _ = workers() {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers after 5s of one request at a time, want 1", n)
		}
		ran := make(chan struct{})
		p.spawn(func() { close(ran) })
		<-ran
		time.Sleep(idle / 10)
	}

	// No requests: the last worker exits too.
	waitFor(t, 5*time.Second, func() bool { n, _ := workers(); return n == 0 }, "every worker to exit")

	// After the service has finished, a worker exits as soon as it is idle.
	p.spawn(func() {})
	close(done)
	waitFor(t, 5*time.Second, func() bool { n, _ := workers(); return n == 0 }, "the worker to exit once done")
}
