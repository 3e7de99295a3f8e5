package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/streams"
)

// clusterSize is the number of nodes the bench starts.
const clusterSize = 3

var zones = [clusterSize]string{"az:a", "az:b", "az:c"}

// child is a process the bench started by re-executing itself.
type child struct {
	name string
	args []string
	log  string // file receiving its stdout/stderr after "ready"
	logs string // where to look when it fails: log, and any log of its own

	mu     sync.Mutex
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
}

// start runs the child and waits (up to timeout) for its ready line.
func (c *child) start(timeout time.Duration) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, c.args...)
	// Its own process group, so a Ctrl-C on the terminal reaches only the
	// bench, which then stops the children in order; and killed with the
	// bench should the bench die without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", c.name, err)
	}
	exited := make(chan struct{})
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.TrimSpace(sc.Text()) == readyLine {
				close(ready)
				signalled = true
				continue
			}
			fmt.Fprintln(logf, sc.Text())
		}
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	c.mu.Lock()
	c.cmd, c.stdin, c.exited = cmd, stdin, exited
	c.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-exited:
		return fmt.Errorf("%s %w (see %s)", c.name, errNodeExited, cmp.Or(c.logs, c.log))
	case <-time.After(timeout):
		c.kill()
		return fmt.Errorf("%s not ready after %v (see %s)", c.name, timeout, cmp.Or(c.logs, c.log))
	}
}

// pid returns the running process id, or 0.
func (c *child) pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	select {
	case <-c.exited:
		return 0
	default:
	}
	return c.cmd.Process.Pid
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *child) kill() {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// stop asks the child to shut down (closing its stdin), and kills it if
// it has not gone within grace.
func (c *child) stop(grace time.Duration) {
	c.mu.Lock()
	cmd, stdin, exited := c.cmd, c.stdin, c.exited
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = stdin.Close()
	select {
	case <-exited:
	case <-time.After(grace):
		c.kill()
	}
}

// cluster is three nats-server nodes, each a child process.
type cluster struct {
	dir   string
	nodes [clusterSize]*child
	ports [clusterSize]int
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startAttempts bounds the starts of the cluster: a node can fail to bind
// a port that freePort found free, since freePort closes its listener
// before the node listens and every outgoing connection on the machine
// (the nodes' own route dials among them) draws its local port from the
// same range.
const startAttempts = 3

// errNodeExited marks a node that exited before it was ready.
var errNodeExited = errors.New("exited before it was ready")

// startCluster starts the three nodes with data under dir and waits until
// JetStream answers. When a node exits before it is ready, it moves that
// attempt's node directories (with their logs) to dir/failed-start-N, says
// so on out and starts again on fresh ports, at most startAttempts times.
func startCluster(ctx context.Context, dir string, out io.Writer, ports func() (int, error)) (*cluster, error) {
	for attempt := 1; ; attempt++ {
		c, err := startClusterOnce(ctx, dir, ports)
		if err == nil || attempt == startAttempts || ctx.Err() != nil || !errors.Is(err, errNodeExited) {
			return c, err
		}
		kept := filepath.Join(dir, fmt.Sprintf("failed-start-%d", attempt))
		if merr := os.MkdirAll(kept, 0o755); merr != nil {
			return nil, errors.Join(err, merr)
		}
		for i := 0; i < clusterSize; i++ {
			name := fmt.Sprintf("n%d", i+1)
			if merr := os.Rename(filepath.Join(dir, name), filepath.Join(kept, name)); merr != nil && !errors.Is(merr, os.ErrNotExist) {
				return nil, errors.Join(err, merr)
			}
		}
		fmt.Fprintf(out, "cluster start failed: %v; its logs are in %s; starting again on fresh ports\n", err, kept)
	}
}

func startClusterOnce(ctx context.Context, dir string, ports func() (int, error)) (*cluster, error) {
	c := &cluster{dir: dir}
	var routePorts [clusterSize]int
	for i := 0; i < clusterSize; i++ {
		var err error
		if c.ports[i], err = ports(); err != nil {
			return nil, err
		}
		if routePorts[i], err = ports(); err != nil {
			return nil, err
		}
	}
	for i := 0; i < clusterSize; i++ {
		var routes []string
		for j := 0; j < clusterSize; j++ {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", routePorts[j]))
			}
		}
		name := fmt.Sprintf("n%d", i+1)
		ndir := filepath.Join(dir, name)
		if err := os.MkdirAll(ndir, 0o755); err != nil {
			return nil, err
		}
		plog := filepath.Join(ndir, "process.log")
		c.nodes[i] = &child{name: name, log: plog, logs: plog + " and " + filepath.Join(ndir, "node.log"), args: []string{cmdNode,
			"-name", name, "-port", fmt.Sprint(c.ports[i]), "-cluster-port", fmt.Sprint(routePorts[i]),
			"-routes", strings.Join(routes, ","), "-tag", zones[i], "-dir", ndir}}
	}
	// Start the nodes together: each waits for the others' routes.
	errs := make(chan error, clusterSize)
	for _, n := range c.nodes {
		go func(n *child) { errs <- n.start(30 * time.Second) }(n)
	}
	var first error
	for range c.nodes {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		c.stop()
		return nil, first
	}
	if err := c.waitJetStream(ctx, 60*time.Second); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// URLs returns the client URLs of the nodes, comma separated.
func (c *cluster) URLs() string {
	var u []string
	for _, p := range c.ports {
		u = append(u, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	return strings.Join(u, ",")
}

// waitJetStream waits until the JetStream meta group answers account
// info, that is until it has a leader.
func (c *cluster) waitJetStream(ctx context.Context, timeout time.Duration) error {
	nc, err := nats.Connect(c.URLs())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("JetStream not ready: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// node returns the index of the node named name, or -1.
func (c *cluster) node(name string) int {
	for i, n := range c.nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

// procs returns the running node processes.
func (c *cluster) procs() []proc {
	var ps []proc
	for _, n := range c.nodes {
		if pid := n.pid(); pid > 0 {
			ps = append(ps, proc{name: n.name, pid: pid})
		}
	}
	return ps
}

// kill kills node i with SIGKILL: no shutdown, no flush.
func (c *cluster) kill(i int) { c.nodes[i].kill() }

// restart starts node i again on the same ports and data.
func (c *cluster) restart(i int) error { return c.nodes[i].start(30 * time.Second) }

// stop shuts every node down.
func (c *cluster) stop() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		if n == nil {
			continue
		}
		wg.Add(1)
		go func(n *child) { defer wg.Done(); n.stop(10 * time.Second) }(n)
	}
	wg.Wait()
}

// ensureBucket creates (or checks) the lock bucket, retrying while the
// cluster is still settling (peers joining the meta group).
func ensureBucket(ctx context.Context, nc *nats.Conn, cfg streams.BucketConfig) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := streams.Ensure(ectx, js, cfg)
		cancel()
		if err == nil || errors.Is(err, streams.ErrBucketConfig) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// ensureRawBucket creates the KV bucket of the raw baseline: R3, history
// 1, file storage, like the lock bucket.
func ensureRawBucket(ctx context.Context, js jetstream.JetStream, bucket string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := js.CreateOrUpdateKeyValue(ectx, jetstream.KeyValueConfig{
			Bucket: bucket, Description: "jetlock bench raw baseline", History: 1,
			Storage: jetstream.FileStorage, Replicas: 3,
		})
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// streamLeader returns the server name leading stream.
func streamLeader(ctx context.Context, js jetstream.JetStream, stream string) (string, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return "", err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", fmt.Errorf("stream %s has no leader", stream)
	}
	return info.Cluster.Leader, nil
}
