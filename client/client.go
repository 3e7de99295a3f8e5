package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// Client talks to the jetlock service over a NATS connection. It is safe
// for concurrent use.
//
// A call that gives up (its ctx ended, or its outcome stayed unknown) may
// leave cleanup that needs the network: the cancel of an abandoned
// acquire, the release of a lease granted as the caller gave up. The call
// runs that cleanup within its ctx if it can and otherwise returns on time
// and leaves it to a goroutine of the client, bounded by the request
// timeout (WithRequestTimeout). Close waits for those goroutines.
type Client struct {
	nc   *nats.Conn
	opts options

	// cleanups counts the cleanups running in the background (see
	// cleanup); idle is closed while there are none, replaced when one
	// starts. Not a sync.WaitGroup: Close may wait while calls start new
	// cleanups.
	cleanupMu sync.Mutex
	cleanups  int
	idle      chan struct{}
}

// New returns a client that sends its requests on nc. It uses the caller's
// connection as it is and never replaces its handlers; closing nc is the
// caller's business. Invalid options return an error wrapping
// ErrInvalidOption.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalidOption)
	}
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	return &Client{nc: nc, opts: o}, nil
}

// Close waits for the cleanups the client runs in the background (see
// Client), each bounded by the request timeout, so that a program about
// to exit leaves nothing granted to nobody: at least those of the calls
// that returned before Close was called. It does not close the
// connection, which is the caller's, nor release leases still held:
// release them first. The client stays usable after Close.
func (c *Client) Close() error {
	c.cleanupMu.Lock()
	idle := c.idle
	c.cleanupMu.Unlock()
	if idle != nil {
		<-idle
	}
	return nil
}

// cleanup runs fn, network cleanup of a call that gave up, on a context of
// its own bounded by the request timeout, and waits for it while the
// caller's ctx lasts: the call never overruns its ctx for it, and what is
// left of fn runs on in the background (Close waits for it).
func (c *Client) cleanup(ctx context.Context, fn func(ctx context.Context)) {
	done := make(chan struct{})
	c.cleanupMu.Lock()
	if c.cleanups == 0 {
		c.idle = make(chan struct{})
	}
	c.cleanups++
	c.cleanupMu.Unlock()
	go func() {
		defer func() {
			c.cleanupMu.Lock()
			if c.cleanups--; c.cleanups == 0 {
				close(c.idle)
			}
			c.cleanupMu.Unlock()
		}()
		defer close(done)
		cctx, cancel := context.WithTimeout(context.Background(), c.opts.requestTimeout)
		defer cancel()
		fn(cctx)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// TryAcquire makes one attempt to acquire resource and returns at once: a
// held lease, or a *HeldError (matching ErrLocked) when another lease holds
// it. An attempt whose outcome is unknown is retried with the same request
// id; if it stays unknown, TryAcquire cancels the request (so that nothing
// stays granted to nobody) and returns ErrUnavailable.
func (c *Client) TryAcquire(ctx context.Context, resource string, opts ...AcquireOption) (*Lease, error) {
	ao, err := c.acquireOptions(resource, opts)
	if err != nil {
		return nil, err
	}
	return c.acquireOnce(ctx, resource, ao, 0)
}

// maxWaitChunk is the longest wait_ms one request asks for; a longer wait
// is a sequence of requests with the same request id. It stays below the
// service's default bound on wait_ms (5 minutes).
const maxWaitChunk = time.Minute

// Acquire acquires resource, waiting in the resource's FIFO queue while
// others hold it, until it is granted, ctx ends, or the Wait option's bound
// passes (then it returns a *HeldError, matching ErrLocked). When ctx ends
// first, Acquire cancels the request so that it leaves nothing granted or
// queued (a grant that arrives as ctx ends is released), and returns
// ctx.Err(): it returns a lease, or leaves nothing held. It returns within
// ctx: a cancel that ctx leaves no time for is sent in the background,
// bounded by the request timeout (see Client.Close).
//
// While the service is unreachable or unavailable (no responders while it
// restarts, no quorum), Acquire keeps trying with the same request id,
// with backoff, until ctx ends or the Wait bound passes: then it returns
// ctx.Err(), or an error wrapping ErrUnavailable.
func (c *Client) Acquire(ctx context.Context, resource string, opts ...AcquireOption) (*Lease, error) {
	ao, err := c.acquireOptions(resource, opts)
	if err != nil {
		return nil, err
	}
	return c.acquire(ctx, resource, ao)
}

// acquire is Acquire with its options read: a sequence of waiting
// acquires with the same request id, within ctx and the Wait bound, that
// rides out an unavailable service until then (P8).
func (c *Client) acquire(ctx context.Context, resource string, ao acquireOptions) (*Lease, error) {
	var until time.Time
	if ao.wait > 0 {
		until = time.Now().Add(ao.wait)
	}
	ctxBound := false
	if d, ok := ctx.Deadline(); ok && (until.IsZero() || d.Before(until)) {
		// Ask the service to give up a little before ctx does, so that
		// its answer arrives in time.
		until, ctxBound = d.Add(-min(time.Until(d)/10, 500*time.Millisecond)), true
	}
	backoff := 100 * time.Millisecond
	for {
		wait := maxWaitChunk
		if !until.IsZero() {
			wait = max(min(wait, time.Until(until)), 0)
		}
		l, unknown, err := c.acquireAttempt(ctx, resource, ao, wait, false)
		switch {
		case err == nil:
			// acquireAttempt hands over a lease only while ctx lasts; one
			// that ended since is the caller's to release.
			return l, nil
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case unknown:
			pause := jitter(backoff)
			if !until.IsZero() && time.Until(until) <= pause {
				// Given up: nothing may stay granted to nobody.
				c.cleanup(ctx, func(cctx context.Context) { c.abandon(cctx, resource, ao) })
				if ctxBound {
					<-ctx.Done()
					return nil, ctx.Err()
				}
				return nil, err
			}
			select {
			case <-ctx.Done():
				c.cleanup(ctx, func(cctx context.Context) { c.abandon(cctx, resource, ao) })
				return nil, ctx.Err()
			case <-time.After(pause):
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		case !errors.Is(err, ErrLocked):
			return l, err
		case wait < maxWaitChunk && ctxBound:
			// The wait ended with ctx's deadline: report it as such.
			<-ctx.Done()
			return nil, ctx.Err()
		case wait < maxWaitChunk:
			return nil, err
		}
	}
}

func (c *Client) acquireOptions(resource string, opts []AcquireOption) (acquireOptions, error) {
	if err := streams.ValidateResource(resource); err != nil {
		return acquireOptions{}, wrapErr(ErrInvalidRequest, err)
	}
	return readAcquireOptions(opts)
}

// readAcquireOptions applies opts, and gives the acquire a random request
// id if they set none.
func readAcquireOptions(opts []AcquireOption) (acquireOptions, error) {
	var ao acquireOptions
	for _, opt := range opts {
		if err := opt(&ao); err != nil {
			return ao, err
		}
	}
	if ao.requestID == "" {
		ao.requestID = newRequestID()
	}
	return ao, nil
}

// acquireOnce sends one logical acquire (waiting up to wait in the queue),
// retrying an unknown outcome with the same request id, and cancels it if
// the outcome stays unknown. For a lock set (ao.set) resource is empty.
func (c *Client) acquireOnce(ctx context.Context, resource string, ao acquireOptions, wait time.Duration) (*Lease, error) {
	l, _, err := c.acquireAttempt(ctx, resource, ao, wait, true)
	return l, err
}

// acquireAttempt is acquireOnce; with giveUp false, an outcome that stays
// unknown is returned (ErrUnavailable, and unknown true) without the
// cancel, for the caller to try again with the same request id (a
// cancelled request id is never granted again).
func (c *Client) acquireAttempt(ctx context.Context, resource string, ao acquireOptions, wait time.Duration, giveUp bool) (_ *Lease, unknown bool, _ error) {
	req := ao.request(resource, wait)
	var resp grant
	var sent time.Time
	err := c.retry(ctx, func() error {
		sent = time.Now()
		return c.call(ctx, streams.OpAcquire, req, &resp, wait)
	})
	if err == nil && ctx.Err() != nil {
		// Granted as the caller gave up: give it back (P2).
		err = ctx.Err()
	}
	if (giveUp && errors.Is(err, ErrUnavailable)) || (err != nil && ctx.Err() != nil) {
		c.cleanup(ctx, func(cctx context.Context) { c.abandon(cctx, resource, ao) })
	}
	if err != nil {
		unknown = !giveUp && ctx.Err() == nil && errors.Is(err, ErrUnavailable)
		return nil, unknown, ao.held(err, resource)
	}
	if ao.limit > 0 && (resp.Permit < 1 || resp.Permit > ao.limit) {
		// A grant the client cannot renew or release: give it back.
		c.cleanup(ctx, func(cctx context.Context) { c.abandon(cctx, resource, ao) })
		return nil, false, fmt.Errorf("%w: semaphore %s: bad reply: permit %d of %d", ErrInternal, resource, resp.Permit, ao.limit)
	}
	var members []streams.SetMember
	if ao.set != nil {
		if members, err = setMembers(ao.set, &resp); err != nil {
			// A grant the client cannot use: give it back.
			c.cleanup(ctx, func(cctx context.Context) { c.abandon(cctx, resource, ao) })
			return nil, false, err
		}
	}
	var l *Lease
	if ao.session != nil {
		l = ao.session.newLease(resource, ao.owner, ao.maxHold, &resp.LeaseResponse, sent)
	} else {
		l = c.newLease(resource, ao.owner, ao.ttl, &resp.LeaseResponse, sent)
	}
	l.members, l.permit, l.value = members, resp.Permit, ao.value
	err = l.start(ctx, wait > 0)
	if err == nil && ctx.Err() != nil {
		// Started as the caller gave up: stop it and give it back.
		err = ctx.Err()
	}
	if err != nil {
		// Granted, but not provably held any more, or not wanted: give it
		// back. Release marks it lost first, whatever its outcome.
		c.cleanup(ctx, func(cctx context.Context) { _ = l.Release(cctx) })
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		return nil, false, err
	}
	return l, false, nil
}

// request is the acquire request of resource (of ao.set, or a permit of
// the semaphore resource) that waits up to wait.
func (ao acquireOptions) request(resource string, wait time.Duration) *streams.AcquireRequest {
	req := &streams.AcquireRequest{
		Resource:  resource,
		Resources: ao.set,
		RequestID: ao.requestID,
		Owner:     ao.owner,
		TTLms:     ao.ttl.Milliseconds(),
		WaitMs:    wait.Milliseconds(),
		MaxHoldMs: ao.maxHold.Milliseconds(),
		Limit:     ao.limit,
		Value:     ao.value,
	}
	if ao.session != nil {
		req.SessionID = ao.session.id
	}
	return req
}

// held completes the HeldError in err, an acquire's refusal, with what
// was asked for: the resource or set, and a semaphore's limit (whose
// holders are not listed).
func (ao acquireOptions) held(err error, resource string) error {
	var he *HeldError
	if errors.As(err, &he) {
		he.about(resource, ao.set)
		if ao.limit > 0 {
			he.Limit, he.Holders = ao.limit, nil
		}
	}
	return err
}

// abandon cancels an acquire (of resource, of the lock set ao.set, or of
// a permit of the semaphore resource of ao.limit permits) whose outcome is
// unknown or whose caller gave up, so that a grant nobody will use is
// released at once. The cancel names the acquire's owner: the service
// matches it as it matches a retried acquire (tenant, owner, request id),
// so it never ends the lease or wait of another owner that happens to use
// the same request id. Best effort, within ctx (see cleanup).
func (c *Client) abandon(ctx context.Context, resource string, ao acquireOptions) {
	var resp streams.CancelResponse // a set's reply decodes into it as well; nothing reads it
	req := streams.CancelRequest{Resource: resource, Resources: ao.set, Limit: ao.limit, RequestID: ao.requestID, Owner: ao.owner}
	_ = c.retry(ctx, func() error {
		return c.call(ctx, streams.OpCancel, &req, &resp, 0)
	})
}

// Status is the service's view of a resource.
type Status struct {
	Resource string
	Held     bool
	Owner    string
	Token    uint64
	// ExpiresAt is the service's view of the lease's expiry; zero when
	// not held.
	ExpiresAt time.Time
	Waiters   int
	// HoldUntil is when the lease ends at the latest, renewals included,
	// when a hold cap applies; zero otherwise.
	HoldUntil time.Time
	// InSession is true when a session holds the lease (see Session);
	// SessionOwner is that session's owner, shown as Owner is: to the
	// NATS user that holds the lease, and to operators.
	InSession    bool
	SessionOwner string
	// SetSize, for a lease of a lock set (AcquireAll), is the number of
	// resources the set holds with this one; zero otherwise.
	SetSize int
	// Permit, in List, is the permit of the semaphore Resource that the
	// lease holds; zero for a lease of a lock.
	Permit int
	// Limit, from Status, is set when Resource names a semaphore: Held
	// then says whether any of its permits is held, and Permits lists
	// them (as Semaphore.Status does).
	Limit   int
	Permits []PermitStatus
}

// Status returns the state of resource. A resource nobody holds answers
// Held false, not an error.
func (c *Client) Status(ctx context.Context, resource string) (*Status, error) {
	var resp streams.StatusResponse
	err := c.retry(ctx, func() error {
		return c.call(ctx, streams.OpStatus, &streams.StatusRequest{Resource: resource}, &resp, 0)
	})
	if err != nil {
		return nil, err
	}
	st := &Status{Resource: resp.Resource, Held: resp.Held, Owner: resp.Owner, Token: resp.Token,
		ExpiresAt: parseTime(resp.ExpiresAt), Waiters: resp.Waiters, HoldUntil: parseTime(resp.HoldUntil),
		InSession: resp.InSession, SessionOwner: resp.SessionOwner, SetSize: resp.SetSize, Limit: resp.Limit}
	for _, p := range resp.Permits {
		st.Permits = append(st.Permits, PermitStatus{Permit: p.Permit, Owner: p.Owner, Token: p.Token, ExpiresAt: parseTime(p.ExpiresAt)})
	}
	return st, nil
}

func parseTime(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

func jitter(d time.Duration) time.Duration {
	return d/2 + mrand.N(d/2+1)
}

// retry runs fn until it returns something other than ErrUnavailable, at
// most 1+retries times, with jittered backoff, within ctx.
func (c *Client) retry(ctx context.Context, fn func() error) error {
	backoff := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := fn()
		if !errors.Is(err, ErrUnavailable) || attempt >= c.opts.retries {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(jitter(backoff)):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// call sends one request and decodes its reply into resp. extra lengthens
// the request timeout (for a waiting acquire). A reply with an error code
// becomes the matching sentinel error; no reply becomes ErrUnavailable
// (outcome unknown); a publish the NATS server refuses becomes
// ErrPermission (see permissionProbe); a cancelled ctx returns ctx.Err().
func (c *Client) call(ctx context.Context, op string, req, resp any, extra time.Duration) error {
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	subject := streams.Subject(c.opts.prefix, op)
	tctx, cancel := context.WithTimeout(ctx, c.opts.requestTimeout+extra)
	defer cancel()
	rctx, refuse := context.WithCancelCause(tctx)
	before := c.nc.LastError()
	defer c.permissionProbe(rctx, refuse, subject, before)()
	msg, err := c.nc.RequestWithContext(rctx, subject, data)
	if err != nil {
		if cause := context.Cause(rctx); errors.Is(cause, ErrPermission) {
			return cause
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if last := c.nc.LastError(); newRefusal(before, last, subject) {
			// The probe missed it (it ran before the publish went out).
			return permissionError(last)
		}
		return wrapErr(ErrUnavailable, fmt.Errorf("%s request: %w", op, err))
	}
	if code := msg.Header.Get(streams.HeaderErrorCode); code != "" {
		return decodeError(code, msg)
	}
	if err := json.Unmarshal(msg.Data, resp); err != nil {
		return wrapErr(ErrInternal, fmt.Errorf("%s: bad reply: %w", op, err))
	}
	return nil
}

// permissionProbeDelay is how long a request waits for its reply before
// the client asks whether the server refused to publish it.
const permissionProbeDelay = 100 * time.Millisecond

// permissionProbe makes a request whose publish the server refused fail
// with ErrPermission at once, instead of after its timeout and retries.
// The server answers a refused publish with nothing but an asynchronous
// -ERR, which nats.go records as the connection's LastError (and passes to
// the error handler, which is the caller's, not the client's). So, when a
// request has had no reply for permissionProbeDelay, a flush (a round trip
// behind the publish) makes sure any -ERR for it has been read; if the
// last error is then a new refusal of this subject (newRefusal; before is
// the last error when the request started), the request is cancelled with
// that cause. Should the probe run before the publish went out, call
// checks once more when the request times out. A reply within the delay costs nothing. The
// returned func stops the probe and waits for it; call it when the request
// has returned.
func (c *Client) permissionProbe(ctx context.Context, refuse context.CancelCauseFunc, subject string, before error) (stop func()) {
	done := make(chan struct{})
	t := time.AfterFunc(permissionProbeDelay, func() {
		defer close(done)
		if c.nc.FlushWithContext(ctx) != nil {
			return
		}
		if last := c.nc.LastError(); newRefusal(before, last, subject) {
			refuse(permissionError(last))
		}
	})
	return func() {
		refuse(nil)
		if !t.Stop() {
			<-done
		}
	}
}

func decodeError(code string, msg *nats.Msg) error {
	var body streams.ErrorResponse
	_ = json.Unmarshal(msg.Data, &body)
	wire := body.Error.Code
	if wire == "" {
		n, _ := strconv.Atoi(code)
		wire = streams.CodeForStatus(n)
	}
	text := body.Error.Message
	if text == "" {
		text = msg.Header.Get(streams.HeaderError)
	}
	switch wire {
	case streams.CodeLocked:
		he := &HeldError{}
		if h := body.Error.Holder; h != nil {
			he.Owner, he.Token, he.ExpiresAt = h.Owner, h.Token, parseTime(h.ExpiresAt)
		}
		for _, h := range body.Error.Holders {
			he.Holders = append(he.Holders, Holder{Resource: h.Resource, Owner: h.Owner, Token: h.Token, ExpiresAt: parseTime(h.ExpiresAt)})
		}
		return he
	case streams.CodeLeaseLost:
		return wrapText(ErrLeaseLost, text)
	case streams.CodeInvalidRequest:
		return wrapText(ErrInvalidRequest, text)
	case streams.CodeTooManyWaiters:
		return wrapText(ErrTooManyWaiters, text)
	case streams.CodeUnavailable:
		return wrapText(ErrUnavailable, text)
	case streams.CodeForbidden:
		return wrapText(ErrPermission, text)
	default:
		return wrapText(ErrInternal, text)
	}
}
