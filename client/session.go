package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// ErrSessionClosed is the cause of a session's Context after Close, and
// what an Acquire on a closed session returns. The leases of a closed
// session end with cause matching both it and ErrReleased.
var ErrSessionClosed = errors.New("jetlock: session closed")

// Session is a liveness shared by many leases, like etcd's
// concurrency.Session: one keepalive, sent in the background at a third of
// the session's TTL, keeps every lease acquired through the session
// (Session.Acquire, Session.TryAcquire) alive, however many there are.
// When the session ends, closed or not kept alive for its TTL, every lease
// it holds and every wait it made ends with it.
//
// The client keeps its own deadline for the session as it does for a
// lease: the send time of the last keepalive that succeeded (or of the
// open), plus the TTL, minus the safety margin (WithSafetyMargin). Lost
// closes at that deadline at the latest, even if the process was paused
// through it, which is before the service can end the session; it closes
// at once when a keepalive is refused (the session has ended). The leases
// of the session are lost with it.
//
// A Session is safe for concurrent use. Close it when done: that releases
// its leases at once and stops its keepalives.
type Session struct {
	c     *Client
	id    string
	owner string
	life  *life

	// beforeKeepalive, when set (by tests), runs in the keepalive loop
	// before each keepalive is sent: a test holds the loop there as a
	// pause would.
	beforeKeepalive atomic.Pointer[func()]

	closeMu sync.Mutex
	closed  bool // a close went through, or had nothing left to do
}

// NewSession opens a session. The open is retried with the same request
// id while its outcome is unknown; an open whose outcome stays unknown may
// leave a session that nobody keeps alive, which the service ends after
// its TTL. Invalid options return an error wrapping ErrInvalidOption; a
// TTL outside the service's bounds, ErrInvalidRequest; a SessionRequestID
// whose session has ended, ErrLeaseLost.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	var so sessionOptions
	for _, opt := range opts {
		if err := opt(&so); err != nil {
			return nil, err
		}
	}
	if so.requestID == "" {
		so.requestID = newRequestID()
	}
	req := streams.SessionOpenRequest{RequestID: so.requestID, Owner: so.owner, TTLms: so.ttl.Milliseconds()}
	var resp streams.SessionResponse
	var sent time.Time
	err := c.retry(ctx, func() error {
		sent = time.Now()
		return c.call(ctx, streams.OpSessionOpen, &req, &resp, 0)
	})
	if err != nil {
		return nil, err
	}
	if err := streams.ValidateSessionID(resp.SessionID); err != nil || resp.TTLms <= 0 {
		return nil, fmt.Errorf("%w: session.open: bad reply (session_id %q, ttl_ms %d)", ErrInternal, resp.SessionID, resp.TTLms)
	}
	s := &Session{c: c, id: resp.SessionID, owner: so.owner, life: newLife("keepalive", c.opts.safetyMargin)}
	s.life.setDeadline(sent, time.Duration(resp.TTLms)*time.Millisecond)
	s.life.arm()
	if s.life.check() {
		// Open, but past its deadline already (the open took that long):
		// not provably alive. Nothing keeps it alive; the service ends it.
		close(s.life.done)
		err := context.Cause(s.life.ctx)
		_ = s.Close()
		return nil, err
	}
	go s.life.keep(s.keepalive)
	return s, nil
}

// keepalive sends one keepalive, sent at sent, and moves the deadline on
// success: what life.keep calls.
func (s *Session) keepalive(ctx context.Context, sent time.Time) error {
	if hook := s.beforeKeepalive.Load(); hook != nil {
		(*hook)()
	}
	var resp streams.KeepaliveResponse
	if err := s.c.call(ctx, streams.OpSessionKeepalive, &streams.SessionKeepaliveRequest{SessionID: s.id}, &resp, 0); err != nil {
		return err
	}
	if resp.TTLms <= 0 {
		return fmt.Errorf("%w: session.keepalive: bad reply (ttl_ms %d)", ErrInternal, resp.TTLms)
	}
	s.life.setDeadline(sent, time.Duration(resp.TTLms)*time.Millisecond)
	return nil
}

// ID returns the session id, which alone can keep the session alive or
// close it (from the NATS user that opened it). Keep it secret.
func (s *Session) ID() string { return s.id }

// Owner returns the owner the session was opened with.
func (s *Session) Owner() string { return s.owner }

// TTL returns the session's TTL, as the service last granted it.
func (s *Session) TTL() time.Duration {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	return s.life.ttl
}

// Expires returns the client's deadline for the session: the send time of
// the last successful keepalive (or of the open), plus the TTL, minus the
// safety margin. At that moment, without a newer keepalive, Lost closes.
func (s *Session) Expires() time.Time { return s.life.expires() }

// Renewed returns a channel that is closed when Expires next moves, after
// a successful keepalive. Each call returns the channel of the next one;
// it does not close when the session is lost.
func (s *Session) Renewed() <-chan struct{} { return s.life.renewedChan() }

// Lost returns a channel closed exactly once, when the client can no
// longer prove that the session lives: a keepalive was refused, keepalives
// failed until the client's deadline, or the session was closed. Once the
// deadline has passed, the channel Lost returns is closed, even if the
// process was paused through the deadline and its timer has not fired yet.
func (s *Session) Lost() <-chan struct{} {
	s.life.check()
	return s.life.lost
}

// Context returns a context cancelled when Lost closes. Its cause
// (context.Cause) is an error wrapping ErrLeaseLost, or ErrSessionClosed
// after Close. Its Done and Err check the deadline as Lost does.
func (s *Session) Context() context.Context {
	s.life.check()
	return checkedContext{s.life.ctx, s}
}

// Acquire acquires resource for the session, waiting in the resource's
// queue as Client.Acquire does; the wait also ends when the session is
// lost or closed. The lease it returns lives as long as the session (and
// never past its hold cap, see MaxHold): it does not renew itself; its
// Lost closes and its Context is cancelled when the session is lost or
// closed, or the lease is released; its Expires is the session's. Release
// it as any lease when done with it before the session ends.
//
// The TTL option is refused (ErrInvalidOption): the session's TTL is the
// lease's. On a session that is lost, Acquire sends nothing and returns
// an error wrapping ErrLeaseLost; on a closed one, ErrSessionClosed.
func (s *Session) Acquire(ctx context.Context, resource string, opts ...AcquireOption) (*Lease, error) {
	read := func() (acquireOptions, error) { return s.c.acquireOptions(resource, opts) }
	return s.acquire(ctx, read, func(ctx context.Context, ao acquireOptions) (*Lease, error) {
		return s.c.acquire(ctx, resource, ao)
	})
}

// TryAcquire makes one attempt to acquire resource for the session, as
// Client.TryAcquire does; the lease is as Acquire's.
func (s *Session) TryAcquire(ctx context.Context, resource string, opts ...AcquireOption) (*Lease, error) {
	read := func() (acquireOptions, error) { return s.c.acquireOptions(resource, opts) }
	return s.acquire(ctx, read, func(ctx context.Context, ao acquireOptions) (*Lease, error) {
		return s.c.acquireOnce(ctx, resource, ao, 0)
	})
}

// acquire checks the session and the options (read by read), and runs do
// (one acquire, or a waiting one) for the session, within ctx and the
// session's life.
func (s *Session) acquire(ctx context.Context, read func() (acquireOptions, error),
	do func(ctx context.Context, ao acquireOptions) (*Lease, error)) (*Lease, error) {
	if err := s.ended(); err != nil {
		return nil, err
	}
	ao, err := read()
	if err != nil {
		return nil, err
	}
	if ao.ttl != 0 {
		return nil, fmt.Errorf("%w: TTL with a session: a session's lease lives as long as its session (set SessionTTL instead)", ErrInvalidOption)
	}
	ao.session = s
	// The acquire, and any wait, ends when the session does: a wait's
	// cancel then leaves nothing queued or granted.
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(s.life.ctx, func() { cancel(s.ended()) })()
	l, err := do(actx, ao)
	if err != nil && ctx.Err() == nil {
		if end := s.ended(); end != nil {
			return nil, end
		}
	}
	return l, err
}

func (s *Session) checkLost() { s.life.check() }

// ended returns nil while the session lives, else the error an acquire
// on it returns.
func (s *Session) ended() error {
	if !s.life.check() {
		return nil
	}
	cause := context.Cause(s.life.ctx)
	if errors.Is(cause, ErrSessionClosed) {
		return cause
	}
	return wrapErr(ErrLeaseLost, fmt.Errorf("session lost: %w", cause))
}

// newLease returns the lease of the session granted in resp to an acquire
// sent at sent. Its only deadline of its own is its hold limit.
func (s *Session) newLease(resource, owner string, maxHold time.Duration, resp *streams.LeaseResponse, sent time.Time) *Lease {
	l := &Lease{c: s.c, resource: resource, owner: owner, id: resp.LeaseID, token: resp.Token,
		life: newLife("keepalive", s.c.opts.safetyMargin), sess: s}
	if hold, ok := sessionHoldLeft(resp, maxHold); ok {
		l.life.holdLimit = sent.Add(hold - min(s.c.opts.safetyMargin, hold/4))
		l.life.setDeadlineAt(l.life.holdLimit, 0)
	}
	l.recordReply(resp)
	return l
}

// sessionHoldLeft returns how much of the hold cap of a session's lease
// the client may count on from the send time of its acquire. A session's
// grant carries the session's ttl_ms and expires_at, not the lease's, so
// holdLeft's sum does not apply. hold_until minus the session's expires_at
// undercounts the hold by what was left of the session's TTL at the grant
// (at most the TTL): safe, and a hold cap is far longer than a TTL. Both
// times are the service's; a MaxHold the caller asked for bounds it
// without any clock.
func sessionHoldLeft(resp *streams.LeaseResponse, maxHold time.Duration) (time.Duration, bool) {
	hold, ok := time.Duration(0), false
	if resp.HoldUntil != "" {
		until, err1 := time.Parse(time.RFC3339Nano, resp.HoldUntil)
		exp, err2 := time.Parse(time.RFC3339Nano, resp.ExpiresAt)
		if err1 == nil && err2 == nil {
			hold, ok = max(until.Sub(exp), 0), true
		}
	}
	if maxHold > 0 && (!ok || maxHold < hold) {
		hold, ok = maxHold, true
	}
	return hold, ok
}

// startInSession hands a granted lease of the session to its caller: it
// follows the session's end from now on. A grant that arrives when the
// session is lost or closed is not handed over.
func (l *Lease) startInSession() error {
	close(l.life.done) // nothing renews it
	l.unwatch = context.AfterFunc(l.sess.life.ctx, func() {
		l.life.markLost(sessionLeaseCause(context.Cause(l.sess.life.ctx)))
	})
	if err := l.sess.ended(); err != nil {
		l.life.markLost(sessionLeaseCause(context.Cause(l.sess.life.ctx)))
		return err
	}
	l.life.arm()
	return nil
}

// sessionLeaseCause is the cause of a session's lease when the session
// ended with cause: the session's loss, or its close, which released the
// lease.
func sessionLeaseCause(cause error) error {
	if errors.Is(cause, ErrSessionClosed) {
		return &wrapped{sentinel: ErrReleased, cause: cause, text: ErrReleased.Error() + " with its session"}
	}
	return cause
}

// Close closes the session: the service releases every lease it holds
// and cancels every wait it made. The session's Lost closes and its
// Context is cancelled with cause ErrSessionClosed as soon as the
// keepalives have stopped, before the close request is sent and whatever
// its outcome; so do its leases'.
//
// Close is idempotent: after a Close that went through, further calls
// return nil. It tries for the client's request timeout (WithRequestTimeout)
// at most, and never past the session's deadline: from then on the
// service ends the session by itself, and Close sends nothing and returns
// nil. It returns an error wrapping ErrUnavailable when the close was not
// confirmed (the session then ends after its TTL unless Close is called
// again and gets through).
func (s *Session) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.life.stop()
	<-s.life.done
	s.life.markLost(ErrSessionClosed)

	deadline := s.life.expires()
	if s.life.passed(deadline) {
		s.closed = true
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.c.opts.requestTimeout)
	defer cancel()
	ctx, cancelAtDeadline := context.WithDeadline(ctx, deadline)
	defer cancelAtDeadline()
	var resp streams.SessionCloseResponse
	err := s.c.retry(ctx, func() error {
		return s.c.call(ctx, streams.OpSessionClose, &streams.SessionCloseRequest{SessionID: s.id}, &resp, 0)
	})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: session close not confirmed in time; the service ends the session after its TTL", ErrUnavailable)
		}
		return err
	}
	s.closed = true
	return nil
}
