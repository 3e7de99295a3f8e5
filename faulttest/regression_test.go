package faulttest

import (
	"context"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/testenv"
)

// Invariant 6 across node restarts. JetStream rebuilds a stream's
// duplicate-detection table at start-up only from the messages still
// stored (nats-server stream.go, rebuildDedupe); with history 1 the
// granting write of a lease that has since been released, cancelled or
// renewed is gone, and its Nats-Msg-Id with it. Once a restarted node
// leads the stream, a retry with the same request_id within the retry
// window is no longer a duplicate; without more, the service would grant
// a second lease (to a cancelled request, too). Found by this suite.
// The service remembers ended request ids in memory, and the delete marker
// that ends a lease names its request (streams.EndMark), so that an
// instance that did not see the lease end (started later, or restarted
// with the nodes) answers lease_lost too.
func TestRetryAfterRestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []retryCase{
		{"release then whole-cluster restart", releaseLease, func(h *Harness) { h.CrashAll(); h.RestartAll() }},
		{"cancel then whole-cluster restart", cancelRequest, func(h *Harness) { h.CrashAll(); h.RestartAll() }},
		{"release then a follower restarts and leads", releaseLease, restartFollowerAsLeader},
		{"release then whole-cluster and service restart", releaseLease, restartEverything},
		{"cancel then whole-cluster and service restart", cancelRequest, restartEverything},
		{"expiry then whole-cluster and service restart", awaitExpiry, restartEverything},
	} {
		t.Run(tc.name, tc.run)
	}
}

type retryCase struct {
	name    string
	end     func(t *testing.T, c *Caller, res string, l Op)
	restart func(h *Harness)
}

func (tc retryCase) run(t *testing.T) {
	const ttl = 5 * time.Second
	h := StartHarness(t)
	h.Serve(0, ServiceConfig())
	nc, _ := h.Connect(1, "probe")
	c := &Caller{NC: nc, H: NewHistory(), Client: 1}
	first := c.Acquire("restart/1", "r1", ttl, 0, false)
	if first.Result != OK {
		t.Fatalf("acquire: %v", &first)
	}
	tc.end(t, c, "restart/1", first)
	if op := c.Acquire("restart/1", "r1", ttl, 0, true); op.Result != Fail || op.Code != "lease_lost" {
		t.Fatalf("retry before the restart: %v, want lease_lost", &op)
	}
	tc.restart(h)
	var op Op
	testenv.Eventually(t, 30*time.Second, func() bool {
		op = c.Acquire("restart/1", "r1", ttl, 0, true)
		return op.Result != Unknown
	}, "no answer after the restart")
	if op.Result == OK {
		t.Fatalf("request r1 granted a second lease: %v (first %v)", &op, &first)
	}
}

func restartEverything(h *Harness) {
	for _, inst := range h.Instances() {
		inst.Stop()
	}
	h.CrashAll()
	if err := h.C.RestartAll(); err != nil {
		h.T.Fatal(err)
	}
	h.Serve(2, ServiceConfig())
}

func releaseLease(t *testing.T, c *Caller, res string, l Op) {
	if rel := c.Release(res, l.LeaseID); rel.Result != OK || !rel.Flag {
		t.Fatalf("release: %v", &rel)
	}
}

func awaitExpiry(t *testing.T, c *Caller, res string, l Op) {
	testenv.Eventually(t, 20*time.Second, func() bool {
		st := c.Status(res)
		return st.Result == OK && !st.Flag
	}, "lease %s never expired", l.LeaseID)
}

func cancelRequest(t *testing.T, c *Caller, res string, l Op) {
	if op := c.Cancel(res, l.RequestID); op.Result != OK || !op.Flag {
		t.Fatalf("cancel: %v", &op)
	}
}

func restartFollowerAsLeader(h *Harness) {
	f := (h.C.StreamLeader(lockStream) + 1) % 3
	h.C.Stop(f)
	if err := h.C.Restart(f); err != nil {
		h.T.Fatal(err)
	}
	h.WaitCurrent(20 * time.Second)
	for i := 0; i < 20 && h.C.StreamLeader(lockStream) != f; i++ {
		_ = h.StepDown()
	}
	if h.C.StreamLeader(lockStream) != f {
		h.T.Fatalf("node %d never led", f)
	}
}

// A Go client that waited in the queue longer than the granted TTL
// (capped at HandoverTTL, 5s by default) minus its safety margin got a
// Lease that was lost at once: the client counts its deadline from when it
// sent the waiting request, which was before the wait. Found by this
// suite; the client now renews such a lease before returning it.
func TestWaitedLeaseNotLostAtOnce(t *testing.T) {
	t.Parallel()
	h := StartHarness(t)
	h.Serve(0, ServiceConfig())
	nc, _ := h.Connect(1, "go client")
	cl, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	holder, err := cl.TryAcquire(ctx, "waited/1", client.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(6*time.Second, func() { _ = holder.Release(ctx) })
	l, err := cl.Acquire(ctx, "waited/1", client.TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	time.Sleep(100 * time.Millisecond)
	select {
	case <-l.Lost():
		t.Fatalf("a lease granted after a 6s wait was lost at once: %v", context.Cause(l.Context()))
	default:
	}
}

// A waiting acquire whose service instance could not refresh its waiter
// record for the liveness window (paused, or cut off during a failover)
// loses the record to another instance's sweeper, and is then answered
// lease_lost, which the contract reserves for a request whose grant ended
// or that was cancelled. Nobody cancelled it; the Go client gives up on
// lease_lost. Found by this suite; the service now checks the request's
// cancel tombstone and, without one, queues the waiter again.
func TestPausedWaiterNotAnsweredLeaseLost(t *testing.T) {
	t.Parallel()
	h := StartHarness(t)
	a := h.Serve(0, ServiceConfig())
	nc, _ := h.Connect(0, "clients")
	c := &Caller{NC: nc, H: NewHistory(), Client: 1, Timeout: 30 * time.Second}
	held := c.Acquire("wait/1", "holder", 20*time.Second, 0, false)
	if held.Result != OK {
		t.Fatalf("acquire: %v", &held)
	}
	done := make(chan Op, 1)
	go func() { done <- c.Acquire("wait/1", "waiter", 5*time.Second, 20*time.Second, false) }()
	// Queued on the only instance, a.
	testenv.Eventually(t, 30*time.Second, func() bool { return statusWaiters(c, "wait/1") == 1 }, "the waiter not queued")
	h.Serve(1, ServiceConfig())
	a.Pause()
	time.Sleep(ServiceConfig().WaiterLiveness + 3*time.Second)
	a.Resume()
	c.Release("wait/1", held.LeaseID)
	if op := <-done; op.Result == Fail && op.Code == "lease_lost" {
		t.Fatalf("a waiter nobody cancelled was answered lease_lost: %v", &op)
	}
}

// Right after a partition heals, the old stream leader may still answer
// $JS.API.STREAM.MSG.GET from its stale state before it learns of the new
// term (nats-server answers message gets from whoever believes it leads;
// see nats-server PR 7146). The service's "fresh" read that confirms a
// negative answer then confirms a stale one: a release of the current
// lease is answered released:false (likewise renew lease_lost, cancel
// cancelled:false), and the lease stays until it expires. Found by this
// suite; the service now proves a negative answer with a conditional write
// that commits only through a current leader.
func TestStaleReadAfterHeal(t *testing.T) {
	t.Parallel()
	h, callers := servedEverywhere(t)
	for round := 0; round < 5; round++ {
		old, err := h.IsolateLeader()
		if err != nil {
			t.Fatal(err)
		}
		res := "heal/" + itoa(round)
		var l Op
		testenv.Eventually(t, 20*time.Second, func() bool {
			l = callers[(old+1)%3].Acquire(res, "r", 20*time.Second, 0, false)
			return l.Result == OK
		}, "no grant on the majority side")
		h.Heal()
		rel := callers[old].Release(res, l.LeaseID)
		t.Logf("round %d: release through the old leader's node right after healing: %v", round, &rel)
		if rel.Result == OK && !rel.Flag {
			t.Fatalf("the current lease was answered released:false (stale read): %v", &rel)
		}
		h.WaitCurrent(20 * time.Second)
	}
}

// servedEverywhere starts a cluster with a service instance on each node,
// and a caller connected to each node (callers[i] to node i).
func servedEverywhere(t *testing.T) (*Harness, [3]*Caller) {
	t.Helper()
	h := StartHarness(t)
	for node := 0; node < 3; node++ {
		h.Serve(node, ServiceConfig())
	}
	var callers [3]*Caller
	for node := range callers {
		nc, _ := h.Connect(node, "probe")
		callers[node] = &Caller{NC: nc, H: NewHistory(), Client: node}
	}
	return h, callers
}
