package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

func setup(t *testing.T) (*testenv.Env, *nats.Conn, *client.Client) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	nc := env.Connect()
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return env, nc, c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitWaiters waits, at most d, until res's queue holds n waiters, and
// fails the test with what if it never does.
func waitWaiters(t *testing.T, ctx context.Context, c *client.Client, res string, n int, d time.Duration, what string) {
	t.Helper()
	testenv.Eventually(t, d, func() bool {
		st, err := c.Status(ctx, res)
		return err == nil && st.Waiters == n
	}, what)
}

func TestRenewalKeepsLeaseAliveAndReleaseIsIdempotent(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 30*time.Second)
	// The connection's shared reply subscription is the caller's, made by
	// the first request; everything the client starts after it must stop.
	if _, err := c.Status(ctx, "orders/1"); err != nil {
		t.Fatal(err)
	}
	leaks := goleak.IgnoreCurrent()
	const ttl = 3 * time.Second
	l, err := c.Acquire(ctx, "orders/1", client.TTL(ttl), client.Owner("test"))
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() == 0 || l.ID() == "" || l.Resource() != "orders/1" {
		t.Fatalf("bad lease: token %d id %q", l.Token(), l.ID())
	}
	first := l.Expires()
	if until := time.Until(first); until <= 0 || until > ttl {
		t.Fatalf("client deadline %v from now, want within the %v TTL", until, ttl)
	}
	// Three renewals, each moving the deadline: the lease outlives its TTL.
	for range 3 {
		before := l.Expires()
		select {
		case <-l.Renewed():
		case <-l.Lost():
			t.Fatalf("lease lost while renewing: %v", context.Cause(l.Context()))
		}
		if !l.Expires().After(before) {
			t.Fatal("Renewed closed but the deadline did not move")
		}
	}
	if !l.Expires().After(first.Add(ttl / 2)) {
		t.Fatalf("deadline %v after three renewals, first %v", l.Expires(), first)
	}
	st, err := c.Status(ctx, "orders/1")
	if err != nil || !st.Held || st.Token != l.Token() || st.Owner != "test" {
		t.Fatalf("status %+v %v", st, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	select {
	case <-l.Lost():
	default:
		t.Fatal("Lost not closed after Release")
	}
	if !errors.Is(context.Cause(l.Context()), client.ErrReleased) {
		t.Fatalf("cause %v", context.Cause(l.Context()))
	}
	if st, _ := c.Status(ctx, "orders/1"); st.Held {
		t.Fatalf("held after release: %+v", st)
	}
	// The in-process service keeps idle workers for its next requests.
	goleak.VerifyNone(t, leaks, goleak.IgnoreAnyFunction("github.com/jetlock/jetlock/service.(*workers).run"))
}

func TestLostClosesWhenRenewalRefused(t *testing.T) {
	_, nc, c := setup(t)
	ctx := ctxT(t, 30*time.Second)
	l, err := c.TryAcquire(ctx, "orders/2", client.TTL(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// Someone releases it behind the client's back (an operator with the
	// lease id); the next renewal is refused.
	if _, err := nc.Request(streams.Subject("jetlock", streams.OpRelease), []byte(`{"resource":"orders/2","lease_id":"`+l.ID()+`"}`), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second): // the next renewal comes after 0.5s
		t.Fatal("Lost not closed after the renewal was refused")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, client.ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", cause)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release of a lost lease: %v", err)
	}
}

func TestLostClosesBeforeDeadlineWithoutQuorum(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	const ttl = 3 * time.Second
	sent := time.Now()
	l, err := c.TryAcquire(ctx, "orders/3", client.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	env.Cluster.Stop(1)
	env.Cluster.Stop(2)
	select {
	case <-l.Lost():
	case <-time.After(2 * ttl):
		t.Fatal("Lost never closed without quorum")
	}
	// The client's deadline counts from before the service granted, so
	// Lost closes before the service could possibly let anyone else in.
	if el := time.Since(sent); el >= ttl {
		t.Fatalf("Lost closed %v after the acquire was sent, not before the TTL %v", el, ttl)
	}
	if !errors.Is(context.Cause(l.Context()), client.ErrLeaseLost) {
		t.Fatalf("cause %v", context.Cause(l.Context()))
	}
	for _, i := range []int{1, 2} {
		if err := env.Cluster.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	// Service resumes: after expiry someone else gets it with a larger
	// token.
	// The restarted nodes may still be electing leaders: an unknown
	// outcome (ErrUnavailable, after the client's own retries) is retried.
	var l2 *client.Lease
	testenv.Eventually(t, 30*time.Second, func() bool {
		l2, err = c.Acquire(ctx, "orders/3", client.TTL(ttl))
		if err != nil && !errors.Is(err, client.ErrUnavailable) {
			t.Fatal(err)
		}
		return err == nil
	}, "no grant after the nodes returned")
	if l2.Token() <= l.Token() {
		t.Fatalf("token %d not above %d", l2.Token(), l.Token())
	}
	_ = l2.Release(ctx)
}

func TestTryAcquireLockedAndAcquireWaits(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 30*time.Second)
	a, err := c.TryAcquire(ctx, "jobs/1", client.Owner("alice"), client.TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.TryAcquire(ctx, "jobs/1", client.Owner("bob"))
	var he *client.HeldError
	if !errors.Is(err, client.ErrLocked) || !errors.As(err, &he) || he.Owner != "alice" || he.Token != a.Token() || he.Resource != "jobs/1" {
		t.Fatalf("TryAcquire of a held resource: %v", err)
	}
	// Acquire with a deadline that passes gives up and leaves nothing.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.Acquire(short, "jobs/1")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline: %v", err)
	}
	// Acquire blocks until the holder releases.
	got := make(chan *client.Lease, 1)
	go func() {
		l, err := c.Acquire(ctx, "jobs/1", client.Owner("bob"))
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitWaiters(t, ctx, c, "jobs/1", 1, 10*time.Second, "bob never queued")
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if b == nil || b.Token() <= a.Token() {
			t.Fatalf("waiter got %v", b)
		}
		_ = b.Release(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not get the released lock")
	}
}

func TestOptionsAndInputValidation(t *testing.T) {
	_, nc, c := setup(t)
	if _, err := client.New(nil); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("nil conn: %v", err)
	}
	if _, err := client.New(nc, client.WithRequestTimeout(0)); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("zero timeout: %v", err)
	}
	if _, err := client.New(nc, client.WithRetries(-1)); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("negative retries: %v", err)
	}
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.TryAcquire(ctx, "bad resource"); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("bad resource: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "ok", client.RequestID("")); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("empty request id: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "ok", client.TTL(100*time.Millisecond)); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("ttl below the service's minimum: %v", err)
	}
}

func TestRequestIDMakesAcquireIdempotent(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 10*time.Second)
	a, err := c.TryAcquire(ctx, "idem/1", client.RequestID("backup-2026-11-29"))
	if err != nil {
		t.Fatal(err)
	}
	// A second process (after a crash, say) retries the same logical
	// acquire: same lease, same token.
	b, err := c.TryAcquire(ctx, "idem/1", client.RequestID("backup-2026-11-29"))
	if err != nil {
		t.Fatal(err)
	}
	if a.ID() != b.ID() || a.Token() != b.Token() {
		t.Fatalf("retry got lease %s/%d, first %s/%d", b.ID(), b.Token(), a.ID(), a.Token())
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_ = b.Release(ctx)
	if _, err := c.TryAcquire(ctx, "idem/1", client.RequestID("backup-2026-11-29")); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("retry after release: %v, want ErrLeaseLost", err)
	}
}

func TestAcquireQueuesAndCancelLeavesNothing(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 30*time.Second)
	a, err := c.TryAcquire(ctx, "q/1", client.Owner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Acquire(ctx, "q/1", client.Wait(700*time.Millisecond)); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("bounded wait: %v, want ErrLocked", err)
	}
	if el := time.Since(start); el < 700*time.Millisecond {
		t.Fatalf("Wait(700ms) gave up after %v", el)
	}
	waitCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Acquire(waitCtx, "q/1", client.Owner("bob"))
		errc <- err
	}()
	waitWaiters(t, ctx, c, "q/1", 1, 5*time.Second, "bob never queued")
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	waitWaiters(t, ctx, c, "q/1", 0, 5*time.Second, "cancelled waiter left in the queue")
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if st, _ := c.Status(ctx, "q/1"); st.Held {
		t.Fatalf("cancelled waiter was granted: %+v", st)
	}
}

// A lease granted after a wait longer than its hand-over TTL must not be
// lost at once: the client renews it before returning it. A regression test
// for a bug found by the fault suite.
func TestLeaseGrantedAfterLongWaitIsHeld(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	cfg.HandoverTTL = 2 * time.Second
	env.Serve(cfg)
	c, err := client.New(env.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	holder, err := c.TryAcquire(ctx, "waited/1", client.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(3*time.Second, func() { _ = holder.Release(ctx) })
	l, err := c.Acquire(ctx, "waited/1", client.TTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if until := time.Until(l.Expires()); until < 15*time.Second {
		t.Fatalf("lease granted after waiting trusted for only %v, want about its 20s TTL", until)
	}
	time.Sleep(2500 * time.Millisecond) // past the 2s hand-over TTL
	select {
	case <-l.Lost():
		t.Fatalf("lost: %v", context.Cause(l.Context()))
	default:
	}
	if st, err := c.Status(ctx, "waited/1"); err != nil || !st.Held || st.Token != l.Token() {
		t.Fatalf("status %+v %v", st, err)
	}
}

// A Release whose request fails (no service answers) still ends the lease
// for its holder: Lost closes and Context is cancelled as soon as renewing
// stops, as etcd orphans a session before it revokes it.
func TestFailedReleaseStillEndsTheLeaseLocally(t *testing.T) {
	env := testenv.Start(t)
	inst := env.Serve(testenv.Config())
	c, err := client.New(env.Connect(), client.WithRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	l, err := c.Acquire(ctx, "orders/unreachable", client.TTL(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := l.Release(rctx); err == nil {
		t.Fatal("release answered with no service running")
	}
	select {
	case <-l.Lost():
	default:
		t.Fatal("Lost still open after a failed release")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, client.ErrReleased) {
		t.Fatalf("lease context cause %v, want ErrReleased", cause)
	}
}
