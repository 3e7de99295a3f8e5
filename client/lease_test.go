package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/testenv"
)

// Renewed closes each time a renewal moves the client's deadline.
func TestRenewedFollowsTheDeadline(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 30*time.Second)
	l, err := c.Acquire(ctx, "renewed/1", client.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx) //nolint:errcheck
	for i := range 2 {
		renewed, before := l.Renewed(), l.Expires()
		select {
		case <-renewed:
		case <-l.Lost():
			t.Fatalf("lost: %v", l.Context().Err())
		case <-time.After(5 * time.Second):
			t.Fatalf("renewal %d not seen in 5s", i+1)
		}
		if !l.Expires().After(before) {
			t.Fatalf("Renewed closed but the deadline stayed at %v", before)
		}
	}
}

// With no service answering, Release gives up at the lease's deadline
// rather than at the end of its ctx (ErrUnavailable: outcome unknown), and
// a Release after the deadline sends nothing (issue 32).
func TestReleaseEndsAtTheLeaseDeadline(t *testing.T) {
	env := testenv.Start(t)
	inst := env.Serve(testenv.Config())
	c, err := client.New(env.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	early, err := c.Acquire(ctx, "release-deadline/1", client.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	late, err := c.Acquire(ctx, "release-deadline/2", client.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	deadline := early.Expires()
	err = early.Release(ctx)
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("release with no service: %v, want ErrUnavailable", err)
	}
	if over := time.Since(deadline); over > 500*time.Millisecond {
		t.Fatalf("release returned %v after the lease's deadline", over)
	}

	select {
	case <-late.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the unrenewed lease was not lost by its deadline")
	}
	begin := time.Now()
	if err := late.Release(ctx); err != nil {
		t.Fatalf("release after the deadline: %v, want nil", err)
	}
	if took := time.Since(begin); took > 100*time.Millisecond {
		t.Fatalf("release after the deadline took %v, want no request", took)
	}
}
