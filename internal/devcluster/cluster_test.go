package devcluster_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
)

// A client port that is taken is named at once, instead of a node found
// "not ready" after the ready timeout.
func TestStartOnAPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	c, err := devcluster.Start(devcluster.Options{Dir: t.TempDir(), ClientPorts: []int{0, port, 0}})
	if err == nil {
		c.Shutdown()
		t.Fatalf("Start on port %d, which is in use: no error", port)
	}
	if !errors.Is(err, devcluster.ErrPortInUse) || !strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(port)) || !strings.Contains(err.Error(), "n2") {
		t.Fatalf("Start on port %d of node n2, which is in use: %v; want ErrPortInUse naming the port and the node", port, err)
	}
}

// Started again on the data of an earlier run, the cluster is returned
// once every stream has a leader again, so the first JetStream request
// about a stream is answered instead of timing out while the replicas wait
// out their election timeout.
func TestStartAgainWaitsForStreamLeaders(t *testing.T) {
	dir := t.TempDir()
	c, err := devcluster.Start(devcluster.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t, c.URLs(), c.ConnectOptions(devcluster.Store)...)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KV_restart", Subjects: []string{"$KV.restart.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	c.Shutdown()

	c, err = devcluster.Start(devcluster.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	if l := c.LeaderlessStreams(); len(l) > 0 {
		t.Fatalf("Start returned with streams that have no leader: %v", l)
	}
	nc = connect(t, c.URLs(), c.ConnectOptions(devcluster.Store)...)
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	// A budget of its own: the restart above may have used most of the
	// first one on a busy machine.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, "KV_restart"); err != nil {
		t.Fatalf("stream info after the restart: %v", err)
	}
}
