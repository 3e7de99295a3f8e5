package service_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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

// A renewal is free when its holder needs it, not whenever it names a
// current lease: a tenant renewing one lease from 24 loops, each renewal
// with a new value, pays for every one past the first, so that no more
// get through than its rate pays for; while the same tenant's holder of
// another lease, renewing every third of its TTL with its value unchanged,
// pays nothing and keeps its lease throughout the flood.
//
// The flood's count of renewals is checked against the burst plus what
// the time it took refilled, whatever the machine's speed.
func TestRenewalsPayPastWhatTheLeaseNeeds(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	const rate = 20
	cfg.UserRate = rate // a burst of 40
	env.Serve(cfg)
	flood := caller{t: t, nc: env.ConnectAs(devcluster.App)}
	holder := caller{t: t, nc: env.ConnectAs(devcluster.App)} // the same tenant
	ch, rep := flood.acquire(streams.AcquireRequest{Resource: "channel", RequestID: "c", TTLms: 30000, Value: "v"})
	if rep.errCode != "" {
		t.Fatalf("acquire: %s %s", rep.errCode, rep.err.Message)
	}
	const ttl = 3 * time.Second
	kept := holder.mustAcquire("kept", "k", ttl.Milliseconds())
	start := time.Now()
	done := make(chan struct{})
	var accepted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				select {
				case <-done:
					return
				default:
				}
				value := fmt.Sprintf("%d-%d-%s", i, j, strings.Repeat("x", 1000))
				r, err := flood.try(streams.OpRenew, streams.RenewRequest{Resource: "channel", LeaseID: ch.LeaseID, TTLms: 30000, Value: value}, 10*time.Second)
				switch {
				case err != nil:
					t.Errorf("flood renewal: %v", err)
					return
				case r.errCode == "":
					accepted.Add(1)
				case r.errCode == streams.CodeUnavailable:
					refused.Add(1)
				default:
					t.Errorf("flood renewal answered %q %s", r.errCode, r.err.Message)
					return
				}
			}
		}()
	}
	// The holder renews as the clients do, six times under the flood.
	for i := range 6 {
		time.Sleep(ttl / 3)
		if _, rep := holder.renew("kept", kept.LeaseID, ttl.Milliseconds()); rep.errCode != "" {
			close(done)
			wg.Wait()
			t.Fatalf("the holder's renewal %d under its tenant's flood: %s %s", i, rep.errCode, rep.err.Message)
		}
	}
	close(done)
	wg.Wait()
	elapsed := time.Since(start)
	// The flood's first renewal is free (a lease's first renewal is); each
	// other pays 2 of the tenant's tokens: its burst less the two
	// acquires, plus what the time refilled.
	most := 1 + (2*rate-2+int64(rate*elapsed.Seconds()+1))/2
	if got := accepted.Load(); got > most || refused.Load() == 0 {
		t.Fatalf("%d renewals with new values accepted (%d refused) in %v; want at most %d", got, refused.Load(), elapsed, most)
	}
	// The flood spent its tenant's tokens, the holder's too: the status
	// waits for them as a client does, for retry_after_ms.
	var st streams.StatusResponse
	for try := 0; ; try++ {
		r := holder.send(streams.OpStatus, streams.StatusRequest{Resource: "kept"})
		if r.errCode == streams.CodeUnavailable && r.err.RetryAfterMs > 0 && try < 10 {
			time.Sleep(time.Duration(r.err.RetryAfterMs) * time.Millisecond)
			continue
		}
		r.decode(t, &st)
		break
	}
	if !st.Held || st.Token != kept.Token {
		t.Fatalf("the holder lost its lease: %+v", st)
	}
}
