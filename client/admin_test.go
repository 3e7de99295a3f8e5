package client_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
)

// A revoke without an operator's rights is refused by the NATS server, and
// Revoke says so at once (not ErrUnavailable after its timeout and
// retries), every time; the connection's own error handler still hears of
// it; an operator's revoke works.
func TestRevokeWithoutRightsIsPermissionDenied(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	heard := make(chan error, 8)
	nc := env.ConnectAs(devcluster.Caller, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case heard <- err:
		default:
		}
	}))
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)
	l, err := c.TryAcquire(ctx, "perm/1")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // each refusal is told from the one before
		start := time.Now()
		_, err := c.Revoke(ctx, "perm/1", "test")
		took := time.Since(start)
		if !errors.Is(err, client.ErrPermission) || !errors.Is(err, nats.ErrPermissionViolation) || errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("revoke %d as a caller: %v, want ErrPermission wrapping the server's refusal", i, err)
		}
		if want := `jetlock: permission denied: publish to "jetlock.v1.admin.revoke" refused by the NATS server`; err.Error() != want {
			t.Fatalf("revoke %d: %q, want %q", i, err, want)
		}
		// At once, not after the request timeout (5s) and its retries:
		// a wide bound tells them apart on a busy machine too.
		if took > 4*time.Second {
			t.Fatalf("revoke %d took %v, want the refusal before the request timeout", i, took)
		}
		t.Logf("revoke %d refused after %v", i, took)
	}
	select {
	case err := <-heard:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("the connection's handler heard %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the connection's own error handler never heard of the refusal")
	}
	// The refusals leave the caller's other requests alone.
	if st, err := c.Status(ctx, "perm/1"); err != nil || !st.Held || st.Token != l.Token() {
		t.Fatalf("status after the refusals: %+v %v", st, err)
	}

	// A user of the service's own account may publish the subject, but
	// the server stamps no identity there: the service answers forbidden,
	// which is ErrPermission too, and nothing changes.
	inside, err := client.New(env.ConnectAs(devcluster.Admin))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inside.Revoke(ctx, "perm/1", "test"); !errors.Is(err, client.ErrPermission) || errors.Is(err, nats.ErrPermissionViolation) ||
		!strings.Contains(err.Error(), "operator") {
		t.Fatalf("revoke without a stamped identity: %v, want ErrPermission from the service", err)
	}
	if st, err := c.Status(ctx, "perm/1"); err != nil || !st.Held || st.Token != l.Token() {
		t.Fatalf("status after the forbidden revoke: %+v %v", st, err)
	}

	op, err := client.New(env.ConnectAs(devcluster.Operator))
	if err != nil {
		t.Fatal(err)
	}
	rv, err := op.Revoke(ctx, "perm/1", "test")
	if err != nil || !rv.Revoked || rv.Token != l.Token() {
		t.Fatalf("operator's revoke: %+v %v", rv, err)
	}
	select {
	case <-l.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("the revoked lease was never lost")
	}
}

// An error's text names its sentinel once, then the detail: the service's
// message, or the contract validator's, without their own "invalid
// request: ".
func TestErrorTextReadsOnce(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 30*time.Second)
	for _, tc := range []struct {
		err    func() error
		is     error
		detail string // in the text after the sentinel's
	}{
		{func() error { _, err := c.TryAcquire(ctx, "once/1", client.TTL(time.Hour)); return err },
			client.ErrInvalidRequest, "ttl_ms 3600000"}, // the service's bound
		{func() error { _, err := c.TryAcquire(ctx, "bad resource"); return err },
			client.ErrInvalidRequest, "resource "}, // the client's check
		{func() error { _, err := c.Renew(ctx, "once/1", "0123456789abcdef0123456789abcdef", 0); return err },
			client.ErrLeaseLost, "no longer current"},
		{func() error { _, err := c.TryAcquire(ctx, "once/1", client.Owner(string(rune(1)))); return err },
			client.ErrInvalidOption, "owner "},
	} {
		err := tc.err()
		if !errors.Is(err, tc.is) {
			t.Errorf("error %v, want %v", err, tc.is)
			continue
		}
		text, prefix := err.Error(), tc.is.Error()+": "
		if !strings.HasPrefix(text, prefix) || !strings.Contains(text, tc.detail) {
			t.Errorf("error %q, want %q then %q", text, prefix, tc.detail)
		}
		for _, w := range []string{"jetlock: ", strings.TrimPrefix(tc.is.Error(), "jetlock: "), "invalid request"} {
			if strings.Count(text, w) > 1 {
				t.Errorf("error %q says %q twice", text, w)
			}
		}
	}
}
