package client

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Lease is a granted lock on a resource. It renews itself in the
// background at a third of its TTL until Release or loss.
//
// The lost channel can close at any moment: it is NOT safe to assume that
// the lease is still held because Lost has not closed yet. Pass Token to
// the protected resource with every write and let it reject stale tokens
// (package fence); that, not the lease, is what stops a holder that was
// paused past its TTL.
//
// A Lease is safe for concurrent use.
type Lease struct {
	c        *Client
	resource string
	owner    string
	id       string
	token    uint64

	ctx    context.Context
	cancel context.CancelCauseFunc
	lost   chan struct{}

	// want is the TTL asked for on renewal (zero: the service's default).
	// A lease granted after waiting starts with a shorter TTL, which the
	// first renewal extends.
	want time.Duration

	mu       sync.Mutex
	ttl      time.Duration
	deadline time.Time
	released bool
	lostOnce sync.Once

	// renewed is closed, and replaced, each time deadline moves (see
	// Renewed); guarded by mu.
	renewed chan struct{}

	// holdLimit is the client's own end of the hold cap (zero when none):
	// the send time of the acquire plus the hold the service granted,
	// minus the safety margin. No deadline lies beyond it.
	holdLimit time.Time

	// reply is the service's reply to the last successful acquire or
	// renew (see Reply); guarded by mu.
	reply streams.LeaseResponse

	stopCtx context.Context // cancelled to stop the renewer
	stop    context.CancelFunc
	done    chan struct{} // closed when the renewer has returned
}

func (c *Client) newLease(resource, owner string, want time.Duration, resp *streams.LeaseResponse, sent time.Time) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	stopCtx, stop := context.WithCancel(context.Background())
	l := &Lease{
		c: c, resource: resource, owner: owner, id: resp.LeaseID, token: resp.Token, want: want,
		ctx: ctx, cancel: cancel, lost: make(chan struct{}),
		stopCtx: stopCtx, stop: stop, done: make(chan struct{}),
	}
	if hold, ok := holdLeft(resp); ok {
		l.holdLimit = sent.Add(hold - min(c.opts.safetyMargin, hold/4))
	}
	l.setDeadline(sent, time.Duration(resp.TTLms)*time.Millisecond)
	l.recordReply(resp)
	return l
}

// holdLeft returns how much of the hold cap was left when the service
// answered: hold_until minus expires_at plus ttl_ms. Both times come from
// the service's clock, so no clock is compared with the client's.
func holdLeft(resp *streams.LeaseResponse) (time.Duration, bool) {
	if resp.HoldUntil == "" {
		return 0, false
	}
	until, err1 := time.Parse(time.RFC3339Nano, resp.HoldUntil)
	exp, err2 := time.Parse(time.RFC3339Nano, resp.ExpiresAt)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return until.Sub(exp) + time.Duration(resp.TTLms)*time.Millisecond, true
}

// start begins renewing. A lease granted after waiting in the queue is
// renewed once first, before the caller gets it: the client's deadline
// counts from when it sent the acquire, before the wait, so it may already
// have passed; and the grant's TTL is the short hand-over TTL.
func (l *Lease) start(ctx context.Context, waited bool) error {
	if waited {
		l.mu.Lock()
		short := l.want > l.ttl || time.Until(l.deadline) < l.ttl*2/3
		l.mu.Unlock()
		if short {
			if err := l.renewOnce(ctx); err != nil {
				close(l.done)
				l.markLost(err)
				return err
			}
		}
	}
	go l.renewLoop()
	return nil
}

// sendRenew sends one renew request, asking for the TTL the holder wants.
func (l *Lease) sendRenew(ctx context.Context, resp *streams.LeaseResponse) error {
	return l.c.call(ctx, streams.OpRenew, &streams.RenewRequest{Resource: l.resource, LeaseID: l.id, TTLms: l.want.Milliseconds()}, resp, 0)
}

// renewOnce sends one renewal and moves the deadline on success.
func (l *Lease) renewOnce(ctx context.Context) error {
	sent := time.Now()
	var resp streams.LeaseResponse
	err := l.c.retry(ctx, func() error { return l.sendRenew(ctx, &resp) })
	if err != nil {
		return err
	}
	l.setDeadline(sent, time.Duration(resp.TTLms)*time.Millisecond)
	l.recordReply(&resp)
	return nil
}

// Resource returns the resource the lease is on.
func (l *Lease) Resource() string { return l.resource }

// ID returns the lease id, which alone can renew or release the lease.
func (l *Lease) ID() string { return l.id }

// Token returns the fencing token: strictly larger than the token of every
// earlier grant of this resource. It does not change on renewal.
func (l *Lease) Token() uint64 { return l.token }

// Expires returns the client's own deadline: the send time of the last
// successful acquire or renew, plus the TTL, minus the safety margin. At
// that moment, without a newer renewal, Lost closes.
func (l *Lease) Expires() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Lost returns a channel closed exactly once, when the client can no
// longer prove that it holds the lease: a renewal was refused, renewals
// failed until the client's deadline, or the lease was released.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Context returns a context cancelled when Lost closes. Its cause
// (context.Cause) is an error wrapping ErrLeaseLost, or ErrReleased after
// Release.
func (l *Lease) Context() context.Context { return l.ctx }

func (l *Lease) setDeadline(sent time.Time, ttl time.Duration) {
	margin := min(l.c.opts.safetyMargin, ttl/4)
	l.mu.Lock()
	l.ttl = ttl
	l.deadline = sent.Add(ttl - margin)
	if !l.holdLimit.IsZero() && l.deadline.After(l.holdLimit) {
		l.deadline = l.holdLimit
	}
	if l.renewed != nil {
		close(l.renewed)
	}
	l.renewed = make(chan struct{})
	l.mu.Unlock()
}

// Renewed returns a channel that is closed when the client's deadline
// (Expires) next moves, after a successful renewal. Each call returns the
// channel of the next renewal: to follow the lease, call Renewed again and
// read Expires whenever it closes. It does not close when the lease is
// lost; select on Lost as well.
func (l *Lease) Renewed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed
}

// HoldLimit returns the client's end of the lease's hold cap (see
// MaxHold), or the zero time when no cap applies. Lost closes then at the
// latest.
func (l *Lease) HoldLimit() time.Time { return l.holdLimit }

func (l *Lease) markLost(cause error) {
	l.lostOnce.Do(func() {
		l.cancel(cause)
		close(l.lost)
	})
}

// renewLoop renews at a third of the TTL, with jitter. A renewal whose
// outcome is unknown is retried quickly until the client's deadline; a
// refused renewal, or the deadline passing, closes Lost.
func (l *Lease) renewLoop() {
	defer close(l.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		l.mu.Lock()
		ttl, deadline := l.ttl, l.deadline
		l.mu.Unlock()
		if !l.holdLimit.IsZero() && !deadline.Before(l.holdLimit) {
			// No renewal can extend the lease any more: it ends at the
			// hold limit.
			timer.Reset(time.Until(l.holdLimit))
			select {
			case <-l.stopCtx.Done():
				return
			case <-timer.C:
			}
			l.markLost(fmt.Errorf("%w: held for the longest the hold cap allows (until %s)", ErrLeaseLost, l.holdLimit.Format(time.RFC3339Nano)))
			return
		}
		// A third of the TTL, ±10%, and never later than halfway to the
		// deadline, so that a failed renewal leaves time to retry.
		wait := ttl/3 - ttl/30 + mrand.N(ttl/15+1)
		timer.Reset(max(0, min(wait, time.Until(deadline)/2)))
		select {
		case <-l.stopCtx.Done():
			return
		case <-timer.C:
		}
		if err := l.renewUntilDeadline(); err != nil {
			l.markLost(err)
			return
		}
	}
}

func (l *Lease) renewUntilDeadline() error {
	backoff := 50 * time.Millisecond
	for {
		l.mu.Lock()
		deadline := l.deadline
		l.mu.Unlock()
		sent := time.Now()
		if !sent.Before(deadline) {
			return fmt.Errorf("%w: no renewal confirmed before the client's deadline %s", ErrLeaseLost, deadline.Format(time.RFC3339Nano))
		}
		ctx, cancel := context.WithDeadline(l.stopCtx, deadline)
		var resp streams.LeaseResponse
		err := l.sendRenew(ctx, &resp)
		cancel()
		switch {
		case err == nil:
			l.setDeadline(sent, time.Duration(resp.TTLms)*time.Millisecond)
			l.recordReply(&resp)
			return nil
		case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrInvalidRequest):
			return wrapErr(ErrLeaseLost, fmt.Errorf("renewal refused: %w", err))
		}
		// Outcome unknown: try again soon, until the deadline.
		select {
		case <-l.stopCtx.Done():
			return nil
		case <-time.After(min(jitter(backoff), time.Until(deadline))):
		}
		backoff = min(backoff*2, 500*time.Millisecond)
	}
}

// Release stops renewing and releases the lease. Lost closes and Context
// is cancelled (with cause ErrReleased) as soon as renewing has stopped,
// before the release request is sent and whatever its outcome: from then
// on the caller must not use the lease.
//
// Release is idempotent: after a successful Release, further calls return
// nil. Releasing a lease that the service no longer holds (expired, taken
// over) also returns nil: it is not held either way. It returns
// ErrUnavailable if the service could not be reached (the lease then ends
// after its TTL unless Release is called again and gets through), or
// ctx.Err().
//
// Release retries within ctx, but never past the client's deadline
// (Expires): from then on the lease is not this client's to release, and
// the service expires it by itself within the safety margin plus its
// expiry grace. A Release that the deadline cuts short returns an error
// wrapping ErrUnavailable; one called after the deadline sends nothing and
// returns nil (the lease is not held by this client either way, and Lost
// has closed).
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	l.stop()
	<-l.done
	// Signal the end first, clean up second: a release that fails must
	// not leave the caller believing it still holds the lease.
	l.markLost(ErrReleased)

	// A release that cannot get through before the lease ends by itself
	// only delays the caller (issue 32): retry until the deadline at most.
	deadline := l.Expires()
	if !time.Now().Before(deadline) {
		return nil
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var resp streams.ReleaseResponse
	err := l.c.retry(rctx, func() error {
		return l.c.call(rctx, streams.OpRelease, &streams.ReleaseRequest{Resource: l.resource, LeaseID: l.id}, &resp, 0)
	})
	if err != nil {
		if ctx.Err() == nil && rctx.Err() != nil {
			return fmt.Errorf("%w: release not confirmed before the lease's deadline %s; the service expires it", ErrUnavailable, deadline.Format(time.RFC3339Nano))
		}
		return err
	}
	l.mu.Lock()
	l.released = true
	l.mu.Unlock()
	return nil
}
