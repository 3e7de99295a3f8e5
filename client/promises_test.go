package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/testenv"
)

// The tests of the client's promises (docs/promises.md) that need the
// real cluster: each one against the way the promise was once broken.

// P2: a call either returns a lease or leaves nothing held. Acquires of
// every kind (a lock, a lock set, a permit, a session's lock, a campaign)
// are cancelled the moment their grant comes back; once the client's
// cleanups are done, nothing is held but what the calls returned (which
// the test releases). The client once returned the ctx error for a lease
// whose renewals had started, and renewed it until the hold cap.
func TestAcquireCancelledNearTheGrantLeavesNothingHeld(t *testing.T) {
	_, nc, c := setup(t)
	ctx := ctxT(t, 120*time.Second)
	var s *client.Session // opened below, after the subscription

	type attempt struct {
		kind      string
		resources []string // the locks it holds when granted
		acquire   func(ctx context.Context) (*client.Lease, error)
		sem       *client.Semaphore // the semaphore whose permit it holds
	}
	kinds := []func(i int) attempt{
		func(i int) attempt {
			r := fmt.Sprintf("near/lock/%d", i)
			return attempt{"lock", []string{r}, func(ctx context.Context) (*client.Lease, error) {
				return c.Acquire(ctx, r, client.TTL(6*time.Second))
			}, nil}
		},
		func(i int) attempt {
			set := []string{fmt.Sprintf("near/set/%d/a", i), fmt.Sprintf("near/set/%d/b", i)}
			return attempt{"set", set, func(ctx context.Context) (*client.Lease, error) {
				return c.AcquireAll(ctx, set, client.TTL(6*time.Second))
			}, nil}
		},
		func(i int) attempt {
			m, err := c.NewSemaphore(fmt.Sprintf("near/sem/%d", i), 2)
			if err != nil {
				t.Fatal(err)
			}
			return attempt{"permit", nil, func(ctx context.Context) (*client.Lease, error) {
				return m.Acquire(ctx, client.TTL(6*time.Second))
			}, m}
		},
		func(i int) attempt {
			r := fmt.Sprintf("near/session/%d", i)
			return attempt{"session", []string{r}, func(ctx context.Context) (*client.Lease, error) {
				return s.Acquire(ctx, r)
			}, nil}
		},
		func(i int) attempt {
			name := fmt.Sprintf("near/elect/%d", i)
			return attempt{"campaign", []string{name}, func(ctx context.Context) (*client.Lease, error) {
				e, err := c.NewElection(name, client.TTL(6*time.Second))
				if err != nil {
					return nil, err
				}
				ld, err := e.Campaign(ctx, "me")
				if err != nil {
					return nil, err
				}
				return ld.Lease, nil
			}, nil}
		},
	}
	// Each attempt is cancelled as its grant's reply arrives: a
	// subscription of the test's own on the connection's inboxes sees the
	// reply as the client's request does (made before the client's first
	// request, it is handed each reply first), and the attempt's context
	// is cancelled the first time the client looks at it after that.
	var cancels sync.Map // resource -> *cancelAtGrant
	sub, err := nc.Subscribe(nats.InboxPrefix+">", func(m *nats.Msg) {
		var r struct {
			Resource  string `json:"resource"`
			LeaseID   string `json:"lease_id"`
			Resources []struct {
				Resource string `json:"resource"`
			} `json:"resources"`
		}
		if json.Unmarshal(m.Data, &r) != nil || r.LeaseID == "" {
			return
		}
		name := r.Resource
		if name == "" && len(r.Resources) > 0 {
			name = r.Resources[0].Resource
		}
		if g, ok := cancels.Load(name); ok {
			g.(*cancelAtGrant).granted.Store(true)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s, err = c.NewSession(ctx, client.SessionTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close() //nolint:errcheck
	type outcome struct {
		attempt
		l   *client.Lease
		err error
	}
	const n = 200
	outcomes := make([]outcome, n)
	sem := make(chan struct{}, 10)
	var wg sync.WaitGroup
	for i := range n {
		a := kinds[i%len(kinds)](i)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			actx := &cancelAtGrant{Context: cctx, cancel: cancel}
			var key string
			if a.sem != nil {
				key = a.sem.Name()
			} else {
				key = a.resources[0]
			}
			cancels.Store(key, actx)
			l, err := a.acquire(actx)
			outcomes[i] = outcome{a, l, err}
		}()
	}
	wg.Wait()
	var got []outcome
	cancelled := 0
	for _, o := range outcomes {
		switch {
		case o.err == nil:
			got = append(got, o)
		case errors.Is(o.err, context.Canceled):
			cancelled++
		default:
			t.Errorf("%s %v: %v", o.kind, o.resources, o.err)
		}
	}
	t.Logf("%d attempts: %d granted, %d cancelled", n, len(got), cancelled)
	for _, o := range got {
		if err := o.l.Release(ctx); err != nil {
			// Not confirmed: it ends with its TTL, which the checks
			// below allow for (a lease nobody returned renews forever).
			t.Logf("release of %s %v: %v", o.kind, o.resources, err)
		}
	}
	// The cancels and releases that the calls left to the background.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, o := range outcomes {
		a := o.attempt
		if a.sem != nil {
			testenv.Eventually(t, 15*time.Second, func() bool {
				st, err := a.sem.Status(ctx)
				return err == nil && st.Held == 0 && st.Waiters == 0
			}, "semaphore %s: a permit still held or waited for after the call returned an error", a.sem.Name())
		}
		for _, r := range a.resources {
			testenv.Eventually(t, 15*time.Second, func() bool {
				st, err := c.Status(ctx, r)
				return err == nil && !st.Held && st.Waiters == 0
			}, "%s %s still held or waited for after the call returned an error", a.kind, r)
		}
	}
}

// cancelAtGrant is a context cancelled the first time its Done or Err is
// looked at once granted is set: a caller that gives up exactly as its
// grant arrives.
type cancelAtGrant struct {
	context.Context
	cancel  context.CancelFunc
	granted atomic.Bool
}

func (c *cancelAtGrant) Done() <-chan struct{} {
	if c.granted.Load() {
		c.cancel()
	}
	return c.Context.Done()
}

func (c *cancelAtGrant) Err() error {
	if c.granted.Load() {
		c.cancel()
	}
	return c.Context.Err()
}

// P1: a call returns within its context even with the cluster gone. The
// cancel of the abandoned request is left to the background (Close waits
// for it); the client used to send it synchronously on a fresh 5s context,
// so that Acquire with an 8s context returned after 13s.
func TestCallsReturnWithinTheirContextWithTheClusterStopped(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	env.Cluster.StopAll()
	const within = 2 * time.Second
	calls := map[string]func(ctx context.Context) error{
		"Acquire": func(ctx context.Context) error {
			_, err := c.Acquire(ctx, "gone/1")
			return err
		},
		"TryAcquire": func(ctx context.Context) error {
			_, err := c.TryAcquire(ctx, "gone/2")
			return err
		},
		"TryAcquireAll": func(ctx context.Context) error {
			_, err := c.TryAcquireAll(ctx, []string{"gone/3", "gone/4"})
			return err
		},
	}
	var wg sync.WaitGroup
	for name, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			deadline, _ := cctx.Deadline()
			err := call(cctx)
			if over := time.Since(deadline); over > within {
				t.Errorf("%s returned %v after its ctx's deadline (the cleanup must not delay it)", name, over)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: %v, want the ctx's error", name, err)
			}
		}()
	}
	wg.Wait()
	// The cleanups end by themselves, each within the request timeout.
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close still waiting for the cleanups after 30s: are they bounded?")
	}
}

// P4: giving up a wait touches nothing but that wait. Owner host:100
// holds a lock acquired with request id R; owner host:200 waits for the
// same resource with the same R and gives up. The cancel names its owner,
// and the service ends only what that owner's request holds or waits for:
// the first holder keeps its lease and renews it.
func TestCancelledWaitLeavesAnotherOwnersLeaseWithTheSameRequestID(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	const res, id = "cancel/owner", "R-shared"
	first, err := c.Acquire(ctx, res, client.Owner("host:100"), client.RequestID(id), client.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(ctx) //nolint:errcheck
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Acquire(wctx, res, client.Owner("host:200"), client.RequestID(id), client.Wait(10*time.Minute))
		errc <- err
	}()
	waitWaiters(t, ctx, c, res, 1, 10*time.Second, "host:200 never queued")
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled wait: %v", err)
	}
	if err := c.Close(); err != nil { // the cancel has been answered
		t.Fatal(err)
	}
	waitWaiters(t, ctx, c, res, 0, 10*time.Second, "the cancelled waiter stayed queued")
	st, err := c.Status(ctx, res)
	if err != nil || !st.Held || st.Token != first.Token() || st.Owner != "host:100" {
		t.Fatalf("after another owner's cancel with the same request id: %+v %v, want host:100's lease (token %d)", st, err, first.Token())
	}
	// Still renewed: the service never ended it.
	for range 2 {
		select {
		case <-first.Renewed():
		case <-first.Lost():
			t.Fatalf("host:100's lease lost: %v", context.Cause(first.Context()))
		}
	}
}

// P9: Observe ends when the connection closes, even before its first
// status read succeeded (no service answers), and leaks no goroutine. It
// used to retry that first read, every second, forever.
func TestObserveEndsWhenTheConnectionClosesBeforeItsFirstRead(t *testing.T) {
	env := testenv.Start(t)
	inst := env.Serve(testenv.Config())
	nc := env.Connect()
	c, err := client.New(nc, client.WithRequestTimeout(500*time.Millisecond), client.WithRetries(1))
	if err != nil {
		t.Fatal(err)
	}
	e, err := c.NewElection("observe/closed")
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	changes := e.Observe(context.Background())
	nc.Close()
	select {
	case ch, ok := <-changes:
		if ok {
			t.Fatalf("a change %+v with no service to read it from", ch)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Observe's channel still open 30s after its connection closed")
	}
	// Its goroutine ends (the cluster's servers, in this process, start
	// and stop goroutines of their own meanwhile: look for Observe's).
	testenv.Eventually(t, 10*time.Second, func() bool {
		buf := make([]byte, 1<<22)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "client.(*observer).run")
	}, "Observe's goroutine still runs after its channel closed")
}

// P8: a wait rides out an unavailable service (no responders while it
// restarts) until its own bound. Acquire used to give up after the
// retries of one request (about a second), with ErrUnavailable.
func TestAcquireWaitRidesOutAServiceRestart(t *testing.T) {
	env := testenv.Start(t)
	inst := env.Serve(testenv.Config())
	c, err := client.New(env.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 90*time.Second)
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *client.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := c.Acquire(ctx, "ride/1", client.Wait(60*time.Second))
		got <- result{l, err}
	}()
	// No service answers: nothing can end the wait but its bound. The
	// outage outlasts the retries of one request several times over.
	select {
	case r := <-got:
		t.Fatalf("the wait ended with no service: %v", r.err)
	case <-time.After(3 * time.Second):
	}
	env.Serve(testenv.Config())
	r := <-got
	if r.err != nil {
		t.Fatalf("the wait after the service came back: %v", r.err)
	}
	if st, err := c.Status(ctx, "ride/1"); err != nil || !st.Held || st.Token != r.l.Token() {
		t.Fatalf("status %+v %v", st, err)
	}
	_ = r.l.Release(ctx)
}

// P5 and P3: an acquire of a lock set retried with the same request id
// returns the same lease, renewed: the service's expiry moves with the
// retry, and the client's deadline, counted from the retry's send, stays
// before it. The service used to answer a retried set without renewing
// it, while the client counted from the retry: two holders for a while.
func TestRetriedSetAcquireRenewsTheSet(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	set := []string{"retry/set/a", "retry/set/b"}
	const ttl = 4 * time.Second
	first, err := c.TryAcquireAll(ctx, set, client.RequestID("set-retry"), client.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(ctx) //nolint:errcheck
	before, err := c.Status(ctx, set[0])
	if err != nil {
		t.Fatal(err)
	}
	// Retry once the service's expiry has visibly moved on the wall
	// clock: a second after the grant.
	testenv.Eventually(t, 10*time.Second, func() bool { return time.Since(before.ExpiresAt.Add(-ttl)) > time.Second }, "no second passed")
	retried, err := c.TryAcquireAll(ctx, set, client.RequestID("set-retry"), client.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer retried.Release(ctx) //nolint:errcheck
	if retried.ID() != first.ID() {
		t.Fatalf("the retry got lease %s, the first %s", retried.ID(), first.ID())
	}
	for _, r := range set {
		t1, _ := first.TokenOf(r)
		t2, _ := retried.TokenOf(r)
		st, err := c.Status(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if t2 != t1 || st.Token != t1 {
			t.Fatalf("%s: tokens %d (first) %d (retry) %d (status)", r, t1, t2, st.Token)
		}
		if !st.ExpiresAt.After(before.ExpiresAt) {
			t.Fatalf("%s: the retry did not renew the set: expiry %v, before it %v", r, st.ExpiresAt, before.ExpiresAt)
		}
		// Both clocks are this machine's here: the client's deadline
		// comes before the service's expiry.
		if !retried.Expires().Before(st.ExpiresAt) {
			t.Fatalf("%s: the client's deadline %v after the service's expiry %v", r, retried.Expires(), st.ExpiresAt)
		}
	}
}

// P7: an outage that ends before the client's deadline does not end the
// lease: renewals retry until the deadline, and the first that gets
// through moves it.
func TestShortOutageKeepsTheLease(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	p, pc := viaProxy(t, env, 0)
	l, err := pc.TryAcquire(ctx, "outage/1", client.TTL(9*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx) //nolint:errcheck
	select {
	case <-l.Renewed(): // right after a renewal: the whole deadline ahead
	case <-l.Lost():
		t.Fatalf("lost: %v", context.Cause(l.Context()))
	}
	deadline := l.Expires()
	p.Cut()
	// Longer than a renewal interval (a third of the TTL), well before
	// the deadline (the TTL less the margin).
	time.Sleep(4 * time.Second)
	p.Heal()
	for renewed := l.Renewed(); !l.Expires().After(deadline); renewed = l.Renewed() {
		select {
		case <-renewed:
		case <-l.Lost():
			t.Fatalf("lost though the outage ended before the deadline %v: %v", deadline, context.Cause(l.Context()))
		}
	}
	if st, err := c.Status(ctx, "outage/1"); err != nil || !st.Held || st.Token != l.Token() {
		t.Fatalf("status after the outage %+v %v", st, err)
	}
}
