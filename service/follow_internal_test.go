package service

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// startInstance runs a service instance on connections of its own to cl
// until stop is called or the test ends. linger, when not zero, replaces
// peerLinger and peerStartLinger.
func startInstance(t *testing.T, cl *devcluster.Cluster, cfg Config, linger time.Duration) (s *Service, stop func()) {
	t.Helper()
	nc, storeNC, err := cl.ConnectService()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if s, err = New(nc, storeNC, cfg); err != nil {
		t.Fatal(err)
	}
	if linger != 0 {
		s.peerLinger, s.peerStartLinger = linger, linger
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("instance stopped with %v", err)
			}
			nc.Close()
			storeNC.Close()
		}
	}
	t.Cleanup(stop)
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("instance ended before it was ready: %v", err)
	}
	return s, stop
}

// serveOn runs one request on s itself, as its endpoint would, so that
// the test knows which instance served it.
func serveOn(t *testing.T, s *Service, op string, body any) (any, error) {
	t.Helper()
	data, _ := json.Marshal(body)
	c, err := s.decodeCall(op, data, origin{})
	if err != nil {
		return nil, err
	}
	return s.serve(s.deadlines.get(time.Now()), c, hold(s.gate))
}

// testRequest is a request handed to the service directly, as micro
// would; the test reads the result from the service, so nothing is sent.
type testRequest struct{ data []byte }

func (r testRequest) Respond([]byte, ...micro.RespondOpt) error               { return nil }
func (r testRequest) RespondJSON(any, ...micro.RespondOpt) error              { return nil }
func (r testRequest) Error(string, string, []byte, ...micro.RespondOpt) error { return nil }
func (r testRequest) Data() []byte                                            { return r.data }
func (r testRequest) Headers() micro.Headers                                  { return nil }
func (r testRequest) Subject() string                                         { return "" }
func (r testRequest) Reply() string                                           { return "" }

// waitFor polls cond every 20ms until it holds or timeout passes; it is
// testenv.Eventually for the package's internal tests, which cannot import
// testenv (it imports service).
func waitFor(t *testing.T, timeout time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met in %v: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An instance that is alone stops following the bucket's writes, and
// still decides right on a key written behind its back (compare-and-set
// fails, it reads). When a second instance starts, the first follows
// again and learns the second's leases; when the second dies holding one,
// the first expires that lease.
func TestFollowingOnlyWhileAnotherInstanceServes(t *testing.T) {
	cl := startCluster(t)
	cfg := DefaultConfig()
	cfg.ExpiryGrace = 200 * time.Millisecond
	a, _ := startInstance(t, cl, cfg, 500*time.Millisecond)
	if !a.Following() {
		t.Fatal("a new instance does not follow the bucket before it knows it is alone")
	}
	waitFor(t, 10*time.Second, func() bool { return !a.Following() }, "the lone instance stops following")

	// A record written behind the lone instance's back: it must answer
	// locked, not grant over it.
	kv, err := a.js.KeyValue(context.Background(), "jetlock")
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(streams.Record{LeaseID: "l-x", Owner: "operator", RequestID: "x", TTLms: 1000})
	if _, err := kv.Create(context.Background(), streams.LeaseKey("behind"), rec); err != nil {
		t.Fatal(err)
	}
	_, err = serveOn(t, a, streams.OpAcquire, streams.AcquireRequest{Resource: "behind", RequestID: "r1"})
	var oe *opError
	if !errors.As(err, &oe) || oe.code != streams.CodeLocked || oe.holder == nil || oe.holder.Owner != "operator" {
		t.Fatalf("acquire of a key written behind the lone instance's back: %v, want locked by operator", err)
	}
	// It learned the record by reading it, and expires it in time.
	waitFor(t, 10*time.Second, func() bool {
		_, err := serveOn(t, a, streams.OpAcquire, streams.AcquireRequest{Resource: "behind", RequestID: "r2"})
		return err == nil
	}, "the lone instance expires the record it read")

	b, stopB := startInstance(t, cl, cfg, 0)
	waitFor(t, 5*time.Second, a.Following, "the first instance follows once a second one serves")
	if !b.Following() {
		t.Fatal("the second instance does not follow though the first serves")
	}
	if _, err := serveOn(t, b, streams.OpAcquire, streams.AcquireRequest{Resource: "b-held", RequestID: "rb", TTLms: 1000}); err != nil {
		t.Fatalf("acquire on the second instance: %v", err)
	}
	key := streams.LeaseKey("b-held")
	waitFor(t, 5*time.Second, func() bool {
		o, ok := a.tracker.get(key)
		return ok && o.held()
	}, "the first instance sees the second's lease")

	// The second instance dies holding the lease: the first stops
	// following, and still expires that lease.
	stopB()
	waitFor(t, 10*time.Second, func() bool { return !a.Following() }, "the first instance stops following once alone again")
	waitFor(t, 10*time.Second, func() bool {
		e, err := a.store.read(context.Background(), key)
		return err == nil && !e.held()
	}, "the dead instance's lease is expired")
	// kv.Get is a direct get, which any replica may answer; a follower
	// can be a moment behind the leader's read above, so wait for all.
	waitFor(t, 5*time.Second, func() bool {
		_, err := kv.Get(context.Background(), key)
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, "the expired lease key reads as deleted through the KV API")
}

// While instances follow each other, an instance refuses an acquire as
// locked only on a read: its watcher can lag behind a release made through
// another instance. The test makes the watcher lag on purpose: once the
// first instance has seen the release, it puts the released lease back.
func TestFollowingInstanceRefusesOnlyOnARead(t *testing.T) {
	cl := startCluster(t)
	a, _ := startInstance(t, cl, DefaultConfig(), 0)
	b, _ := startInstance(t, cl, DefaultConfig(), 0)
	waitFor(t, 5*time.Second, func() bool { return a.Following() && b.Following() }, "the instances follow each other")
	resp, err := serveOn(t, a, streams.OpAcquire, streams.AcquireRequest{Resource: "lagging", RequestID: "h"})
	if err != nil {
		t.Fatal(err)
	}
	lease := resp.(*streams.LeaseResponse)
	key := streams.LeaseKey("lagging")
	held, _ := a.tracker.get(key)
	if resp, err := serveOn(t, b, streams.OpRelease, streams.ReleaseRequest{Resource: "lagging", LeaseID: lease.LeaseID}); err != nil || !resp.(*streams.ReleaseResponse).Released {
		t.Fatalf("release through the other instance: %v %v", resp, err)
	}
	waitFor(t, 5*time.Second, func() bool { o, _ := a.tracker.get(key); return !o.held() }, "the first instance sees the release")
	a.tracker.mu.Lock()
	a.tracker.keys[key] = observation{entry: held.entry, seen: time.Now()} // as if it had not
	a.tracker.mu.Unlock()
	if _, err := serveOn(t, a, streams.OpAcquire, streams.AcquireRequest{Resource: "lagging", RequestID: "n"}); err != nil {
		t.Fatalf("acquire of a released resource through an instance whose watcher lags: %v", err)
	}
}

// An instance that has heard a peer keeps following for peerLinger after
// it last heard one, longer than a peer's restart takes, so that a rolling
// restart does not make it read the whole bucket again; one that has
// heard none since it started stops after peerStartLinger.
func TestFollowingOutlastsAPeersRestart(t *testing.T) {
	f := &follower{epoch: time.Now().Add(-time.Hour), linger: peerLinger, startLinger: peerStartLinger}
	if !f.lingered() {
		t.Fatal("an instance alone since its start an hour ago still follows")
	}
	f = &follower{epoch: time.Now().Add(-peerStartLinger / 2), linger: peerLinger, startLinger: peerStartLinger}
	if f.lingered() {
		t.Fatalf("an instance started %v ago stopped following already", peerStartLinger/2)
	}
	f = &follower{epoch: time.Now().Add(-time.Hour), linger: peerLinger, startLinger: peerStartLinger}
	f.heardPeer.Store(true)
	f.lastPeer.Store((time.Hour - 30*time.Second).Nanoseconds()) // a peer went 30 s ago
	if f.lingered() {
		t.Fatal("an instance stopped following 30 s after its peer left (a restart takes longer than peerStartLinger)")
	}
	f.lastPeer.Store((time.Hour - peerLinger - time.Second).Nanoseconds())
	if !f.lingered() {
		t.Fatalf("an instance still follows %v after its last peer left", peerLinger+time.Second)
	}
}
