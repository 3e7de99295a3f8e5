package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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

// sentBy runs fn and returns how many messages the connection nc sent
// meanwhile: a call that must send nothing is checked by what it sent, not
// by how long it took. Nothing else may use nc meanwhile.
func sentBy(t *testing.T, nc *nats.Conn, fn func()) uint64 {
	t.Helper()
	before := nc.Stats().OutMsgs
	fn()
	return nc.Stats().OutMsgs - before
}

// With no service answering, Release gives up at the lease's deadline
// rather than at the end of its ctx (ErrUnavailable: outcome unknown), and
// a Release after the deadline sends nothing (issue 32).
func TestReleaseEndsAtTheLeaseDeadline(t *testing.T) {
	env := testenv.Start(t)
	inst := env.Serve(testenv.Config())
	nc := env.Connect()
	c, err := client.New(nc)
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
	// At the deadline, not at the end of ctx (a minute): a wide bound
	// tells them apart on a busy machine too.
	if over := time.Since(deadline); over > 2*time.Second {
		t.Fatalf("release returned %v after the lease's deadline", over)
	}

	select {
	case <-late.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the unrenewed lease was not lost by its deadline")
	}
	if sent := sentBy(t, nc, func() {
		if err := late.Release(ctx); err != nil {
			t.Fatalf("release after the deadline: %v, want nil", err)
		}
	}); sent != 0 {
		t.Fatalf("release after the deadline sent %d messages, want none", sent)
	}
}
