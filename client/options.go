package client

import (
	"fmt"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Option configures a Client.
type Option func(*options) error

type options struct {
	prefix         string
	requestTimeout time.Duration
	safetyMargin   time.Duration
	retries        int
	maxSetSize     int // see WithMaxSetSize
}

func defaultOptions() options {
	return options{prefix: streams.DefaultPrefix, requestTimeout: 5 * time.Second, safetyMargin: time.Second, retries: 4,
		maxSetSize: streams.DefaultSetSize}
}

// WithPrefix sets the subject prefix of the service. The default is
// "jetlock".
func WithPrefix(p string) Option {
	return func(o *options) error {
		if p == "" {
			return fmt.Errorf("%w: empty prefix", ErrInvalidOption)
		}
		o.prefix = p
		return nil
	}
}

// WithRequestTimeout sets how long one request waits for its reply
// (a waiting acquire waits this much longer than its wait). The default is
// 5s.
func WithRequestTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: request timeout %v", ErrInvalidOption, d)
		}
		o.requestTimeout = d
		return nil
	}
}

// WithSafetyMargin sets how long before the end of its TTL the client
// stops trusting a lease: the client's deadline is the send time of the
// last successful acquire or renew plus the TTL minus this margin. It
// covers clock-rate drift and scheduling delay. The default is 1s, capped
// at a quarter of the lease's TTL.
func WithSafetyMargin(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return fmt.Errorf("%w: safety margin %v", ErrInvalidOption, d)
		}
		o.safetyMargin = d
		return nil
	}
}

// WithRetries sets how many times an acquire, release or cancel whose
// outcome is unknown (no reply, or "unavailable") is retried with the same
// ids before the call gives up. The default is 4. Retries are jittered and
// always end with the call's ctx.
func WithRetries(n int) Option {
	return func(o *options) error {
		if n < 0 {
			return fmt.Errorf("%w: retries %d", ErrInvalidOption, n)
		}
		o.retries = n
		return nil
	}
}

// AcquireOption configures one Acquire or TryAcquire.
type AcquireOption func(*acquireOptions) error

type acquireOptions struct {
	ttl       time.Duration
	owner     string
	requestID string
	wait      time.Duration
	maxHold   time.Duration
	// session is the session that acquires (Session.Acquire), nil for a
	// lease of its own.
	session *Session
	// set is the lock set to acquire (AcquireAll), sorted; nil for one
	// resource.
	set []string
	// limit is the number of permits of the semaphore to acquire a permit
	// of (Semaphore), 0 for a lock.
	limit int
	// value is the lease's value (Election.Campaign), "" for none.
	value string
}

// TTL sets the lease's time to live. The default is the service's default
// (30s unless configured otherwise). The client renews at a third of it.
func TTL(d time.Duration) AcquireOption {
	return func(o *acquireOptions) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: ttl %v", ErrInvalidOption, d)
		}
		o.ttl = d
		return nil
	}
}

// Owner sets free text naming the holder, shown in status and in
// ErrLocked errors to others. The default is empty.
func Owner(s string) AcquireOption {
	return func(o *acquireOptions) error {
		if err := streams.ValidateOwner(s); err != nil {
			return wrapErr(ErrInvalidOption, err)
		}
		o.owner = s
		return nil
	}
}

// RequestID sets the id of this logical acquire. The default is a random
// id. Set it to make an acquire idempotent across process restarts: an
// acquire retried with the same id returns the same lease while it is
// current, and ErrLeaseLost once it has ended. A retry that names another
// Owner is not the same caller and gets ErrLocked.
//
// The id names one holder, not one program: two processes that acquire
// with the same id (and owner) get the same lease and believe they both
// hold it. During a rolling deploy the old and the new process run at
// once; derive the id from something that differs between them (a pod
// name, a job run id), or give each process its own owner.
func RequestID(id string) AcquireOption {
	return func(o *acquireOptions) error {
		if err := streams.ValidateRequestID(id); err != nil {
			return wrapErr(ErrInvalidOption, err)
		}
		o.requestID = id
		return nil
	}
}

// MaxHold bounds how long the lease may be held in total, renewals
// included: the service refuses renewals past it and the lease's Lost
// closes at the hold limit (minus the safety margin). The default is the
// deployment's cap (lockd --max-hold, 24h unless configured otherwise); a
// larger value is refused by the service: Acquire returns an error wrapping
// ErrInvalidRequest.
func MaxHold(d time.Duration) AcquireOption {
	return func(o *acquireOptions) error {
		if d < time.Second {
			return fmt.Errorf("%w: max hold %v below 1s", ErrInvalidOption, d)
		}
		o.maxHold = d
		return nil
	}
}

// Wait bounds how long Acquire waits in the resource's queue; Acquire then
// returns ErrLocked (a *HeldError). The default is no bound besides ctx.
// TryAcquire ignores it.
func Wait(d time.Duration) AcquireOption {
	return func(o *acquireOptions) error {
		if d <= 0 {
			return fmt.Errorf("%w: wait %v", ErrInvalidOption, d)
		}
		o.wait = d
		return nil
	}
}

// SessionOption configures NewSession.
type SessionOption func(*sessionOptions) error

type sessionOptions struct {
	ttl       time.Duration
	owner     string
	requestID string
}

// SessionTTL sets the session's time to live: how long the service keeps
// the session, and its leases, without a keepalive. The default is the
// service's default (30s unless configured otherwise); the service's
// bounds for a lease's TTL apply. The client sends a keepalive at a third
// of it.
func SessionTTL(d time.Duration) SessionOption {
	return func(o *sessionOptions) error {
		if d < time.Millisecond {
			return fmt.Errorf("%w: session ttl %v", ErrInvalidOption, d)
		}
		o.ttl = d
		return nil
	}
}

// SessionOwner sets free text naming the session's holder, shown in
// status and list replies next to each of its leases (to the NATS user
// that holds them and to operators). The default is empty.
func SessionOwner(s string) SessionOption {
	return func(o *sessionOptions) error {
		if err := streams.ValidateOwner(s); err != nil {
			return wrapErr(ErrInvalidOption, err)
		}
		o.owner = s
		return nil
	}
}

// SessionRequestID sets the id of the open. The default is a random id.
// An open retried with the same id (and owner) from the same NATS user
// gets the same session while it lives, and ErrLeaseLost once it has
// ended: a process that restarts may take its session back. As with
// RequestID, two processes that open with the same id share one session.
func SessionRequestID(id string) SessionOption {
	return func(o *sessionOptions) error {
		if err := streams.ValidateRequestID(id); err != nil {
			return wrapErr(ErrInvalidOption, err)
		}
		o.requestID = id
		return nil
	}
}
