package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// notLost fails if ch is closed.
func notLost(t *testing.T, what string, ch <-chan struct{}, ctx context.Context) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s lost: %v", what, context.Cause(ctx))
	default:
	}
}

// renewedThrice waits for three renewals (renewed closing), failing the
// test if lost closes first: a lease or a session outlives its TTL by its
// renewals, told by events rather than by a sleep.
func renewedThrice(t *testing.T, what string, renewed func() <-chan struct{}, lost <-chan struct{}, ctx context.Context) {
	t.Helper()
	for range 3 {
		select {
		case <-renewed():
		case <-lost:
			t.Fatalf("%s lost: %v", what, context.Cause(ctx))
		}
	}
}

// isLost fails unless ch is closed.
func isLost(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	default:
		t.Fatalf("%s not lost", what)
	}
}

// One keepalive keeps every lease of a session alive; Close releases them
// all at once and stops everything the session started.
func TestSessionKeepsLeasesAliveAndCloseReleasesThem(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	// The connection's shared reply subscription is the caller's, made by
	// the first request; everything the session starts after it must stop.
	if _, err := c.Status(ctx, "sess/a"); err != nil {
		t.Fatal(err)
	}
	leaks := goleak.IgnoreCurrent()
	const ttl = 3 * time.Second
	s, err := c.NewSession(ctx, client.SessionTTL(ttl), client.SessionOwner("worker"))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.ID()) != streams.SessionIDLen || s.TTL() != ttl || s.Owner() != "worker" {
		t.Fatalf("session id %q (%d chars), ttl %v, owner %q", s.ID(), len(s.ID()), s.TTL(), s.Owner())
	}
	first := s.Expires()
	if until := time.Until(first); until <= 0 || until > ttl {
		t.Fatalf("session deadline %v from now, want within the %v TTL", until, ttl)
	}
	a, err := s.Acquire(ctx, "sess/a", client.Owner("job-a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.TryAcquire(ctx, "sess/b")
	if err != nil {
		t.Fatal(err)
	}
	if a.Token() == 0 || a.ID() == "" || b.Token() == 0 {
		t.Fatalf("bad leases: %d %q, %d", a.Token(), a.ID(), b.Token())
	}
	if a.Expires() != s.Expires() {
		t.Fatalf("lease deadline %v, session's %v", a.Expires(), s.Expires())
	}
	renewedThrice(t, "session", s.Renewed, s.Lost(), s.Context()) // only keepalives keep them
	notLost(t, "session", s.Lost(), s.Context())
	notLost(t, "lease a", a.Lost(), a.Context())
	notLost(t, "lease b", b.Lost(), b.Context())
	if !s.Expires().After(first) {
		t.Fatal("session deadline never moved: no keepalive happened")
	}
	if a.Expires() != s.Expires() {
		t.Fatalf("lease deadline %v does not follow the session's %v", a.Expires(), s.Expires())
	}
	st, err := c.Status(ctx, "sess/a")
	if err != nil || !st.Held || st.Token != a.Token() || st.Owner != "job-a" || !st.InSession || st.SessionOwner != "worker" {
		t.Fatalf("status %+v %v", st, err)
	}
	var listed *client.Status
	for st, err := range c.List(ctx, "sess/") {
		if err != nil {
			t.Fatal(err)
		}
		if st.Resource == "sess/b" {
			listed = st
		}
	}
	if listed == nil || !listed.InSession || listed.SessionOwner != "worker" || listed.Token != b.Token() {
		t.Fatalf("list shows sess/b as %+v", listed)
	}

	// A lease of the session is released on its own, the session lives on.
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	isLost(t, "released lease b", b.Lost())
	if st, _ := c.Status(ctx, "sess/b"); st.Held {
		t.Fatalf("sess/b held after its release: %+v", st)
	}
	notLost(t, "session", s.Lost(), s.Context())

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	isLost(t, "closed session", s.Lost())
	if cause := context.Cause(s.Context()); !errors.Is(cause, client.ErrSessionClosed) {
		t.Fatalf("session cause %v, want ErrSessionClosed", cause)
	}
	testenv.Eventually(t, time.Second, func() bool {
		select {
		case <-a.Lost():
			return true
		default:
			return false
		}
	}, "the session's lease not lost after Close")
	if cause := context.Cause(a.Context()); !errors.Is(cause, client.ErrReleased) || !errors.Is(cause, client.ErrSessionClosed) {
		t.Fatalf("lease cause %v, want ErrReleased and ErrSessionClosed", cause)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("release of a closed session's lease: %v", err)
	}
	if st, _ := c.Status(ctx, "sess/a"); st.Held {
		t.Fatalf("sess/a held after the session closed: %+v", st)
	}
	if _, err := s.TryAcquire(ctx, "sess/c"); !errors.Is(err, client.ErrSessionClosed) {
		t.Fatalf("acquire on a closed session: %v, want ErrSessionClosed", err)
	}
	// Someone else takes the resource at once, with a larger token.
	next, err := c.TryAcquire(ctx, "sess/a")
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= a.Token() {
		t.Fatalf("token %d not above %d", next.Token(), a.Token())
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, leaks, goleak.IgnoreAnyFunction("github.com/jetlock/jetlock/service.(*workers).run"))
}

// A session's acquires queue like anyone's, the TTL option is refused,
// and a session's wait ends when the session closes.
func TestSessionAcquireWaitsAndTTLIsRefused(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	holder, err := c.TryAcquire(ctx, "sess/q", client.Owner("alice"), client.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.NewSession(ctx, client.SessionTTL(3*time.Second), client.SessionOwner("bob"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close() //nolint:errcheck

	// Refused by the client: ErrInvalidOption, which the service never
	// answers (it would say ErrInvalidRequest).
	_, err = s.TryAcquire(ctx, "sess/q", client.TTL(time.Minute))
	if !errors.Is(err, client.ErrInvalidOption) || !strings.Contains(err.Error(), "session") {
		t.Fatalf("TTL with a session: %v, want ErrInvalidOption naming the session", err)
	}
	_, err = s.TryAcquire(ctx, "sess/q")
	var he *client.HeldError
	if !errors.As(err, &he) || he.Owner != "alice" || he.Token != holder.Token() {
		t.Fatalf("TryAcquire of a held resource: %v", err)
	}

	got := make(chan *client.Lease, 1)
	go func() {
		l, err := s.Acquire(ctx, "sess/q", client.Owner("bob-job"))
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitWaiters(t, ctx, c, "sess/q", 1, 5*time.Second, "the session's acquire never queued")
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var l *client.Lease
	select {
	case l = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the session's Acquire did not get the released lock")
	}
	if l == nil || l.Token() <= holder.Token() {
		t.Fatalf("waiter got %v", l)
	}
	// Granted after a wait, it is held past the hand-over TTL by the
	// session's keepalives alone.
	if st, err := c.Status(ctx, "sess/q"); err != nil || !st.InSession || st.Token != l.Token() {
		t.Fatalf("status %+v %v", st, err)
	}

	// A second session waits for the first's lease; closing it ends the
	// wait and leaves nothing queued.
	s2, err := c.NewSession(ctx, client.SessionTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := s2.Acquire(ctx, "sess/q")
		errc <- err
	}()
	waitWaiters(t, ctx, c, "sess/q", 1, 5*time.Second, "the second session never queued")
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, client.ErrSessionClosed) {
			t.Fatalf("wait of a closed session: %v, want ErrSessionClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the wait went on after its session closed")
	}
	waitWaiters(t, ctx, c, "sess/q", 0, 5*time.Second, "a closed session's wait left in the queue")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// When keepalives stop getting through, Lost closes at the client's
// deadline: the send time of the last keepalive that succeeded plus the
// TTL minus the safety margin. At that moment the service still refuses
// the resource to others; it grants it later, with a larger token.
func TestSessionLostBeforeServiceExpiry(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	nc := env.Connect()
	holderClient, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second
	s, err := holderClient.NewSession(ctx, client.SessionTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "sess/lost")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Renewed():
	case <-time.After(5 * time.Second):
		t.Fatal("no keepalive in 5s")
	}

	nc.Close() // no keepalive gets through from now on
	deadline := s.Expires()
	select {
	case <-s.Lost():
	case <-time.After(2 * ttl):
		t.Fatal("Lost never closed without keepalives")
	}
	lostAt := time.Now()
	// The service must still hold the session's lease now.
	_, err = c.TryAcquire(ctx, "sess/lost")
	var he *client.HeldError
	if !errors.As(err, &he) || he.Token != l.Token() {
		t.Fatalf("acquire by another when Lost closed: %v, want locked by token %d", err, l.Token())
	}
	if lostAt.Before(deadline) {
		t.Fatalf("Lost closed %v before the deadline with no refusal", deadline.Sub(lostAt))
	}
	if late := lostAt.Sub(deadline); late > time.Second { // a wide bound, for a busy machine
		t.Fatalf("Lost closed %v after the client's deadline", late)
	}
	if cause := context.Cause(s.Context()); !errors.Is(cause, client.ErrLeaseLost) {
		t.Fatalf("session cause %v, want ErrLeaseLost", cause)
	}
	isLost(t, "the session's lease", l.Lost())
	if cause := context.Cause(l.Context()); !errors.Is(cause, client.ErrLeaseLost) {
		t.Fatalf("lease cause %v, want ErrLeaseLost", cause)
	}
	if !l.Expires().Equal(deadline) {
		t.Fatalf("lease deadline %v, session's %v", l.Expires(), deadline)
	}

	// An acquire on the lost session sends nothing: it says the session
	// is lost, not that its (closed) connection failed.
	if _, err := s.TryAcquire(ctx, "sess/other"); !errors.Is(err, client.ErrLeaseLost) || errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("acquire on a lost session: %v, want ErrLeaseLost", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release of a lost session's lease: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close of a lost session: %v", err)
	}

	// The service ends the session in its own time; then the resource is
	// granted with a larger token.
	next, err := c.Acquire(ctx, "sess/lost", client.Wait(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= l.Token() {
		t.Fatalf("token %d not above %d", next.Token(), l.Token())
	}
	if took := time.Since(lostAt); took > ttl+5*time.Second {
		t.Fatalf("granted %v after the loss", took)
	}
	_ = next.Release(ctx)
}

// A keepalive that the service refuses (the session has ended: here,
// closed by a second holder of the same open) ends the session at once,
// not at its deadline; an open retried with the ended session's request
// id is refused.
func TestSessionKeepaliveRefusedEndsItAtOnce(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	const ttl = 6 * time.Second
	s1, err := c.NewSession(ctx, client.SessionTTL(ttl), client.SessionRequestID("sess-refused"), client.SessionOwner("twin"))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c.NewSession(ctx, client.SessionTTL(ttl), client.SessionRequestID("sess-refused"), client.SessionOwner("twin"))
	if err != nil {
		t.Fatal(err)
	}
	if s1.ID() != s2.ID() {
		t.Fatal("an open retried with its request id got another session")
	}
	l, err := s1.Acquire(ctx, "sess/refused")
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s1.Lost():
	case <-time.After(ttl):
		t.Fatal("Lost not closed after the session ended")
	}
	if left := time.Until(s1.Expires()); left < ttl/4 {
		t.Fatalf("Lost closed only %v before the deadline: not at the refused keepalive", left)
	}
	cause := context.Cause(s1.Context())
	if !errors.Is(cause, client.ErrLeaseLost) || !strings.Contains(cause.Error(), "keepalive refused") {
		t.Fatalf("cause %v, want a refused keepalive", cause)
	}
	testenv.Eventually(t, time.Second, func() bool {
		select {
		case <-l.Lost():
			return true
		default:
			return false
		}
	}, "the lease outlived its session")
	if _, err := c.NewSession(ctx, client.SessionRequestID("sess-refused"), client.SessionOwner("twin")); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("open with an ended session's request id: %v, want ErrLeaseLost", err)
	}
	_ = s1.Close()
}

func TestSessionOptions(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 10*time.Second)
	for _, opt := range []client.SessionOption{
		client.SessionTTL(0),
		client.SessionOwner(strings.Repeat("x", 10_000)),
		client.SessionRequestID(""),
	} {
		if _, err := c.NewSession(ctx, opt); !errors.Is(err, client.ErrInvalidOption) {
			t.Fatalf("bad option: %v, want ErrInvalidOption", err)
		}
	}
	if _, err := c.NewSession(ctx, client.SessionTTL(100*time.Millisecond)); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("ttl below the service's minimum: %v, want ErrInvalidRequest", err)
	}
	s, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.TTL() != 30*time.Second {
		t.Fatalf("default session TTL %v, want the service's 30s", s.TTL())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// A lease of a session lives no longer than its hold cap, although the
// session lives on: it is lost at the client's end of the cap, before the
// service ends it.
func TestSessionLeaseHoldCap(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	s, err := c.NewSession(ctx, client.SessionTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close() //nolint:errcheck
	long, err := s.TryAcquire(ctx, "sess/hold-default")
	if err != nil {
		t.Fatal(err)
	}
	// The deployment's cap (a day by default) leaves the lease to its
	// session.
	if left := time.Until(long.HoldLimit()); left < 23*time.Hour {
		t.Fatalf("hold limit %v from now under the default cap", left)
	}
	if long.Expires() != s.Expires() {
		t.Fatalf("lease deadline %v, session's %v", long.Expires(), s.Expires())
	}
	const hold = 2 * time.Second
	sent := time.Now()
	l, err := s.TryAcquire(ctx, "sess/hold", client.MaxHold(hold))
	if err != nil {
		t.Fatal(err)
	}
	if limit := l.HoldLimit(); limit.IsZero() || limit.After(sent.Add(hold)) || !l.Expires().Equal(limit) {
		t.Fatalf("hold limit %v (deadline %v), want by %v", limit, l.Expires(), sent.Add(hold))
	}
	select {
	case <-l.Lost():
	case <-time.After(2 * hold):
		t.Fatal("the lease outlived its hold cap")
	}
	if lostAt := time.Since(sent); lostAt >= hold {
		t.Fatalf("lost %v after the acquire was sent, not before the %v cap", lostAt, hold)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, client.ErrLeaseLost) || !strings.Contains(cause.Error(), "hold cap") {
		t.Fatalf("cause %v, want the hold cap", cause)
	}
	notLost(t, "session", s.Lost(), s.Context())
	notLost(t, "the uncapped lease", long.Lost(), long.Context())
	next, err := c.Acquire(ctx, "sess/hold", client.Wait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= l.Token() {
		t.Fatalf("token %d not above %d", next.Token(), l.Token())
	}
	_ = next.Release(ctx)
}
