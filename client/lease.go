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
// background at a third of its TTL until Release or loss; a lease of a
// Session does not renew itself, its session's keepalives keep it.
//
// The lost channel can close at any moment: it is NOT safe to assume that
// the lease is still held because Lost has not closed yet. Pass Token to
// the protected resource with every write and let it reject stale tokens
// (package fence); that, not the lease, is what stops a holder that was
// paused past its TTL.
//
// A lease of a lock set (Client.AcquireAll) holds several resources under
// one lease id and one TTL, renewed and released whole; each resource has
// its own token (TokenOf).
//
// A Lease is safe for concurrent use.
type Lease struct {
	c        *Client
	resource string
	owner    string
	id       string
	token    uint64

	// members are the resources of a lock set and their tokens, sorted by
	// resource; nil for a lease of one resource. Never changed after the
	// grant.
	members []streams.SetMember

	// permit is the permit of a semaphore the lease holds (Semaphore), 0
	// for a lease of a lock. Never changed after the grant.
	permit int

	// want is the TTL asked for on renewal (zero: the service's default).
	// A lease granted after waiting starts with a shorter TTL, which the
	// first renewal extends.
	want time.Duration

	// life is the client's deadline and loss signal of the lease. For a
	// lease of a session its deadline is the hold limit alone (zero when
	// none): the session's life is the rest (see Expires).
	life *life

	// sess is the session that holds the lease, nil for a lease of its
	// own; unwatch stops passing the session's end on to the lease.
	sess    *Session
	unwatch func() bool

	mu       sync.Mutex
	released bool
	// value is the lease's value (Election.Campaign, Leadership.Proclaim);
	// guarded by mu.
	value string

	// reply is the service's reply to the last successful acquire or
	// renew (see Reply); guarded by mu.
	reply streams.LeaseResponse
}

func (c *Client) newLease(resource, owner string, want time.Duration, resp *streams.LeaseResponse, sent time.Time) *Lease {
	l := &Lease{c: c, resource: resource, owner: owner, id: resp.LeaseID, token: resp.Token, want: want,
		life: newLife("renewal", c.opts.safetyMargin)}
	if hold, ok := holdLeft(resp); ok {
		l.life.holdLimit = sent.Add(hold - min(c.opts.safetyMargin, hold/4))
	}
	l.life.setDeadline(sent, time.Duration(resp.TTLms)*time.Millisecond)
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
	if l.sess != nil {
		return l.startInSession()
	}
	if waited {
		l.life.mu.Lock()
		short := l.want > l.life.ttl || l.life.left(l.life.deadline) < l.life.ttl*2/3
		l.life.mu.Unlock()
		if short {
			if err := l.renewOnce(ctx); err != nil {
				close(l.life.done)
				l.life.markLost(err)
				return err
			}
		}
	}
	l.life.arm()
	go l.life.keep(l.renew)
	return nil
}

// sendRenew sends one renew request, asking for the TTL the holder wants
// (for a lock set, of the whole set: see sendRenewSet).
func (l *Lease) sendRenew(ctx context.Context, resp *streams.LeaseResponse) error {
	if l.members != nil {
		return l.sendRenewSet(ctx, resp)
	}
	return l.c.call(ctx, streams.OpRenew, &streams.RenewRequest{Resource: l.resource, LeaseID: l.id, TTLms: l.want.Milliseconds(), Permit: l.permit}, resp, 0)
}

// renew sends one renewal, sent at sent, and moves the deadline on
// success: what life.keep calls.
func (l *Lease) renew(ctx context.Context, sent time.Time) error {
	var resp streams.LeaseResponse
	if err := l.sendRenew(ctx, &resp); err != nil {
		return err
	}
	l.life.setDeadline(sent, time.Duration(resp.TTLms)*time.Millisecond)
	l.recordReply(&resp)
	return nil
}

// renewOnce sends one renewal, retried while its outcome is unknown, and
// moves the deadline on success.
func (l *Lease) renewOnce(ctx context.Context) error {
	var sent time.Time
	var resp streams.LeaseResponse
	err := l.c.retry(ctx, func() error {
		sent = time.Now() // the deadline counts from the send of the attempt that succeeded
		return l.sendRenew(ctx, &resp)
	})
	if err != nil {
		return err
	}
	l.life.setDeadline(sent, time.Duration(resp.TTLms)*time.Millisecond)
	l.recordReply(&resp)
	return nil
}

// Resource returns the resource the lease is on. For a lease of a lock set
// (AcquireAll) it returns "": see Resources.
func (l *Lease) Resource() string { return l.resource }

// ID returns the lease id, which alone can renew or release the lease.
func (l *Lease) ID() string { return l.id }

// Token returns the fencing token: strictly larger than the token of every
// earlier grant of this resource. It does not change on renewal.
//
// For a lease of a lock set (AcquireAll) it returns 0, which no fence
// accepts (package fence refuses a zero token): each resource of a set has
// its own token, and a fence compares tokens of one resource only. Use
// TokenOf(resource) for each.
func (l *Lease) Token() uint64 { return l.token }

// Expires returns the client's own deadline: the send time of the last
// successful acquire or renew, plus the TTL, minus the safety margin. At
// that moment, without a newer renewal, Lost closes. For a lease of a
// session it is the session's deadline (Session.Expires), or the lease's
// hold limit if that comes first.
func (l *Lease) Expires() time.Time {
	d := l.life.expires()
	if l.sess != nil {
		if s := l.sess.Expires(); d.IsZero() || s.Before(d) {
			d = s
		}
	}
	return d
}

// Lost returns a channel closed exactly once, when the client can no
// longer prove that it holds the lease: a renewal was refused, renewals
// failed until the client's deadline, or the lease was released; for a
// lease of a session, also when the session is lost or closed. Once the
// deadline has passed, the channel Lost returns is closed, even if the
// process was paused through the deadline and its timer has not fired yet.
func (l *Lease) Lost() <-chan struct{} {
	l.checkLost()
	return l.life.lost
}

// Context returns a context cancelled when Lost closes. Its cause
// (context.Cause) is an error wrapping ErrLeaseLost, or ErrReleased after
// Release (for a lease of a session closed by Session.Close, an error
// matching both ErrReleased and ErrSessionClosed). Its Done and Err check
// the deadline as Lost does.
func (l *Lease) Context() context.Context {
	l.checkLost()
	return checkedContext{l.life.ctx, l}
}

// checkLost closes Lost if the lease is past its deadline, or its session
// is lost or closed.
func (l *Lease) checkLost() {
	if l.sess != nil && l.sess.life.check() {
		l.life.markLost(sessionLeaseCause(context.Cause(l.sess.life.ctx)))
	}
	l.life.check()
}

// Renewed returns a channel that is closed when the client's deadline
// (Expires) next moves, after a successful renewal (for a lease of a
// session, a successful keepalive). Each call returns the channel of the
// next renewal: to follow the lease, call Renewed again and read Expires
// whenever it closes. It does not close when the lease is lost; select on
// Lost as well.
func (l *Lease) Renewed() <-chan struct{} {
	if l.sess != nil {
		return l.sess.Renewed()
	}
	return l.life.renewedChan()
}

// HoldLimit returns the client's end of the lease's hold cap (see
// MaxHold), or the zero time when no cap applies. Lost closes then at the
// latest.
func (l *Lease) HoldLimit() time.Time { return l.life.holdLimit }

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
// has closed). Nor does the Release of a lease whose session is lost or
// closed send anything: the lease ends with its session.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	l.life.stop()
	<-l.life.done
	// Signal the end first, clean up second: a release that fails must
	// not leave the caller believing it still holds the lease.
	l.life.markLost(ErrReleased)
	if l.sess != nil {
		l.unwatch()
		if l.sess.life.check() {
			return nil
		}
	}

	// A release that cannot get through before the lease ends by itself
	// only delays the caller (issue 32): retry until the deadline at most.
	deadline := l.Expires()
	if l.life.passed(deadline) {
		return nil
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var resp streams.ReleaseResponse // a set's reply decodes into it as well; nothing reads it
	req := streams.ReleaseRequest{Resource: l.resource, Resources: l.setNames(), LeaseID: l.id, Permit: l.permit}
	err := l.c.retry(rctx, func() error {
		return l.c.call(rctx, streams.OpRelease, &req, &resp, 0)
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

// life is how long the client can prove that it holds something the
// service grants for a TTL and that it keeps alive: a lease, or a session.
// Its deadline is the send time of the last request that succeeded in
// keeping it alive, plus the TTL, minus the safety margin: the service
// acted after the request was sent, so this comes before the service can
// end it. Lease and Session share it: the deadline, the loop that keeps it
// alive, and the loss signal (Lost, Context).
//
// Loss is signalled at the deadline however the process fares: a timer
// fires at the deadline independently of the keepalive loop, and every
// look at the lost signal checks the clock first, so that a process paused
// through the deadline sees the loss before anything else once it wakes
// up, even before the timer has run.
//
// The deadline has passed when either clock says so (see passed): the
// monotonic clock, which no clock step moves but which stops while the
// host or VM is suspended (on Linux), or the wall clock, which goes on
// counting through a suspend, as the service's clocks do. A wall clock
// stepped forward makes the loss early, never late. Timers run on the
// monotonic clock, so the expiry timer wakes at least every expiryPoll to
// look at the wall clock too.
type life struct {
	// what keeps it alive ("renewal", "keepalive"), for error texts.
	what   string
	margin time.Duration
	clock  clock

	ctx      context.Context
	cancel   context.CancelCauseFunc
	lost     chan struct{}
	lostOnce sync.Once

	mu       sync.Mutex
	ttl      time.Duration
	deadline time.Time
	isLost   bool
	// expiry fires at the deadline (nil until armed, see arm).
	expiry *time.Timer
	// renewed is closed, and replaced, each time deadline moves (see
	// Lease.Renewed).
	renewed chan struct{}

	// holdLimit is the client's own end of a hold cap (zero when none):
	// the send time of the acquire plus the hold the service granted,
	// minus the safety margin. No deadline lies beyond it. Set before the
	// deadline is first set, never changed after.
	holdLimit time.Time

	stopCtx context.Context // cancelled to stop the keepalive loop
	stop    context.CancelFunc
	done    chan struct{} // closed when the keepalive loop has returned
}

func newLife(what string, margin time.Duration) *life {
	ctx, cancel := context.WithCancelCause(context.Background())
	stopCtx, stop := context.WithCancel(context.Background())
	return &life{what: what, margin: margin, clock: realClock{}, ctx: ctx, cancel: cancel, lost: make(chan struct{}),
		renewed: make(chan struct{}), stopCtx: stopCtx, stop: stop, done: make(chan struct{})}
}

// setDeadline moves the deadline after a request sent at sent kept it
// alive for ttl. The margin is capped at a quarter of the TTL.
func (lf *life) setDeadline(sent time.Time, ttl time.Duration) {
	lf.setDeadlineAt(sent.Add(ttl-min(lf.margin, ttl/4)), ttl)
}

// setDeadlineAt sets the deadline to d (capped at the hold limit) and the
// TTL to ttl, unless it is lost already: a loss is final.
func (lf *life) setDeadlineAt(d time.Time, ttl time.Duration) {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if lf.isLost {
		return
	}
	lf.ttl = ttl
	if !lf.holdLimit.IsZero() && d.After(lf.holdLimit) {
		d = lf.holdLimit
	}
	lf.deadline = d
	if lf.expiry != nil {
		lf.expiry.Reset(lf.nextLook(d))
	}
	close(lf.renewed)
	lf.renewed = make(chan struct{})
}

// arm starts the expiry timer, once the caller is about to get what it
// keeps alive: before, a deadline counted from a request sent before a
// wait in the queue may have passed, and is moved by a first renewal (see
// Lease.start).
func (lf *life) arm() {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if lf.isLost || lf.expiry != nil || lf.deadline.IsZero() {
		return
	}
	lf.expiry = time.AfterFunc(lf.nextLook(lf.deadline), lf.look)
}

// expiryPoll is the longest the expiry timer sleeps before it looks at
// the clocks again: how late, at most, Lost closes after a suspend that
// stopped the monotonic clock.
const expiryPoll = time.Second

// nextLook is how long the expiry timer sleeps before it looks at the
// deadline d: until d, or expiryPoll, whichever comes first.
func (lf *life) nextLook(d time.Time) time.Duration {
	return min(lf.left(d), expiryPoll)
}

// look is the expiry timer's: it marks the loss once the deadline has
// passed by either clock, and otherwise sleeps again.
func (lf *life) look() {
	if lf.check() {
		return
	}
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if !lf.isLost && lf.expiry != nil {
		lf.expiry.Reset(lf.nextLook(lf.deadline))
	}
}

// clock reads the time. now returns it twice: mono with the monotonic
// reading (time.Now), wall without (the wall clock alone). Tests put a
// clock in that lets the wall clock run ahead, as a suspend does.
type clock interface {
	now() (mono, wall time.Time)
}

type realClock struct{}

func (realClock) now() (mono, wall time.Time) {
	t := time.Now()
	return t, t.Round(0)
}

// passed reports whether the time d, read with time.Now, has come by
// either clock.
func (lf *life) passed(d time.Time) bool {
	mono, wall := lf.clock.now()
	return !mono.Before(d) || !wall.Before(d.Round(0))
}

// left is how long until d by the clock that reaches it first (0 once
// it has passed).
func (lf *life) left(d time.Time) time.Duration {
	mono, wall := lf.clock.now()
	return max(0, min(d.Sub(mono), d.Round(0).Sub(wall)))
}

// expires returns the deadline (zero when there is none).
func (lf *life) expires() time.Time {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	return lf.deadline
}

func (lf *life) renewedChan() <-chan struct{} {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	return lf.renewed
}

// check marks it lost if the deadline has passed, and reports whether it
// is lost.
func (lf *life) check() bool {
	lf.mu.Lock()
	lost, d := lf.isLost, lf.deadline
	lf.mu.Unlock()
	if lost {
		return true
	}
	if d.IsZero() || !lf.passed(d) {
		return false
	}
	lf.markLost(lf.expiredCause(d))
	return true
}

// expiredCause is the cause of a loss at the deadline d.
func (lf *life) expiredCause(d time.Time) error {
	if !lf.holdLimit.IsZero() && !d.Before(lf.holdLimit) {
		return fmt.Errorf("%w: held for the longest the hold cap allows (until %s)", ErrLeaseLost, lf.holdLimit.Format(time.RFC3339Nano))
	}
	return fmt.Errorf("%w: no %s confirmed before the client's deadline %s", ErrLeaseLost, lf.what, d.Format(time.RFC3339Nano))
}

func (lf *life) markLost(cause error) {
	lf.lostOnce.Do(func() {
		lf.mu.Lock()
		lf.isLost = true
		if lf.expiry != nil {
			lf.expiry.Stop()
		}
		lf.mu.Unlock()
		lf.cancel(cause)
		close(lf.lost)
	})
}

// keep keeps it alive until stopped or lost: renew sends one request,
// sent at the time it is given, and on success moves the deadline. It
// runs at a third of the TTL, with jitter. A request whose outcome is
// unknown is retried quickly until the deadline; a refused one closes
// Lost at once, and so does the deadline passing (the expiry timer).
func (lf *life) keep(renew func(ctx context.Context, sent time.Time) error) {
	defer close(lf.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		lf.mu.Lock()
		ttl, deadline := lf.ttl, lf.deadline
		lf.mu.Unlock()
		if !lf.holdLimit.IsZero() && !deadline.Before(lf.holdLimit) {
			// No renewal can extend it any more: it ends at the hold
			// limit, when the expiry timer fires.
			select {
			case <-lf.stopCtx.Done():
			case <-lf.lost:
			}
			return
		}
		// A third of the TTL, ±10%, and never later than halfway to the
		// deadline, so that a failed request leaves time to retry.
		wait := ttl/3 - ttl/30 + mrand.N(ttl/15+1)
		timer.Reset(min(wait, lf.left(deadline)/2))
		select {
		case <-lf.stopCtx.Done():
			return
		case <-lf.lost:
			return
		case <-timer.C:
		}
		if err := lf.renewUntilDeadline(renew); err != nil {
			lf.markLost(err)
			return
		}
	}
}

func (lf *life) renewUntilDeadline(renew func(ctx context.Context, sent time.Time) error) error {
	backoff := 50 * time.Millisecond
	for {
		if lf.check() {
			return nil // lost at the deadline: the cause is set
		}
		deadline := lf.expires()
		sent := time.Now()
		ctx, cancel := context.WithDeadline(lf.stopCtx, deadline)
		err := renew(ctx, sent)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrInvalidRequest):
			return wrapErr(ErrLeaseLost, fmt.Errorf("%s refused: %w", lf.what, err))
		}
		// Outcome unknown: try again soon, until the deadline.
		select {
		case <-lf.stopCtx.Done():
			return nil
		case <-lf.lost:
			return nil
		case <-time.After(min(jitter(backoff), lf.left(deadline))):
		}
		backoff = min(backoff*2, 500*time.Millisecond)
	}
}

// checkedContext is a context whose Done and Err check first whether
// what it belongs to is lost (see life): a holder that was paused through
// its deadline finds the context cancelled when it next asks, whether or
// not the timer has run since it woke up.
type checkedContext struct {
	context.Context
	of interface{ checkLost() } // a *Lease or a *Session: comparable
}

func (c checkedContext) Done() <-chan struct{} {
	c.of.checkLost()
	return c.Context.Done()
}

func (c checkedContext) Err() error {
	c.of.checkLost()
	return c.Context.Err()
}
