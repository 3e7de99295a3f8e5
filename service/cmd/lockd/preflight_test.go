package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// startServer starts one nats-server in this process on a random loopback
// port, without a cluster and without authentication; with JetStream when
// js is set (storage in a temporary directory).
func startServer(t *testing.T, js bool) *server.Server {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, ServerName: "single"}
	if js {
		o.JetStream, o.StoreDir = true, t.TempDir()
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready in 10s")
	}
	return s
}

// runFor runs lockd in this process with args until it exits or timeout
// passes (then it is cancelled), and returns its exit code, whether it
// exited by itself, and its stderr.
func runFor(t *testing.T, timeout time.Duration, args ...string) (code int, exited bool, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out, errOut syncBuffer
	code = run(ctx, args, &out, &errOut)
	return code, ctx.Err() == nil, errOut.String()
}

// A server without JetStream cannot hold the bucket, and no retry changes
// that: lockd exits with a usage error that says how to enable it (it
// retried every two seconds, silently, before).
func TestNoJetStreamExitsWithTheFix(t *testing.T) {
	s := startServer(t, false)
	code, exited, stderr := runFor(t, 30*time.Second, "--server", s.ClientURL())
	if !exited || code != exitUsage {
		t.Fatalf("lockd against a server without JetStream: exit %d (exited by itself: %v), want %d at once; stderr:\n%s", code, exited, exitUsage, stderr)
	}
	for _, want := range []string{"JetStream is not enabled on the server single", "enable jetstream in the server config"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
}

// Three replicas on a server without a cluster cannot be placed, and no
// retry changes that: lockd exits and names both ways out.
func TestReplicasOnOneServerExitsWithTheFix(t *testing.T) {
	s := startServer(t, true)
	code, exited, stderr := runFor(t, 30*time.Second, "--server", s.ClientURL())
	if !exited || code != exitUsage {
		t.Fatalf("lockd --replicas 3 against one server: exit %d (exited by itself: %v), want %d at once; stderr:\n%s", code, exited, exitUsage, stderr)
	}
	for _, want := range []string{"--replicas 3 but the cluster has 1 server", "start three servers (one per zone) or run with --replicas 1 --allow-single-replica"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
}

// --allow-single-replica alone, on a server without a cluster, is enough:
// lockd serves a bucket of one replica (and says so).
func TestAllowSingleReplicaAloneOnOneServer(t *testing.T) {
	s := startServer(t, true)
	l := startLockd(t, "--server", s.ClientURL(), "--allow-single-replica")
	if !strings.Contains(l.stderr.String(), "the bucket gets 1 replica") {
		t.Errorf("lockd did not say it made the bucket R1:\n%s", l.stderr.String())
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, streams.StreamName(streams.DefaultBucket))
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 1 {
		t.Fatalf("bucket replicas %d, want 1", r)
	}
	var st2 streams.StatusResponse
	if code := call(t, nc, streams.OpStatus, streams.StatusRequest{Resource: "orders/1"}, &st2); code != "" {
		t.Fatalf("status: %s", code)
	}
}

// A cluster without a quorum is transient: lockd keeps retrying, and
// serves once the servers are back.
func TestNoQuorumIsRetried(t *testing.T) {
	env := testenv.Start(t)
	env.Cluster.Stop(1)
	env.Cluster.Stop(2)
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	code := make(chan int, 1)
	go func() { code <- run(ctx, serviceArgs(env), &out, &errOut) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-code:
		case <-time.After(30 * time.Second):
			t.Error("lockd did not stop in 30s")
		}
	})
	deadline := time.After(60 * time.Second)
	for strings.Count(errOut.String(), "lock bucket not ready, retrying") < 2 {
		select {
		case c := <-code:
			t.Fatalf("lockd exited %d without a quorum; want it to retry:\n%s", c, errOut.String())
		case <-deadline:
			t.Fatalf("lockd did not retry twice in 60s:\n%s", errOut.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, i := range []int{1, 2} {
		if err := env.Cluster.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	deadline = time.After(60 * time.Second)
	for !strings.Contains(out.String(), "jetlock is serving") {
		select {
		case c := <-code:
			t.Fatalf("lockd exited %d after the quorum came back:\n%s", c, errOut.String())
		case <-deadline:
			t.Fatalf("lockd not serving 60s after the quorum came back:\n%s", errOut.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
