package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client"
)

// A lease held by id alone (a script's) renews and releases through the
// client's by-id calls, and Reply is the grant's wire form.
func TestRenewAndReleaseByID(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 30*time.Second)
	l, err := c.TryAcquire(ctx, "by-id/1", client.TTL(5*time.Second), client.Owner("script"))
	if err != nil {
		t.Fatal(err)
	}
	r := l.Reply()
	if r.LeaseID != l.ID() || r.Token != l.Token() || r.Resource != "by-id/1" || r.TTLms != 5000 || r.ExpiresAt == "" {
		t.Fatalf("reply %+v does not describe the lease", r)
	}
	resp, err := c.Renew(ctx, "by-id/1", l.ID(), 8*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Token != l.Token() || resp.TTLms != 8000 || resp.LeaseID != l.ID() {
		t.Fatalf("renew reply %+v", resp)
	}
	if _, err := c.Renew(ctx, "by-id/1", "not-the-id", 0); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("renew with a wrong id: %v, want ErrLeaseLost", err)
	}
	if _, err := c.Renew(ctx, "", l.ID(), 0); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("renew without resource: %v, want ErrInvalidRequest", err)
	}
	released, err := c.Release(ctx, "by-id/1", l.ID())
	if err != nil || !released {
		t.Fatalf("release: %v %v", released, err)
	}
	released, err = c.Release(ctx, "by-id/1", l.ID())
	if err != nil || released {
		t.Fatalf("second release: %v %v, want false, nil", released, err)
	}
	if _, err := c.Renew(ctx, "by-id/1", l.ID(), 0); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("renew after release: %v, want ErrLeaseLost", err)
	}
	st, err := c.Status(ctx, "by-id/1")
	if err != nil || st.Held {
		t.Fatalf("status after release: %+v %v", st, err)
	}
}
