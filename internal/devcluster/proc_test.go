package devcluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// TestMain lets the test binary serve as a node, as StartProcs re-executes
// the running program.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == devcluster.NodeCommand {
		os.Exit(devcluster.NodeMain())
	}
	os.Exit(m.Run())
}

func startProcs(t *testing.T, opts devcluster.ProcOptions) *devcluster.ProcCluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	c, err := devcluster.StartProcs(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

func connect(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// The node processes run the accounts of auth.go: a caller without
// credentials reaches every request subject but admin's through the
// import, an operator every one, each request stamped with the sender's
// identity (Nats-Request-Info), and nothing of JetStream; the store user
// places an R3 stream with one replica per zone.
func TestProcClusterRunsTheLeastPrivilegeModel(t *testing.T) {
	c := startProcs(t, devcluster.ProcOptions{})
	svc := connect(t, c.URLs(), c.ConnectOptions(devcluster.Service)...)
	// The stand-in service answers with the subject and whether the
	// server stamped the request.
	if _, err := svc.QueueSubscribe(streams.DefaultPrefix+"."+streams.APIVersion+".>", streams.QueueGroup, func(m *nats.Msg) {
		_ = m.Respond([]byte(fmt.Sprintf("%s %t", m.Subject, m.Header.Get("Nats-Request-Info") != "")))
	}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
	caller := connect(t, c.URLs(), append(c.ConnectOptions(devcluster.Caller), quiet)...)
	operator := connect(t, c.URLs(), append(c.ConnectOptions(devcluster.Operator), quiet)...)
	for _, op := range streams.Operations {
		subj := streams.Subject(streams.DefaultPrefix, op)
		for _, who := range []struct {
			name string
			nc   *nats.Conn
		}{{"caller", caller}, {"operator", operator}} {
			if who.name == "caller" && strings.HasPrefix(op, "admin.") {
				if reply, err := who.nc.Request(subj, []byte(`{}`), time.Second); err == nil {
					t.Errorf("a caller reached %s: %q", subj, reply.Data)
				}
				continue
			}
			reply, err := who.nc.Request(subj, []byte(`{}`), 5*time.Second)
			if err != nil {
				t.Errorf("%s through the import: %s: %v", who.name, subj, err)
			} else if want := subj + " true"; string(reply.Data) != want {
				t.Errorf("%s through the import: %s: the service saw %q, want %q (stamped)", who.name, subj, reply.Data, want)
			}
		}
	}
	if _, err := caller.Request("$JS.API.INFO", nil, time.Second); err == nil {
		t.Fatal("a caller reached the JetStream API")
	}

	store := connect(t, c.URLs(), c.ConnectOptions(devcluster.Store)...)
	js, err := jetstream.New(store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var s jetstream.Stream
	for s == nil {
		if s, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Replicas: 3, Storage: jetstream.FileStorage}); err != nil {
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // the meta group still places peers
		}
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream placement %+v, want a leader and two replicas", info.Cluster)
	}
}

// A killed node comes back on its ports and data under a new process.
func TestProcClusterKillAndRestart(t *testing.T) {
	c := startProcs(t, devcluster.ProcOptions{Open: true})
	nc := connect(t, c.URLs(), c.ConnectOptions(devcluster.Store)...)
	if _, err := nc.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Fatalf("open mode: a plain connection cannot use JetStream: %v", err)
	}
	old := c.PID(1)
	c.Kill(1)
	if c.PID(1) != 0 {
		t.Fatal("killed node still has a pid")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Restart(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if pid := c.PID(1); pid == 0 || pid == old {
		t.Fatalf("restarted node's pid %d (was %d)", pid, old)
	}
	connect(t, c.ClientURL(1))
}

// A node that cannot bind its port exits before it is ready; the cluster
// is then started again on fresh ports, and the failed start's logs are
// kept and named.
func TestStartProcsRetriesOnFreshPorts(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	calls := 0
	ports := func() (int, error) {
		calls++
		if calls == 1 {
			return takenPort, nil // n1's client port, in the first start
		}
		return devcluster.FreePort()
	}
	dir := t.TempDir()
	var out strings.Builder
	c := startProcs(t, devcluster.ProcOptions{Dir: dir, Out: &out, Ports: ports})
	if calls != 4*devcluster.Size {
		t.Fatalf("%d ports drawn, want %d (two starts)", calls, 4*devcluster.Size)
	}
	if strings.Contains(c.URLs()+",", fmt.Sprintf(":%d,", takenPort)) {
		t.Fatalf("the second start used the taken port %d again", takenPort)
	}
	kept := filepath.Join(dir, "failed-start-1")
	if !strings.Contains(out.String(), kept) || !strings.Contains(out.String(), "n1 "+devcluster.ErrExited.Error()) {
		t.Fatalf("output %q does not name the failed node and where its logs are", out.String())
	}
	log, err := os.ReadFile(filepath.Join(kept, "n1", "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "address already in use") {
		t.Fatalf("n1's log of the failed start does not tell why:\n%s", log)
	}
}

func TestChildThatExitsIsNotReady(t *testing.T) {
	ch := &devcluster.Child{Name: "false", Path: "/bin/false", Log: filepath.Join(t.TempDir(), "log")}
	if _, err := os.Stat(ch.Path); err != nil {
		t.Skip("no /bin/false here")
	}
	if err := ch.Start(); err != nil {
		t.Fatal(err)
	}
	err := ch.WaitReady(context.Background(), time.Minute, func() bool { return false })
	if !errors.Is(err, devcluster.ErrExited) {
		t.Fatalf("WaitReady: %v, want ErrExited", err)
	}
}

// LameDuck stops a node as deploy/ stops a server (SIGUSR2): the node
// enters lame duck mode, another node takes over the streams it led, and
// the process exits on its own; it comes back on its data.
func TestProcClusterLameDuck(t *testing.T) {
	c := startProcs(t, devcluster.ProcOptions{Open: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := connect(t, c.URLs())
	js, err := jetstream.New(first)
	if err != nil {
		t.Fatal(err)
	}
	var s jetstream.Stream
	for s == nil {
		if s, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "LD", Subjects: []string{"ld"}, Replicas: 3}); err != nil {
			if ctx.Err() != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old := c.Node(info.Cluster.Leader)
	// Watch from another node; no client stays on the old leader, so its
	// lame duck mode has nobody to wait for.
	first.Close()
	nc := connect(t, c.ClientURL((old+1)%devcluster.Size))
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	exited := make(chan bool, 1)
	go func() { exited <- c.LameDuck(old) }()
	var leader string
	for leader == "" || leader == c.Name(old) {
		if ctx.Err() != nil {
			t.Fatalf("no new leader of the stream after %s's lame duck mode", c.Name(old))
		}
		ictx, icancel := context.WithTimeout(ctx, time.Second)
		if st, err := js.Stream(ictx, "LD"); err == nil {
			if i, err := st.Info(ictx); err == nil && i.Cluster != nil {
				leader = i.Cluster.Leader
			}
		}
		icancel()
	}
	if !<-exited {
		t.Fatalf("%s did not exit on its own in lame duck mode", c.Name(old))
	}
	log, err := os.ReadFile(filepath.Join(c.Dir(old), "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "Entering lame duck mode") {
		t.Fatalf("%s's log does not show lame duck mode:\n%s", c.Name(old), log)
	}
	if _, err := js.Publish(ctx, "ld", []byte("x")); err != nil {
		t.Fatalf("a write with %s stopped, led by %s: %v", c.Name(old), leader, err)
	}
	if err := c.Restart(ctx, old); err != nil {
		t.Fatal(err)
	}
}
