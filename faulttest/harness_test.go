package faulttest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

// lockStream is the stream behind the default lock bucket.
var lockStream = streams.StreamName(streams.DefaultBucket)

// Harness is a three-node cluster with service instances and clients,
// each of which reaches NATS through its own Proxy, so that any of them
// can be paused or cut, and whose routes can be partitioned.
type Harness struct {
	T testing.TB
	C *devcluster.Cluster
	// Events, when set, records every fault injected through the harness.
	Events *History

	mu    sync.Mutex
	insts []*Instance
}

// StartHarness starts a cluster; add service instances with Serve.
func StartHarness(t testing.TB) *Harness {
	t.Helper()
	return &Harness{T: t, C: testenv.Start(t).Cluster}
}

// ServiceConfig is the service configuration of the fault tests: the test
// defaults (sweep every 50ms, expiry grace 500ms) with a request budget
// (QueueWait+OpTimeout, from receipt) of 1.5s, short enough that an answer
// comes before the callers' 2.5s timeout.
func ServiceConfig() service.Config {
	cfg := testenv.Config()
	cfg.QueueWait = 500 * time.Millisecond
	cfg.OpTimeout = time.Second
	return cfg
}

// targets lists the client addresses of every node, starting with node
// first; a proxy dials them in order.
func (h *Harness) targets(first int) func() []string {
	return func() []string {
		out := make([]string, 0, devcluster.Size)
		for k := 0; k < devcluster.Size; k++ {
			i := (first + k) % devcluster.Size
			out = append(out, strings.TrimPrefix(h.C.ClientURL(i), "nats://"))
		}
		return out
	}
}

// Connect opens a caller's connection to node (or, when it is down, the
// next one) through a new proxy. Both are closed at cleanup.
func (h *Harness) Connect(node int, name string) (*nats.Conn, *Proxy) {
	h.T.Helper()
	p := NewProxy(h.T, h.targets(node))
	return h.connectVia(p, name, devcluster.Caller), p
}

// connectVia opens a connection of role through proxy p, closed at
// cleanup.
func (h *Harness) connectVia(p *Proxy, name string, role devcluster.Role) *nats.Conn {
	h.T.Helper()
	opts := append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond), nats.ReconnectJitter(50*time.Millisecond, 0),
		nats.IgnoreDiscoveredServers(), nats.RetryOnFailedConnect(true)}, h.C.ConnectOptions(role)...)
	nc, err := nats.Connect(p.URL(), opts...)
	if err != nil {
		h.T.Fatal(err)
	}
	h.T.Cleanup(nc.Close)
	return nc
}

// Instance is a service instance whose NATS connections (requests and
// store) run through Proxy.
type Instance struct {
	Proxy     *Proxy
	Node      int
	Conn      *nats.Conn
	StoreConn *nats.Conn

	once sync.Once
	stop context.CancelFunc
	done chan error
}

// Pause freezes the instance's traffic (requests, replies and its store
// writes are held, then delivered late on Resume).
func (i *Instance) Pause() { i.Proxy.Pause() }

// Resume ends a Pause.
func (i *Instance) Resume() { i.Proxy.Resume() }

// Stop stops the instance (draining its requests) and waits at most 30s.
func (i *Instance) Stop() {
	i.once.Do(func() {
		i.Proxy.Heal()
		i.stop()
		select {
		case <-i.done:
		case <-time.After(30 * time.Second):
		}
		i.Conn.Close()
		i.StoreConn.Close()
	})
}

// Serve starts a service instance connected to node through a proxy and
// waits until it serves. It is stopped at cleanup.
func (h *Harness) Serve(node int, cfg service.Config) *Instance {
	h.T.Helper()
	p := NewProxy(h.T, h.targets(node))
	nc := h.connectVia(p, fmt.Sprintf("service@n%d", node+1), devcluster.Service)
	storeNC := h.connectVia(p, fmt.Sprintf("store@n%d", node+1), devcluster.Store)
	if dir := os.Getenv("JETLOCK_TEST_LOGDIR"); dir != "" {
		// Debugging aid: each instance logs at debug level to its own file.
		name := fmt.Sprintf("%s-n%d-%d.log", strings.ReplaceAll(h.T.Name(), "/", "_"), node+1, time.Now().UnixNano())
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			h.T.Fatal(err)
		}
		h.T.Cleanup(func() { f.Close() })
		cfg.Logger = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	svc, err := service.New(nc, storeNC, cfg)
	if err != nil {
		h.T.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inst := &Instance{Proxy: p, Node: node, Conn: nc, StoreConn: storeNC, stop: cancel, done: make(chan error, 1)}
	go func() { inst.done <- svc.Run(ctx) }()
	h.T.Cleanup(inst.Stop)
	select {
	case <-svc.Ready():
	case err := <-inst.done:
		h.T.Fatalf("service did not start: %v", err)
	case <-time.After(60 * time.Second):
		h.T.Fatal("service not ready in 60s")
	}
	h.mu.Lock()
	h.insts = append(h.insts, inst)
	h.mu.Unlock()
	h.WaitReachable(30 * time.Second)
	return inst
}

// Instances returns the service instances started so far.
func (h *Harness) Instances() []*Instance {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*Instance(nil), h.insts...)
}

// WaitReachable waits until a status request sent through every running
// node is answered without error.
func (h *Harness) WaitReachable(timeout time.Duration) {
	h.T.Helper()
	for _, i := range h.C.Running() {
		nc, err := nats.Connect(h.C.ClientURL(i), append(h.C.ConnectOptions(devcluster.Caller), nats.IgnoreDiscoveredServers())...)
		if err != nil {
			h.T.Fatal(err)
		}
		testenv.Eventually(h.T, timeout, func() bool {
			m, err := nc.Request(streams.Subject(streams.DefaultPrefix, streams.OpStatus), []byte(`{"resource":"ping"}`), time.Second)
			return err == nil && m.Header.Get(streams.HeaderErrorCode) == ""
		}, "service unreachable through node %d", i)
		nc.Close()
	}
}

// CrashAll stops every node at once, keeping data; RestartAll brings them
// back and waits until the service answers through every node.
func (h *Harness) CrashAll() {
	h.Events.Event("crash all nodes")
	h.C.StopAll()
}

// RestartAll restarts every stopped node and waits for the service.
func (h *Harness) RestartAll() {
	h.T.Helper()
	h.Events.Event("restart all nodes")
	if err := h.C.RestartAll(); err != nil {
		h.T.Fatal(err)
	}
	h.WaitReachable(60 * time.Second)
	h.Events.Event("cluster serving again")
}

// StepDown moves the lock stream's leadership to another node.
func (h *Harness) StepDown() error {
	err := h.C.StepDown(lockStream)
	h.Events.Event("leader step-down: now node %d, err %v", h.C.StreamLeader(lockStream), err)
	return err
}

// Isolate cuts node i off from the other nodes.
func (h *Harness) Isolate(i int) {
	h.Events.Event("isolate node %d (leader %d)", i, h.C.StreamLeader(lockStream))
	h.partition([]int{i})
}

// partition partitions the cluster (see devcluster.Partition: nodes that
// hold routes gossiped around the proxies are restarted) and fails the
// test if the partition cannot be enforced.
func (h *Harness) partition(groups ...[]int) {
	h.T.Helper()
	restarted, err := h.C.Partition(groups...)
	if len(restarted) > 0 {
		h.Events.Event("restarted nodes %v to drop routes that bypassed the proxies", restarted)
	}
	if err != nil {
		h.T.Fatal(err)
	}
}

// IsolateLeader cuts the lock stream's leader off from the other nodes and
// waits until they elect a new leader. It returns the isolated node.
func (h *Harness) IsolateLeader() (int, error) {
	old, err := h.C.IsolateStreamLeader(lockStream)
	if err != nil {
		return -1, err
	}
	h.Events.Event("isolated leader node %d", old)
	l, err := h.C.WaitStreamLeader(lockStream, 30*time.Second, old)
	if err != nil {
		err = fmt.Errorf("%w (%s)", err, h.streamState())
	}
	h.Events.Event("new leader node %d, err %v", l, err)
	return old, err
}

// streamState describes each node's view of the lock stream.
func (h *Harness) streamState() string {
	var b strings.Builder
	for i := 0; i < devcluster.Size; i++ {
		if s := h.C.Server(i); s == nil {
			fmt.Fprintf(&b, "n%d down; ", i)
		} else {
			fmt.Fprintf(&b, "n%d leader=%v current=%v; ", i,
				s.JetStreamIsStreamLeader(devcluster.Account, lockStream), s.JetStreamIsStreamCurrent(devcluster.Account, lockStream))
		}
	}
	return b.String()
}

// WaitCurrent waits until every running node has a current replica of the
// lock stream and one of them leads it, as after a fault has been
// repaired. It reports whether that happened within timeout.
func (h *Harness) WaitCurrent(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ok, leader := true, false
		for _, i := range h.C.Running() {
			if s := h.C.Server(i); s != nil {
				ok = ok && s.JetStreamIsStreamCurrent(devcluster.Account, lockStream)
				leader = leader || s.JetStreamIsStreamLeader(devcluster.Account, lockStream)
			}
		}
		if ok && leader {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.Events.Event("stream not current in %v: %s", timeout, h.streamState())
	return false
}

// IsolateAll cuts every route: no side has a quorum. It returns once no
// route crosses the partition (see devcluster.Partition).
func (h *Harness) IsolateAll() {
	h.Events.Event("isolate every node")
	h.partition([]int{0}, []int{1}, []int{2})
	h.Events.Event("every node isolated")
}

// Attach makes sure each of conns is connected to node, as the proxy it was
// opened through prefers: a partition that restarts node (see
// devcluster.Partition) moves the connections that reconnect while it is
// down to another node, and a request sent through a node goes to a queue
// subscriber of that node first. It reconnects each one that moved, and
// fails the test unless all are on node within d.
func (h *Harness) Attach(node int, d time.Duration, conns ...*nats.Conn) {
	h.T.Helper()
	want := h.C.Server(node).Name()
	testenv.Eventually(h.T, d, func() bool {
		on := true
		for _, nc := range conns {
			if name := nc.ConnectedServerName(); name != want {
				on = false
				if nc.IsConnected() {
					h.T.Logf("%s on %s, not on node %d: reconnect", nc.Opts.Name, name, node)
					_ = nc.ForceReconnect()
				}
			}
		}
		if !on {
			time.Sleep(200 * time.Millisecond) // a reconnect's time
		}
		return on
	}, "connections not back on node %d", node)
}

// Heal restores every route.
func (h *Harness) Heal() {
	h.Events.Event("heal routes")
	h.C.Heal()
}

// Settle heals everything and waits until the service answers through
// every node again.
func (h *Harness) Settle() {
	h.T.Helper()
	h.Heal()
	for _, inst := range h.Instances() {
		inst.Proxy.Heal()
	}
	if len(h.C.Running()) < devcluster.Size {
		h.RestartAll()
	}
	h.WaitReachable(60 * time.Second)
}
