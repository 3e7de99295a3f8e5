package service_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// Fair use: an owner that sends acquires, and a NATS user (as the server
// vouches for it on the account import) that sends operations, faster than
// their rate are answered
// unavailable with retry_after_ms, and the refused acquire changes
// nothing; other owners and other users are not held back by them.
//
// The buckets refill while the test runs, the slower the machine the
// more: each count of grants is checked against the burst plus what the
// time it took refilled, and each caller sends until it is refused (a
// rate of one or two a second is far below any machine's).
func TestFairUseLimitsOwnersAndUsers(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	cfg.OwnerRate, cfg.UserRate = 1, 2 // bursts of 2 and 4
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	env.Serve(cfg)
	// A tenant of its own, that no readiness probe of the test's has used.
	c := caller{t: t, nc: env.ConnectAs(devcluster.Operator)}
	app := caller{t: t, nc: env.ConnectAs(devcluster.App)}

	start := time.Now()
	acquire := func(c caller, owner, resource string) reply {
		return c.send(streams.OpAcquire, streams.AcquireRequest{Resource: resource, RequestID: "r-" + resource, Owner: owner})
	}
	refused := func(r reply, scope string) bool {
		return r.errCode == streams.CodeUnavailable && r.err.RetryAfterMs > 0 && strings.Contains(r.err.Message, "this "+scope)
	}

	// The owner "noisy" has a burst of 2, refilled at 1 a second.
	for i := range 2 {
		if r := acquire(c, "noisy", fmt.Sprintf("fair/noisy/%d", i)); r.errCode != "" {
			t.Fatalf("noisy acquire %d within its burst: %s %s", i, r.errCode, r.err.Message)
		}
	}
	noisy, refusedAt := 2, -1
	for i := 2; i < 20 && refusedAt < 0; i++ {
		switch r := acquire(c, "noisy", fmt.Sprintf("fair/noisy/%d", i)); {
		case r.errCode == "":
			noisy++
		case refused(r, "owner"):
			refusedAt = i
		default:
			t.Fatalf("noisy's acquire %d: %q %+v, want unavailable for the owner with retry_after_ms", i, r.errCode, r.err)
		}
	}
	if refill := int(time.Since(start).Seconds()) + 1; refusedAt < 0 || noisy > 2+refill {
		t.Fatalf("noisy got %d grants (refused: %v); want its burst of 2, plus %d refilled", noisy, refusedAt >= 0, refill)
	}
	if st := c.status(fmt.Sprintf("fair/noisy/%d", refusedAt)); st.Held {
		t.Fatalf("a refused acquire was granted: %+v", st)
	}

	// The caller's user has a burst of 4, of which noisy used 2: other
	// owners on the same user soon hit the user's limit.
	ok, userRefused := 0, false
	for i := 0; i < 40 && !userRefused; i++ {
		r := acquire(c, fmt.Sprintf("quiet-%d", i), fmt.Sprintf("fair/quiet/%d", i))
		switch {
		case r.errCode == "":
			ok++
		case refused(r, "user"):
			userRefused = true
		default:
			t.Fatalf("quiet acquire %d: %q %s", i, r.errCode, r.err.Message)
		}
	}
	refill := int(2*time.Since(start).Seconds()) + 1
	if !userRefused || ok > 2+refill {
		t.Fatalf("the caller's user got %d more grants (refused for the user: %v); want its burst of 4 less noisy's 2, plus %d refilled", ok, userRefused, refill)
	}

	// Another user is not held back by the first one's use.
	if r := acquire(app, "quiet-app", "fair/app"); r.errCode != "" {
		t.Fatalf("another user's acquire: %s %s", r.errCode, r.err.Message)
	}
	if n := testenv.Metric(t, reg, "jetlock_rate_limited_total", map[string]string{"scope": "owner"}); n < 1 {
		t.Errorf("jetlock_rate_limited_total{scope=owner} = %v, want at least 1", n)
	}
	if n := testenv.Metric(t, reg, "jetlock_rate_limited_total", map[string]string{"scope": "user"}); n < 1 {
		t.Errorf("jetlock_rate_limited_total{scope=user} = %v, want at least 1", n)
	}
}
