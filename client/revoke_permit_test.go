package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
)

// An operator revokes one permit of a semaphore: List and Status show
// the permits with their numbers, Revoke with RevokePermit ends the one named (its
// holder's Lost closes), and the other permit stays held.
func TestRevokeAPermit(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c, err := client.New(env.Connect())
	if err != nil {
		t.Fatal(err)
	}
	op, err := client.New(env.ConnectAs(devcluster.Operator))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	sem, err := c.NewSemaphore("pool/r", 2)
	if err != nil {
		t.Fatal(err)
	}
	a, err := sem.TryAcquire(ctx, client.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := sem.TryAcquire(ctx, client.TTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for st, err := range op.List(ctx, "pool/") {
		if err != nil {
			t.Fatal(err)
		}
		if st.Resource != "pool/r" {
			t.Fatalf("list shows %q", st.Resource)
		}
		seen[st.Permit] = true
	}
	if !seen[a.Permit()] || !seen[b.Permit()] || len(seen) != 2 {
		t.Fatalf("list shows permits %v, want %d and %d", seen, a.Permit(), b.Permit())
	}
	// Status of the semaphore's name shows it as the semaphore it is.
	st, err := c.Status(ctx, "pool/r")
	if err != nil || !st.Held || st.Limit != 2 || len(st.Permits) != 2 {
		t.Fatalf("status of the semaphore's name: %+v %v", st, err)
	}
	if _, err := op.Revoke(ctx, "pool/r", "stuck", client.RevokePermit(0)); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("permit 0: %v, want ErrInvalidOption", err)
	}
	rv, err := op.Revoke(ctx, "pool/r", "stuck", client.RevokePermit(a.Permit()))
	if err != nil || !rv.Revoked || rv.Permit != a.Permit() || rv.Token != a.Token() {
		t.Fatalf("revoke of permit %d: %+v %v", a.Permit(), rv, err)
	}
	select {
	case <-a.Lost(): // at its next renewal, refused
	case <-ctx.Done():
		t.Fatal("the revoked permit's Lost never closed")
	}
	if !errors.Is(context.Cause(a.Context()), client.ErrLeaseLost) {
		t.Fatalf("the revoked permit's context ended with %v", context.Cause(a.Context()))
	}
	// The other permit goes on renewing.
	for range 2 {
		select {
		case <-b.Renewed():
		case <-b.Lost():
			t.Fatal("the other permit was lost")
		case <-ctx.Done():
			t.Fatal("the other permit was not renewed")
		}
	}
}
