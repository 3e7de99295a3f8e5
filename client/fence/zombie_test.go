package fence_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/client/fence"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/netlink"
	"github.com/jetlock/jetlock/internal/testenv"
)

// TestZombieHolder is the scenario fencing exists for, end to end on the
// three-node cluster with the lock service and the jetlock client: holder
// A is paused past its TTL, B takes over and writes, and then A's writes
// with its old token reach the resource — one sent before B acquired and
// delivered only after B wrote, one made when A resumes. Every backend
// (memory, JetStream KV, SQLite) rejects both, A's Lost has closed, and
// B's data is what stays.
//
// A's pause is made in the network, not in the client: A's NATS
// connection dials through a netlink.Link that the test cuts. A's renewals
// then cannot reach the service, as if the whole process were frozen, and
// what A sends meanwhile waits in its connection's reconnect buffer until
// the link is restored.
func TestZombieHolder(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const resource = "lock:backup:user123"
	store := startUserStore(t, env.ConnectAs(devcluster.App))

	link := &netlink.Link{}
	ncA := env.ConnectAs(devcluster.App, nats.SetCustomDialer(link), nats.ReconnectWait(50*time.Millisecond))
	ncB := env.ConnectAs(devcluster.App)
	clientA, err := client.New(ncA)
	if err != nil {
		t.Fatal(err)
	}
	clientB, err := client.New(ncB)
	if err != nil {
		t.Fatal(err)
	}
	write := func(nc *nats.Conn, backend string, token uint64, data string) storeReply {
		return storeRequest(ctx, t, nc, storeWrite{Backend: backend, Resource: resource, Token: token, Data: data})
	}

	// A holds the lock and writes: accepted everywhere.
	const ttl = 2 * time.Second
	a, err := clientA.TryAcquire(ctx, resource, client.TTL(ttl), client.Owner("A"))
	if err != nil {
		t.Fatal(err)
	}
	t1 := a.Token()
	for _, b := range backends {
		if r := write(ncA, b, t1, "A's data"); !r.Accepted {
			t.Fatalf("%s: A's write with token %d while holding the lease: %+v", b, t1, r)
		}
	}

	// A's replies to its delayed writes come here; subscribe while the
	// link is up so that the subscription exists on the server side.
	delayedReplies := map[string]*nats.Subscription{}
	for _, b := range backends {
		sub, err := ncA.SubscribeSync(nats.NewInbox())
		if err != nil {
			t.Fatal(err)
		}
		delayedReplies[b] = sub
	}
	if err := ncA.Flush(); err != nil {
		t.Fatal(err)
	}

	// A pauses: its network goes away and its renewals with it.
	pausedAt := time.Now()
	link.Cut()
	testenv.Eventually(t, 30*time.Second, ncA.IsReconnecting, "A's connection did not notice the cut")

	// The delayed write: A sends it now, before B has even asked for the
	// lock. It waits in A's reconnect buffer, as a packet would in a slow
	// network, and reaches the store only after the link is restored.
	for _, b := range backends {
		data, err := json.Marshal(storeWrite{Backend: b, Resource: resource, Token: t1, Data: "A's delayed data"})
		if err != nil {
			t.Fatal(err)
		}
		if err := ncA.PublishMsg(&nats.Msg{Subject: storeSubject, Reply: delayedReplies[b].Subject, Data: data}); err != nil {
			t.Fatalf("%s: buffer A's delayed write: %v", b, err)
		}
	}

	// B waits in the queue and gets the lock once the service has seen
	// A's lease go unrenewed for its TTL plus the grace.
	b, err := clientB.Acquire(ctx, resource, client.TTL(10*time.Second), client.Owner("B"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(context.Background()) //nolint:errcheck // best effort at the end of the test
	t2 := b.Token()
	t.Logf("A (token %d) paused; B acquired token %d after %v", t1, t2, time.Since(pausedAt).Round(time.Millisecond))
	if t2 <= t1 {
		t.Fatalf("B's token %d is not larger than A's %d", t2, t1)
	}
	// A's client gave up on the lease before the service let B in: its
	// own deadline falls before the service's.
	select {
	case <-a.Lost():
	default:
		t.Fatal("A's Lost had not closed when B was granted the lock")
	}
	if cause := context.Cause(a.Context()); !errors.Is(cause, client.ErrLeaseLost) {
		t.Fatalf("A's lease context cause = %v, want ErrLeaseLost", cause)
	}

	bArrival := map[string]int{}
	for _, be := range backends {
		r := write(ncB, be, t2, "B's data")
		if !r.Accepted {
			t.Fatalf("%s: B's write with token %d: %+v", be, t2, r)
		}
		bArrival[be] = r.Arrival
	}
	// Take a KV revision that B's write has reached, to recognise any
	// later write of the guard record.
	var bRev uint64
	testenv.Eventually(t, 30*time.Second, func() bool {
		data, rev, err := store.read(ctx, "kv", resource)
		if err == nil && data == "B's data" {
			bRev = rev
			return true
		}
		return false
	}, "B's KV write not readable")

	// The link comes back: A's delayed writes are delivered now, after
	// B's, and rejected.
	link.Restore()
	testenv.Eventually(t, 30*time.Second, ncA.IsConnected, "A's connection did not reconnect")
	for _, be := range backends {
		msg, err := delayedReplies[be].NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("%s: no reply to A's delayed write: %v", be, err)
		}
		r := decodeReply(t, msg)
		if r.Arrival <= bArrival[be] {
			t.Fatalf("%s: A's delayed write arrived as request %d, before B's write (%d): the test did not delay it", be, r.Arrival, bArrival[be])
		}
		if !r.Stale || r.Highest != t2 {
			t.Errorf("%s: A's delayed write with token %d: %+v, want rejected as stale against %d", be, t1, r, t2)
		}
	}

	// A resumes, still believing it holds the lock, and writes again.
	for _, be := range backends {
		if r := write(ncA, be, t1, "A's data after the pause"); !r.Stale || r.Highest != t2 {
			t.Errorf("%s: A's write with token %d after its pause: %+v, want rejected as stale against %d", be, t1, r, t2)
		}
	}
	// A service that keeps its state in NATS writes to the bucket itself,
	// with a guard of its own: rejected as well.
	jsA, err := jetstream.New(ncA)
	if err != nil {
		t.Fatal(err)
	}
	kvA, err := jsA.KeyValue(ctx, store.bucket)
	if err != nil {
		t.Fatal(err)
	}
	guardA := newKVGuard(t, kvA)
	if _, err := guardA.Put(ctx, resource, t1, []byte("A's direct write")); !errors.Is(err, fence.ErrStaleToken) {
		t.Errorf("A's own KV guard: Put with token %d = %v, want ErrStaleToken", t1, err)
	}
	if n := guardA.Rejected(); n != 1 {
		t.Errorf("A's own KV guard: Rejected() = %d, want 1", n)
	}

	// B's data is intact, every fence stands at t2, and every guard
	// counted the two stale writes it refused.
	for _, be := range backends {
		data, rev, err := store.read(ctx, be, resource)
		if err != nil || data != "B's data" {
			t.Errorf("%s: data = %q, %v; want B's data", be, data, err)
		}
		if be == "kv" && rev != bRev {
			t.Errorf("kv: guard record at revision %d, want %d (B's write): something wrote after B", rev, bRev)
		}
		g := store.guard(be)
		if h, err := g.Highest(ctx, resource); err != nil || h != t2 {
			t.Errorf("%s: Highest = %d, %v; want %d", be, h, err, t2)
		}
		if n := g.Rejected(); n != 2 {
			t.Errorf("%s: Rejected() = %d, want 2 (A's delayed and resumed writes)", be, n)
		}
	}
}
