package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary serve as a cluster node, as the bench
// binary does (startCluster re-executes the running binary).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == cmdNode {
		os.Exit(nodeMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// A node that cannot bind its port exits before it is ready; the cluster
// is then started again on fresh ports, and the failed start's logs are
// kept and named.
func TestStartClusterRetriesOnFreshPorts(t *testing.T) {
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
		return freePort()
	}
	dir := t.TempDir()
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := startCluster(ctx, dir, &out, ports)
	if err != nil {
		t.Fatalf("start: %v; output %q", err, out.String())
	}
	defer c.stop()
	if calls != 4*clusterSize {
		t.Fatalf("%d ports drawn, want %d (two starts)", calls, 4*clusterSize)
	}
	for _, p := range c.ports {
		if p == takenPort {
			t.Fatalf("the second start used the taken port %d again", takenPort)
		}
	}
	kept := filepath.Join(dir, "failed-start-1")
	if !strings.Contains(out.String(), kept) || !strings.Contains(out.String(), "n1 exited before it was ready") {
		t.Fatalf("output %q does not name the failed node and where its logs are", out.String())
	}
	log, err := os.ReadFile(filepath.Join(kept, "n1", "node.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "address already in use") {
		t.Fatalf("n1's log of the failed start does not tell why:\n%s", log)
	}
	if err := c.waitJetStream(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// --clients service connects every load connection to the node the
// service is connected to, so that requests and replies cross no route.
func TestClientsServiceConnectsTheLoadToTheServiceNode(t *testing.T) {
	cfg, err := parseFlags([]string{"--clients", "service", "--conns", "4", "--data-dir", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := setup(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	want := e.svc.nc.ConnectedServerName()
	for i, nc := range e.conns {
		if got := nc.ConnectedServerName(); got != want {
			t.Errorf("load connection %d on %s, the service on %s", i, got, want)
		}
	}
	if err := e.checkService(ctx); err != nil {
		t.Fatal(err)
	}
}
