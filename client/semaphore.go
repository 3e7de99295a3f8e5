package client

import (
	"context"
	"fmt"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Counting semaphores. A semaphore of N permits lets N holders in at
// once: each Acquire gets one of the N permits, a lease of its own with a
// fencing token of its own (Lease.Permit, Lease.Token), renewed, released
// and lost like any lease. Its waiters share one FIFO queue; a release
// wakes one of them.

// Semaphore is the counting semaphore name with limit permits. It holds no
// state of its own besides its name and limit: make one wherever it is
// needed. It is safe for concurrent use.
type Semaphore struct {
	c     *Client
	sess  *Session // nil: permits of their own, renewed by themselves
	name  string
	limit int
}

// NewSemaphore returns the semaphore name (a valid resource name) with
// limit permits, 1 to 1000. Every holder and waiter of a semaphore must
// use the same limit: the service refuses another (ErrInvalidRequest,
// "semaphore NAME has limit N") while the semaphore has holders or
// waiters. A bad name or limit returns an error wrapping ErrInvalidOption
// and ErrInvalidRequest, and nothing is sent.
//
// A semaphore's name is its own: do not lock it, or campaign for it, by
// other means.
func (c *Client) NewSemaphore(name string, limit int) (*Semaphore, error) {
	return newSemaphore(c, nil, name, limit)
}

// NewSemaphore returns the semaphore name with limit permits for the
// session: its permits live as long as the session (see Session.Acquire)
// and end with it.
func (s *Session) NewSemaphore(name string, limit int) (*Semaphore, error) {
	return newSemaphore(s.c, s, name, limit)
}

func newSemaphore(c *Client, s *Session, name string, limit int) (*Semaphore, error) {
	if err := streams.ValidateResource(name); err != nil {
		return nil, optionError("semaphore "+name, err)
	}
	if limit < 1 || limit > streams.MaxLimit {
		return nil, optionError("semaphore "+name, fmt.Errorf("%w: limit %d outside [1, %d]", streams.ErrInvalid, limit, streams.MaxLimit))
	}
	return &Semaphore{c: c, sess: s, name: name, limit: limit}, nil
}

// Name returns the semaphore's name.
func (m *Semaphore) Name() string { return m.name }

// Limit returns the semaphore's number of permits.
func (m *Semaphore) Limit() int { return m.limit }

// Acquire acquires one permit, waiting in the semaphore's FIFO queue
// while all are held, as Client.Acquire waits for a lock: until a permit
// is granted, ctx ends (then nothing is left queued or granted, and it
// returns ctx.Err()), or the Wait option's bound passes (a *HeldError,
// matching ErrLocked). The options are Acquire's.
//
// The lease it returns holds permit Permit() of the semaphore, with the
// fencing token Token(): tokens rise per permit, not across permits, so a
// resource fences each permit's work separately, keyed by FenceKey()
// ("NAME#k"). It renews itself (or lives with its session) and is
// released like any lease.
func (m *Semaphore) Acquire(ctx context.Context, opts ...AcquireOption) (*Lease, error) {
	return m.take(ctx, opts, func(ctx context.Context, ao acquireOptions) (*Lease, error) {
		return m.c.acquire(ctx, m.name, ao)
	})
}

// TryAcquire makes one attempt to acquire a permit and returns at once:
// the lease of a permit, or a *HeldError (matching ErrLocked) when all
// are held. An attempt whose outcome is unknown is retried and, failing
// that, cancelled as Client.TryAcquire's is.
func (m *Semaphore) TryAcquire(ctx context.Context, opts ...AcquireOption) (*Lease, error) {
	return m.take(ctx, opts, func(ctx context.Context, ao acquireOptions) (*Lease, error) {
		return m.c.acquireOnce(ctx, m.name, ao, 0)
	})
}

func (m *Semaphore) take(ctx context.Context, opts []AcquireOption, do func(ctx context.Context, ao acquireOptions) (*Lease, error)) (*Lease, error) {
	read := func() (acquireOptions, error) {
		ao, err := readAcquireOptions(opts)
		ao.limit = m.limit
		return ao, err
	}
	if m.sess != nil {
		return m.sess.acquire(ctx, read, do)
	}
	ao, err := read()
	if err != nil {
		return nil, err
	}
	return do(ctx, ao)
}

// Permit returns the permit the lease holds, 1 to the semaphore's limit,
// for a lease of a Semaphore; 0 for any other lease.
func (l *Lease) Permit() int { return l.permit }

// FenceKey returns the name a resource fences the lease's work under
// (package fence), with Token: the resource for a lease of a lock or an
// election, "NAME#k" for permit k of semaphore NAME (each permit's tokens
// rise on their own, so each permit is fenced on its own), and "" for a
// lock set, whose resources have a token each (TokenOf).
func (l *Lease) FenceKey() string {
	switch {
	case l.members != nil:
		return ""
	case l.permit > 0:
		return streams.PermitResource(l.resource, l.permit)
	}
	return l.resource
}

// SemaphoreStatus is the service's view of a semaphore.
type SemaphoreStatus struct {
	Name  string
	Limit int
	// Held is the number of permits held; Waiters the number of acquires
	// waiting for one.
	Held    int
	Waiters int
	// Permits are the held permits, by permit number.
	Permits []PermitStatus
}

// PermitStatus is one held permit of a semaphore.
type PermitStatus struct {
	Permit int
	// Owner is the holder's owner text, shown only to the NATS user that
	// holds the permit and to operators (see Status).
	Owner string
	// Token is the permit's fencing token.
	Token uint64
	// ExpiresAt is the service's view of the permit's expiry.
	ExpiresAt time.Time
}

// Status returns the semaphore's holders and waiters. It is a status read,
// as Client.Status is: never decide from it that a permit is free;
// acquire one.
func (m *Semaphore) Status(ctx context.Context) (*SemaphoreStatus, error) {
	var resp streams.SemaphoreStatus
	err := m.c.retry(ctx, func() error {
		return m.c.call(ctx, streams.OpStatus, &streams.StatusRequest{Resource: m.name, Limit: m.limit}, &resp, 0)
	})
	if err != nil {
		return nil, err
	}
	st := &SemaphoreStatus{Name: m.name, Limit: resp.Limit, Held: resp.HeldPermits, Waiters: resp.Waiters}
	for _, p := range resp.Permits {
		st.Permits = append(st.Permits, PermitStatus{Permit: p.Permit, Owner: p.Owner, Token: p.Token, ExpiresAt: parseTime(p.ExpiresAt)})
	}
	return st, nil
}
