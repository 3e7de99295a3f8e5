package devcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NodeCommand is the first argument with which StartProcs runs the current
// program as one node. A program that calls StartProcs (and a test binary
// whose tests do) begins its main with:
//
//	if len(os.Args) > 1 && os.Args[1] == devcluster.NodeCommand {
//		os.Exit(devcluster.NodeMain())
//	}
const NodeCommand = "__jetlock_node"

// ProcOptions configures a cluster of node processes.
type ProcOptions struct {
	// Dir is required: node n<i> stores its data and logs (node.log, and
	// process.log for its output) in Dir/n<i>.
	Dir string
	// Prefix is the service's subject prefix, as in Options. The default
	// is "jetlock".
	Prefix string
	// Open runs the nodes without accounts or users: every connection
	// lands in the global account with every right, as before the
	// least-privilege model (for a service that connects without
	// credentials). The default is the model of auth.go.
	Open bool
	// Out receives a line about each failed start. The default is none.
	Out io.Writer
	// ReadyTimeout bounds the wait for a node, and for JetStream. The
	// default is 60s.
	ReadyTimeout time.Duration
	// Ports draws a free loopback port. The default is FreePort.
	Ports func() (int, error)
	// Profile makes every node serve Go's profiles on a port of its own
	// (ProfileURL).
	Profile bool
}

// ProcCluster is a dev cluster whose nodes are processes of their own, so
// that each node's CPU and memory can be measured and a node can be killed
// for real. Its nodes have the same options as Start's (see nodeSpec), but
// their routes are direct: no proxies, so no partitions. Its methods are
// safe for concurrent use.
type ProcCluster struct {
	opts  ProcOptions
	creds credentials
	specs [Size]nodeSpec
	nodes [Size]*Child
}

// startAttempts bounds the starts of a process cluster: a node can fail to
// bind a port that FreePort found free, since the port is free again until
// the node listens, and another process may take it meanwhile.
const startAttempts = 3

// StartProcs starts the three nodes and waits until JetStream answers.
// When a node exits before it is ready, it moves that attempt's node
// directories (with their logs) to Dir/failed-start-N, says so on Out, and
// starts again on fresh ports, at most three times.
func StartProcs(ctx context.Context, opts ProcOptions) (*ProcCluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("devcluster: ProcOptions.Dir is required")
	}
	if opts.Prefix == "" {
		opts.Prefix = "jetlock"
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	if opts.Ports == nil {
		opts.Ports = FreePort
	}
	creds := newCredentials()
	for attempt := 1; ; attempt++ {
		c, err := startProcsOnce(ctx, opts, creds)
		if err == nil || attempt == startAttempts || ctx.Err() != nil || !errors.Is(err, ErrExited) {
			return c, err
		}
		kept := filepath.Join(opts.Dir, fmt.Sprintf("failed-start-%d", attempt))
		if merr := moveNodeDirs(opts.Dir, kept); merr != nil {
			return nil, errors.Join(err, merr)
		}
		fmt.Fprintf(opts.Out, "cluster start failed: %v; its logs are in %s; starting again on fresh ports\n", err, kept)
	}
}

func startProcsOnce(ctx context.Context, opts ProcOptions, creds credentials) (*ProcCluster, error) {
	c := &ProcCluster{opts: opts, creds: creds}
	var routes [Size]string
	for i := range c.specs {
		client, err1 := opts.Ports()
		route, err2 := opts.Ports()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		c.specs[i] = nodeSpec{Index: i, Dir: opts.Dir, ClientPort: client, RoutePort: route, Prefix: opts.Prefix, Creds: creds, Open: opts.Open}
		if opts.Profile {
			if c.specs[i].ProfPort, err1 = opts.Ports(); err1 != nil {
				return nil, err1
			}
		}
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", route)
	}
	for i := range c.specs {
		for j := range routes {
			if j != i {
				c.specs[i].Routes = append(c.specs[i].Routes, routes[j])
			}
		}
		ndir := filepath.Join(opts.Dir, nodeName(i))
		if err := os.MkdirAll(ndir, 0o755); err != nil {
			return nil, err
		}
		spec, _ := json.Marshal(c.specs[i])
		c.nodes[i] = &Child{Name: nodeName(i), Args: []string{NodeCommand}, Log: filepath.Join(ndir, "process.log"),
			Stdin: append(spec, '\n')}
	}
	// Start the nodes together: each waits for the others' routes.
	errs := make(chan error, Size)
	for i := range c.nodes {
		go func() { errs <- c.startNode(ctx, i) }()
	}
	var err error
	for range c.nodes {
		err = cmpErr(err, <-errs)
	}
	if err == nil {
		err = c.waitJetStream(ctx)
	}
	if err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// cmpErr keeps the first error, preferring one that wraps ErrExited (the
// reason to start again).
func cmpErr(first, next error) error {
	if first == nil || (next != nil && errors.Is(next, ErrExited) && !errors.Is(first, ErrExited)) {
		return next
	}
	return first
}

// moveNodeDirs moves the node directories of dir to kept.
func moveNodeDirs(dir, kept string) error {
	if err := os.MkdirAll(kept, 0o755); err != nil {
		return err
	}
	for i := 0; i < Size; i++ {
		err := os.Rename(filepath.Join(dir, nodeName(i)), filepath.Join(kept, nodeName(i)))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// startNode starts node i and waits until it accepts connections.
func (c *ProcCluster) startNode(ctx context.Context, i int) error {
	if err := c.nodes[i].Start(); err != nil {
		return err
	}
	return c.nodes[i].WaitReady(ctx, c.opts.ReadyTimeout, func() bool {
		nc, err := nats.Connect(c.ClientURL(i), append(c.ConnectOptions(Inspector), nats.Timeout(time.Second))...)
		if err != nil {
			return false
		}
		nc.Close()
		return true
	})
}

// waitJetStream waits until the JetStream meta group answers account info,
// that is until it has a leader.
func (c *ProcCluster) waitJetStream(ctx context.Context) error {
	nc, err := nats.Connect(c.URLs(), c.ConnectOptions(Inspector)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(c.opts.ReadyTimeout)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("devcluster: JetStream not ready: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago. Where
// the system says which range it draws ephemeral ports from (Linux), the
// port is drawn below that range: every outgoing connection's local port
// and every listener on port 0 come from the range, so a port taken from
// it can be taken again while a node is stopped, and its restart on the
// same port then fails.
func FreePort() (int, error) {
	if low := ephemeralLow(); low-minPort >= 1000 {
		for range 50 {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(minPort+rand.IntN(low-minPort))))
			if err == nil {
				defer l.Close()
				return l.Addr().(*net.TCPAddr).Port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// minPort is the lowest port FreePort draws below the ephemeral range.
const minPort = 10000

// ephemeralLow returns the first port of the system's ephemeral range, or
// 0 where it cannot tell.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return 0
	}
	return low
}

// Open reports whether the cluster runs without accounts (ProcOptions.Open).
func (c *ProcCluster) Open() bool { return c.opts.Open }

// ConnectOptions returns the options a connection of role needs, as
// Cluster.ConnectOptions does; with Open only the inbox prefix.
func (c *ProcCluster) ConnectOptions(r Role) []nats.Option {
	opts := []nats.Option{nats.CustomInboxPrefix(InboxPrefix(r))}
	if !c.opts.Open && r != Caller {
		opts = append(opts, nats.UserInfo(userNames[r], c.creds[r]))
	}
	return opts
}

// User returns the user name and password of role; both are empty with
// Open.
func (c *ProcCluster) User(r Role) (user, password string) {
	if c.opts.Open {
		return "", ""
	}
	return userNames[r], c.creds[r]
}

// ClientURL returns node i's client URL.
func (c *ProcCluster) ClientURL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.specs[i].ClientPort)
}

// URLs returns the client URLs of all nodes, comma separated.
func (c *ProcCluster) URLs() string {
	urls := make([]string, Size)
	for i := range urls {
		urls[i] = c.ClientURL(i)
	}
	return strings.Join(urls, ",")
}

// Name returns node i's server name.
func (c *ProcCluster) Name(i int) string { return nodeName(i) }

// Node returns the index of the node named name, or -1.
func (c *ProcCluster) Node(name string) int {
	for i := 0; i < Size; i++ {
		if nodeName(i) == name {
			return i
		}
	}
	return -1
}

// ProfileURL returns where node i serves Go's profiles
// ("http://127.0.0.1:PORT/debug/pprof/"), or "" unless the cluster was
// started with Profile.
func (c *ProcCluster) ProfileURL(i int) string {
	if c.specs[i].ProfPort == 0 {
		return ""
	}
	return fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/", c.specs[i].ProfPort)
}

// Dir returns node i's directory.
func (c *ProcCluster) Dir(i int) string { return filepath.Join(c.opts.Dir, nodeName(i)) }

// PID returns node i's process id while it runs, else 0.
func (c *ProcCluster) PID(i int) int { return c.nodes[i].PID() }

// Kill kills node i's process: no shutdown, no flush.
func (c *ProcCluster) Kill(i int) { c.nodes[i].Kill() }

// Stop shuts node i down, keeping its data.
func (c *ProcCluster) Stop(i int) { c.nodes[i].Stop(10 * time.Second) }

// LameDuck stops node i as deploy/ stops a server (SIGUSR2: lame duck
// mode, with the settings of deploy/nats/common.conf), waits until it has
// exited, and reports whether it did within LameDuckDuration and a margin
// (else it was killed).
func (c *ProcCluster) LameDuck(i int) bool {
	return c.nodes[i].Signal(lameDuckSignal, LameDuckDuration+15*time.Second)
}

// Terminate stops node i as a plain SIGTERM stops nats-server (a shutdown
// without lame duck mode), waits until it has exited, and reports whether
// it did within 15 s (else it was killed).
func (c *ProcCluster) Terminate(i int) bool {
	return c.nodes[i].Signal(syscall.SIGTERM, 15*time.Second)
}

// Restart starts node i again on the same ports and data and waits until
// it accepts connections.
func (c *ProcCluster) Restart(ctx context.Context, i int) error {
	if c.PID(i) != 0 {
		return fmt.Errorf("devcluster: node %s is running", nodeName(i))
	}
	return c.startNode(ctx, i)
}

// Shutdown stops every node.
func (c *ProcCluster) Shutdown() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		if n != nil {
			wg.Add(1)
			go func() { defer wg.Done(); n.Stop(10 * time.Second) }()
		}
	}
	wg.Wait()
}

// NodeMain runs one node of a ProcCluster in this process: it reads the
// node's spec from the first line of stdin, serves until stdin closes (the
// parent stopped it or died) or SIGTERM/SIGINT arrive, and returns the exit
// code. SIGUSR2 puts it in lame duck mode, as it does nats-server (the
// signal deploy/'s units and the NATS chart's pre-stop hook send); it
// exits when the lame duck mode ends.
func NodeMain() int {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	var spec nodeSpec
	if err == nil {
		err = json.Unmarshal(line, &spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "devcluster node: reading the spec:", err)
		return 2
	}
	o, err := spec.options()
	if err == nil {
		o.LogFile = filepath.Join(o.StoreDir, "node.log")
		o.Logtime, o.LogtimeUTC = true, true // to read beside lockd's and the bench's logs
		err = os.MkdirAll(o.StoreDir, 0o755)
	}
	var s *server.Server
	if err == nil {
		s, err = server.NewServer(o)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "devcluster node %s: %v\n", nodeName(spec.Index), err)
		return 1
	}
	s.ConfigureLogger()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, in)
		cancel()
	}()
	s.Start()
	go func() {
		s.WaitForShutdown()
		cancel()
	}()
	ldm := make(chan os.Signal, 1)
	if canLameDuck {
		signal.Notify(ldm, lameDuckSignal)
		defer signal.Stop(ldm)
	}
	select {
	case <-ctx.Done():
	case <-ldm:
		// As nats-server: SIGTERM during lame duck mode does not cut
		// it short; the mode ends with a shutdown of its own.
		signal.Ignore(syscall.SIGTERM)
		s.LameDuckShutdown()
	}
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}
