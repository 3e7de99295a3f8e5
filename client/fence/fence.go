package fence

import (
	"context"
	"math/rand/v2"
	"time"
)

// Guard keeps, per resource, the highest fencing token it has accepted and
// rejects smaller ones. Implementations in this package are Memory, KV and
// SQL; all are safe for concurrent use.
//
// A Guard on its own only orders tokens. To make the protected operation
// itself safe, the operation must happen inside the same atomic step as the
// check: use Memory.Do, KV.Put or SQL.Write (or SQL.CheckTx in your own
// transaction). A bare Check followed by a separate write leaves a window in
// which a newer holder's write can land first and be overwritten.
type Guard interface {
	// Check accepts token for resource if it is at least the highest token
	// accepted so far, recording it as the new highest, and otherwise
	// returns a *StaleTokenError (matching ErrStaleToken). Equal tokens are
	// accepted: one holder may do many operations. Check returns an error
	// wrapping ErrInvalid for an empty resource or a zero token, ctx.Err()
	// if ctx ends first, and a store error otherwise; after a store error
	// the token may or may not have been recorded, so the caller must treat
	// it as not accepted.
	Check(ctx context.Context, resource string, token uint64) error

	// Highest returns the highest token accepted for resource, or 0 if none
	// was. For informational use only (dashboards, tests): never decide on
	// its result, the answer may be outdated by the time it returns.
	Highest(ctx context.Context, resource string) (uint64, error)

	// Rejected returns how many tokens this guard value has rejected as
	// stale since it was created. Operators can export it, for example with
	//
	//	prometheus.NewCounterFunc(prometheus.CounterOpts{
	//		Name: "jetlock_fence_rejected_total",
	//		Help: "Stale fencing tokens rejected.",
	//	}, func() float64 { return float64(g.Rejected()) })
	Rejected() uint64
}

var (
	_ Guard = (*Memory)(nil)
	_ Guard = (*KV)(nil)
	_ Guard = (*SQL)(nil)
)

func validate(resource string, token uint64) error {
	if resource == "" {
		return invalidf("resource is empty")
	}
	if token == 0 {
		// Every jetlock token is a KV revision, so at least 1. A zero token
		// almost always means the caller forgot to pass it; accepting it
		// would let unfenced work through until the first real token.
		return invalidf("token is 0")
	}
	return nil
}

// sleep waits a jittered, exponentially growing delay before retry attempt
// (1 for the first retry) or until ctx ends.
func sleep(ctx context.Context, base time.Duration, attempt int) error {
	d := base << min(attempt-1, 6)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
