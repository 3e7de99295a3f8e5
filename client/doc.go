// Package client is the Go client of jetlock, a lock service on NATS.
//
//	c, _ := client.New(nc)
//	lease, err := c.Acquire(ctx, "orders/123", client.TTL(30*time.Second))
//	if err != nil { ... }
//	defer lease.Release(context.Background())
//	// do the work; pass lease.Token() with every write to the resource,
//	// and stop when <-lease.Lost() fires or lease.Context() is cancelled.
//
// # The safety model
//
// A lease is a lock with a time limit (its TTL). The client renews it in the
// background every third of the TTL. The service grants a resource to one
// lease at a time, and lets another caller take it over only after the
// holder's lease has gone unrenewed for the TTL plus a grace period, timed
// on the service's monotonic clock from when it saw the last renewal. Wall
// clocks are never compared, so a skewed clock cannot end a lease early.
//
// The client keeps its own, shorter deadline: the time it SENT the last
// successful acquire or renew (of a retried request, the retry that was
// answered), plus the TTL, minus a safety margin. Because it counts from
// before the service acted, its deadline always falls before the
// service's. When a renewal is refused, or renewals cannot be confirmed
// before that deadline, Lost() closes and Context() is cancelled with cause
// ErrLeaseLost: from then on the holder must assume someone else may hold
// the resource. A renewal whose outcome is unknown (an outage) is retried
// quickly until the deadline: an outage shorter than that costs nothing.
//
// The deadline has passed when either clock says so: the monotonic clock,
// which no clock step moves, or the wall clock, which (unlike the
// monotonic clock on Linux) goes on counting while the host or VM is
// suspended, as the service's clocks do. A suspended holder sees its
// lease lost when it wakes, not the time it slept later; a wall clock
// stepped forward makes the loss early, never late.
//
// That is not enough on its own. A process can be paused (garbage
// collection, a frozen VM, a slow disk) between checking Lost and writing to
// the resource, and wake up after someone else acquired it. The fencing
// token closes that gap: every grant carries a token strictly larger than
// all earlier grants of the resource, across renewals, service restarts,
// leader changes and cluster restarts. Send Token() with every write; the
// resource keeps the highest token it accepted and rejects smaller ones
// (package fence implements that side). Leases decide when someone else
// may take over; fencing decides whether an old holder's work is still
// accepted.
//
// # Sessions
//
// A Session (Client.NewSession) keeps many leases alive with one
// keepalive, like etcd's concurrency.Session. Its leases (Session.Acquire)
// do not renew themselves: they live as long as the session, and end with
// it when it is closed or not kept alive for its TTL. The client's
// deadline for the session, and for each of its leases, follows the rule
// above: the send time of the last keepalive that succeeded, plus the TTL,
// minus the safety margin.
//
// # Lock sets
//
// Client.AcquireAll (and Session.AcquireAll) acquires several resources as
// one lease, atomically: the whole set or nothing, never half of it; a
// waiting AcquireAll queues on every resource at once, so overlapping sets
// acquired in any order cannot deadlock. The set has one lease id and TTL,
// is renewed, released and lost as a whole, and the rule above gives its
// deadline. Each resource keeps its own fencing token: send
// Lease.TokenOf(resource) with every write to that resource (Token is 0
// for a set).
//
// # Elections and semaphores
//
// Client.NewElection (and Session.NewElection) is an election, in the
// shape of etcd's concurrency.Election: Campaign waits in the election's
// FIFO queue and returns a Leadership, a lease whose Token is the leader's
// fencing token and whose Lost closes before anyone else could be elected;
// Proclaim changes the leader's value, Resign hands over at once, Leader
// reads the leader and Observe follows it (events, at most once, plus
// status reads). Client.NewSemaphore is a counting semaphore: Acquire gets
// one of its N permits, a lease with a fencing token of its own per permit
// (Lease.Permit, Lease.FenceKey). Both are only as safe as the fencing at
// the resource; docs/recipes.md says what each guarantees.
//
// # Retries and idempotency
//
// Every acquire carries a request id (random unless RequestID is given).
// When the outcome of a request is unknown (no reply, or "unavailable") the
// client retries with the same id: the service answers with the same lease
// if it was granted, renewed, and never grants a second one. A waiting
// acquire (Acquire, AcquireAll, Campaign) keeps trying while the service
// is unavailable (restarting), until its Wait bound or ctx. If the outcome
// stays unknown, or ctx ends first, the client cancels the request, naming
// its owner, so that no lease is left granted to nobody and no other
// owner's request is touched. Releases are idempotent too.
//
// # Calls and their context
//
// Every call returns within its ctx, and either returns a lease or leaves
// nothing held: a grant that arrives as ctx ends is released. Cleanup that
// needs the network (that release, the cancel of an abandoned wait) runs
// within ctx when there is time, and otherwise in a goroutine of the
// Client, bounded by the request timeout; Client.Close waits for those.
//
// docs/promises.md lists the client's promises, each with the tests that
// prove it against a real cluster.
package client
