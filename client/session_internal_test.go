package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/testenv"
)

// pausedSession opens a session with ttl and a lease of it on resource,
// then holds its keepalive loop as a pause would, and returns once the
// loop is held: from then on the deadline no longer moves.
func pausedSession(t *testing.T, resource string, ttl time.Duration) (*Client, *Session, *Lease) {
	t.Helper()
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c, err := New(env.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx, SessionTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, resource)
	if err != nil {
		t.Fatal(err)
	}
	held, resume := make(chan struct{}), make(chan struct{})
	first := true
	hook := func() {
		if first {
			first = false
			close(held)
		}
		<-resume
	}
	s.beforeKeepalive.Store(&hook)
	t.Cleanup(func() {
		close(resume)
		_ = s.Close()
	})
	select {
	case <-held:
	case <-time.After(ttl):
		t.Fatal("no keepalive attempted in a TTL")
	}
	return c, s, l
}

// With its keepalive loop held (a paused or starved goroutine), a session
// is still lost at its deadline, by the expiry timer, while the service
// still refuses the resource to others.
func TestSessionLostAtDeadlineWhileKeepaliveHeld(t *testing.T) {
	const ttl = 2 * time.Second
	c, s, l := pausedSession(t, "paused/1", ttl)
	deadline := s.Expires()
	select {
	case <-s.life.lost:
	case <-time.After(2 * ttl):
		t.Fatal("Lost never closed with the keepalive loop held")
	}
	lostAt := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.TryAcquire(ctx, "paused/1")
	var he *HeldError
	if !errors.As(err, &he) || he.Token != l.Token() {
		t.Fatalf("acquire by another when Lost closed: %v, want locked by token %d", err, l.Token())
	}
	if lostAt.Before(deadline) || lostAt.Sub(deadline) > 200*time.Millisecond {
		t.Fatalf("Lost closed at %v from the deadline, want at it", lostAt.Sub(deadline))
	}
	testenv.Eventually(t, time.Second, func() bool {
		select {
		case <-l.life.lost:
			return true
		default:
			return false
		}
	}, "the lease not lost with its session")
	if !errors.Is(context.Cause(l.Context()), ErrLeaseLost) {
		t.Fatalf("lease cause %v", context.Cause(l.Context()))
	}
	next, err := c.Acquire(ctx, "paused/1", Wait(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= l.Token() {
		t.Fatalf("token %d not above %d", next.Token(), l.Token())
	}
	_ = next.Release(ctx)
}

// A process that wakes up past its deadline sees the loss the first time
// it looks, even before the expiry timer has run: Lost, Context and Err
// check the clock. Here the timer is stopped, as if it had not run yet.
func TestSessionLossSeenOnWakeBeforeTimer(t *testing.T) {
	const ttl = 2 * time.Second
	_, s, l := pausedSession(t, "paused/2", ttl)
	s.life.mu.Lock()
	s.life.expiry.Stop()
	s.life.mu.Unlock()
	time.Sleep(time.Until(s.Expires()) + 50*time.Millisecond)
	select {
	case <-s.life.lost:
		t.Fatal("lost before anyone looked: the timer was not stopped")
	default:
	}
	// The lease is looked at first: its session's clock is checked.
	if err := l.Context().Err(); err == nil {
		t.Fatal("the lease's Context not cancelled past the session's deadline")
	}
	select {
	case <-l.life.lost:
	default:
		t.Fatal("the lease's Lost still open past the session's deadline")
	}
	select {
	case <-s.Lost():
	default:
		t.Fatal("the session's Lost still open past its deadline")
	}
	if cause := context.Cause(s.Context()); !errors.Is(cause, ErrLeaseLost) {
		t.Fatalf("cause %v", cause)
	}
	if err := s.ended(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("acquire on the lost session: %v", err)
	}
}
