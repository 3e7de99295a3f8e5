// Package devcluster runs a three-node NATS cluster with JetStream inside
// the current process (Start: the dev mode of lockd and the tests use it),
// or with each node a process of its own (StartProcs: the benchmark). Every node listens on loopback only, fsyncs every write
// (sync_interval: always), carries the tag az:a, az:b or az:c and places
// replicas with unique_tag "az:", so an R3 stream has one replica per
// zone. Routes between nodes pass through cuttable TCP proxies, so tests
// can partition the cluster. Users and accounts follow deploy/'s
// least-privilege model (see auth.go): connect with ConnectOptions.
package devcluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetlock/jetlock/internal/tcpproxy"
)

// Size is the number of nodes.
const Size = 3

// ClusterName is the NATS cluster name of the dev cluster.
const ClusterName = "jetlock-dev"

// Zones are the availability-zone tags of nodes 0, 1 and 2.
var Zones = [Size]string{"az:a", "az:b", "az:c"}

// Options configures a dev cluster.
type Options struct {
	// Dir holds each node's JetStream data in Dir/n1, Dir/n2, Dir/n3. It is
	// required; reuse it to keep state (and rising tokens) across runs.
	Dir string
	// ClientPorts are the client ports of the three nodes. The default is
	// three random free ports.
	ClientPorts []int
	// Logger, when set, receives the servers' logs. The default is none.
	Logger server.Logger
	// Debug turns on the servers' debug logging (with Logger).
	Debug bool
	// ReadyTimeout bounds the wait for the cluster (and a restarted node) to
	// be ready. The default is 30s.
	ReadyTimeout time.Duration
	// Prefix is the service's subject prefix, whose request subjects the
	// callers' account imports. The default is "jetlock".
	Prefix string
}

// Cluster is a running dev cluster. Its methods are safe for concurrent
// use.
type Cluster struct {
	opts Options
	// Ports are chosen by the servers on first start (unless given) and
	// reused on restart.
	clientPorts [Size]int
	routePorts  [Size]int
	// proxies[i][j] carries the route connections that node i opens to
	// node j.
	proxies [Size][Size]*tcpproxy.Proxy
	creds   credentials

	mu      sync.Mutex
	servers [Size]*server.Server
}

// Start starts the three nodes and waits until JetStream has a meta leader.
func Start(opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("devcluster: Options.Dir is required")
	}
	if len(opts.ClientPorts) != 0 && len(opts.ClientPorts) != Size {
		return nil, fmt.Errorf("devcluster: %d client ports given, want %d", len(opts.ClientPorts), Size)
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 30 * time.Second
	}
	if opts.Prefix == "" {
		opts.Prefix = "jetlock"
	}
	if err := CheckPorts(opts.ClientPorts); err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, creds: newCredentials()}
	if len(opts.ClientPorts) == Size {
		copy(c.clientPorts[:], opts.ClientPorts)
	}
	for i := 0; i < Size; i++ {
		for j := 0; j < Size; j++ {
			if i == j {
				continue
			}
			p, err := tcpproxy.New(func() []string { return c.routeAddr(j) })
			if err != nil {
				c.Shutdown()
				return nil, err
			}
			c.proxies[i][j] = p
		}
	}
	for i := 0; i < Size; i++ {
		if err := c.startNode(i); err != nil {
			c.Shutdown()
			return nil, err
		}
	}
	if err := c.WaitReady(); err != nil {
		c.Shutdown()
		return nil, err
	}
	c.waitStreamLeaders()
	return c, nil
}

// ErrPortInUse is returned by Start when a client port it was given is
// taken: another dev cluster, or another NATS server, is running. A server
// that cannot listen would otherwise only be found not ready after
// ReadyTimeout.
var ErrPortInUse = errors.New("port in use")

// CheckPorts returns an error matching ErrPortInUse, naming the port and
// its node, when one of the client ports (zero: any free port) cannot be
// listened on. Start checks them first.
func CheckPorts(ports []int) error {
	for i, p := range ports {
		if p == 0 {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		ln, err := net.Listen("tcp", addr)
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("devcluster: %w: %s, the client port of node %s", ErrPortInUse, addr, nodeName(i))
		}
		if err != nil {
			return fmt.Errorf("devcluster: client port of node %s: %w", nodeName(i), err)
		}
		ln.Close()
	}
	return nil
}

// waitStreamLeaders waits, at most ReadyTimeout, until every stream the
// nodes hold has a leader. After a restart on existing data, each
// stream's replicas elect a leader only once their raft election timeout
// (4 to 9 s in nats-server, not configurable) has passed; until then a
// JetStream API request about the stream gets no reply and times out. A
// fresh directory holds no stream, and this returns at once. Leaders that
// do not come are the caller's to wait for (the service retries).
func (c *Cluster) waitStreamLeaders() {
	deadline := time.Now().Add(c.opts.ReadyTimeout)
	for len(c.LeaderlessStreams()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
}

// LeaderlessStreams returns the streams (as account/stream) that a
// running node holds a replica of and knows no leader for.
func (c *Cluster) LeaderlessStreams() []string {
	var out []string
	for _, s := range c.running() {
		jsz, err := s.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
		if err != nil {
			out = append(out, s.Name()+": "+err.Error())
			continue
		}
		for _, a := range jsz.AccountDetails {
			for _, st := range a.Streams {
				if st.Cluster == nil || st.Cluster.Leader == "" {
					out = append(out, a.Name+"/"+st.Name)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// NodeOptions returns the server options of node i (see nodeSpec.options).
// A zero port in it means "any free port" (the server picks one).
func (c *Cluster) NodeOptions(i int) (*server.Options, error) {
	var routes []string
	for j := 0; j < Size; j++ {
		if j != i {
			routes = append(routes, "nats://"+c.proxies[i][j].Addr())
		}
	}
	o, err := nodeSpec{Index: i, Dir: c.opts.Dir, ClientPort: c.clientPorts[i], RoutePort: c.routePorts[i],
		Routes: routes, Prefix: c.opts.Prefix, Creds: c.creds}.options()
	if err != nil {
		return nil, err
	}
	o.NoLog, o.Debug, o.HTTPHost = c.opts.Logger == nil, c.opts.Debug, "127.0.0.1"
	return o, nil
}

func portOrRandom(p int) int {
	if p == 0 {
		return server.RANDOM_PORT
	}
	return p
}

func (c *Cluster) startNode(i int) error {
	o, err := c.NodeOptions(i)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.StoreDir, 0o755); err != nil {
		return err
	}
	s, err := server.NewServer(o)
	if err != nil {
		return fmt.Errorf("devcluster: node %s: %w", o.ServerName, err)
	}
	if c.opts.Logger != nil {
		s.SetLoggerV2(c.opts.Logger, c.opts.Debug, false, false)
	}
	s.Start()
	if !s.ReadyForConnections(c.opts.ReadyTimeout) {
		s.Shutdown()
		return fmt.Errorf("devcluster: node %s not ready for connections", o.ServerName)
	}
	c.mu.Lock()
	c.servers[i] = s
	c.clientPorts[i] = s.Addr().(*net.TCPAddr).Port
	c.routePorts[i] = s.ClusterAddr().Port
	c.mu.Unlock()
	return nil
}

// routeAddr returns node j's cluster address, or none before it first
// started.
func (c *Cluster) routeAddr(j int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.routePorts[j] == 0 {
		return nil
	}
	return []string{fmt.Sprintf("127.0.0.1:%d", c.routePorts[j])}
}

// WaitReady waits until every running node is current with a JetStream
// meta leader that sees all of them online, so that replicas can be placed
// on each.
func (c *Cluster) WaitReady() error {
	deadline := time.Now().Add(c.opts.ReadyTimeout)
	for time.Now().Before(deadline) {
		running := c.running()
		ok, leader := true, false
		for _, s := range running {
			if !s.JetStreamIsCurrent() {
				ok = false
			}
			if s.JetStreamIsLeader() {
				leader = len(s.JetStreamClusterPeers()) == len(running)
			}
		}
		if ok && leader {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("devcluster: JetStream not ready in time")
}

func (c *Cluster) running() []*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*server.Server
	for _, s := range c.servers {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

// Server returns node i's server, or nil while it is stopped.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i]
}

// ClientURL returns node i's client URL.
func (c *Cluster) ClientURL(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("nats://127.0.0.1:%d", c.clientPorts[i])
}

// URLs returns the client URLs of all nodes, comma separated, for
// nats.Connect.
func (c *Cluster) URLs() string {
	urls := make([]string, Size)
	for i := range urls {
		urls[i] = c.ClientURL(i)
	}
	return strings.Join(urls, ",")
}

// Stop shuts node i down, keeping its data. Stopping a stopped node does
// nothing.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart starts a stopped node again on the same ports and data. When a
// quorum of nodes is then running, it waits until JetStream is ready;
// otherwise (the first nodes of a whole-cluster restart) it returns once
// the node accepts connections.
func (c *Cluster) Restart(i int) error {
	if c.Server(i) != nil {
		return fmt.Errorf("devcluster: node %d is running", i)
	}
	if err := c.startNode(i); err != nil {
		return err
	}
	if len(c.running()) <= Size/2 {
		return nil
	}
	return c.WaitReady()
}

// StreamLeader returns the index of the node leading stream (in
// Account), or -1 when no running node leads it.
func (c *Cluster) StreamLeader(stream string) int {
	for i := 0; i < Size; i++ {
		if s := c.Server(i); s != nil && s.JetStreamIsStreamLeader(Account, stream) {
			return i
		}
	}
	return -1
}

// StepDown asks the leader of stream to step down, so that another node
// takes over, and waits until a different node leads it.
func (c *Cluster) StepDown(stream string) error {
	old := c.StreamLeader(stream)
	if old < 0 {
		return fmt.Errorf("devcluster: stream %s has no leader", stream)
	}
	if err := c.Server(old).JetStreamStepdownStream(Account, stream); err != nil {
		return err
	}
	deadline := time.Now().Add(c.opts.ReadyTimeout)
	for time.Now().Before(deadline) {
		if l := c.StreamLeader(stream); l >= 0 && l != old {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("devcluster: stream %s got no new leader", stream)
}

// Cut cuts the route connections that node from opens to node to (one
// direction of connection set-up).
func (c *Cluster) Cut(from, to int) { c.proxies[from][to].Cut() }

// Isolate cuts every route connection of node i, both directions. It cuts
// the proxies only: a route that route gossip set up around them (see
// Bypasses) survives, so a test that must not leak uses Partition.
func (c *Cluster) Isolate(i int) {
	for j := 0; j < Size; j++ {
		if j != i {
			c.proxies[i][j].Cut()
			c.proxies[j][i].Cut()
		}
	}
}

// Heal restores every route.
func (c *Cluster) Heal() {
	for i := 0; i < Size; i++ {
		for j := 0; j < Size; j++ {
			if i != j {
				c.proxies[i][j].Heal()
			}
		}
	}
}

// Shutdown stops every node and every proxy.
func (c *Cluster) Shutdown() {
	for i := 0; i < Size; i++ {
		c.Stop(i)
	}
	for i := 0; i < Size; i++ {
		for j := 0; j < Size; j++ {
			if p := c.proxies[i][j]; p != nil {
				p.Close()
			}
		}
	}
}
