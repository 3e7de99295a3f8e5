package client

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// Sentinel errors. Errors returned by the client wrap one of these (test
// with errors.Is), except a cancelled or expired ctx, which is returned as
// ctx.Err().
//
// An error's text names its sentinel once, then the detail: the service's
// message for an error reply ("jetlock: invalid request: ttl_ms 3600000
// outside [1000, 600000]"), or what went wrong on the client's side.
var (
	// ErrLocked: the resource is held by another lease. The concrete error
	// is a *HeldError describing the holder.
	ErrLocked = errors.New("jetlock: resource is locked")
	// ErrLeaseLost: the lease is no longer current (expired, released, or
	// the acquire's request id was granted before and has ended), or the
	// client could not prove it held the lease before its own deadline.
	ErrLeaseLost = errors.New("jetlock: lease lost")
	// ErrReleased is the cause of a lease's Context after Release.
	ErrReleased = errors.New("jetlock: lease released")
	// ErrUnavailable: the service or its state store did not answer, or has
	// no quorum. The outcome is unknown; the client retries with the same
	// ids where that is safe.
	ErrUnavailable = errors.New("jetlock: service unavailable")
	// ErrInvalidRequest: the service refused the request as malformed or
	// out of bounds; nothing changed.
	ErrInvalidRequest = errors.New("jetlock: invalid request")
	// ErrTooManyWaiters: the resource's or the owner's waiter cap is
	// reached.
	ErrTooManyWaiters = errors.New("jetlock: too many waiters")
	// ErrInternal: the service hit a bug; it logged the details.
	ErrInternal = errors.New("jetlock: internal service error")
	// ErrInvalidOption: an option value is out of range.
	ErrInvalidOption = errors.New("jetlock: invalid option")
	// ErrPermission: the NATS server refused to let the connection publish
	// the request (its user lacks the right, e.g. a caller sending an
	// operator's revoke; the error then also wraps the server's
	// nats.ErrPermissionViolation), or the service answered "forbidden" (an
	// admin request from a sender the server did not vouch for as one of
	// its operators). Nothing changed and a retry cannot help.
	ErrPermission = errors.New("jetlock: permission denied")
)

// HeldError is returned when a resource is held by another lease. It
// matches ErrLocked with errors.Is.
//
// For a lock set (AcquireAll), Set is the set asked for and Holders names
// every resource of it that was held, each with its holder; Resource,
// Owner, Token and ExpiresAt are then those of Holders[0], the first held
// resource in sorted order.
type HeldError struct {
	Resource string
	// Owner is the holder's owner text, if it gave one and the service
	// shows it to the caller: it shows it only to the NATS user that holds
	// the lease and to operators. Empty does not mean free: the resource
	// is held, by another user or without an owner text.
	Owner string
	// Token is the holder's fencing token.
	Token uint64
	// ExpiresAt is the service's view of the holder's expiry (zero if the
	// service sent none).
	ExpiresAt time.Time
	// Holders are the held resources and their holders: for one resource
	// the one above; for a lock set, every held member (see above).
	Holders []Holder
	// Set is the lock set the acquire asked for, sorted; nil for an
	// acquire of one resource.
	Set []string
	// Limit, for a permit of a semaphore (Semaphore), is its number of
	// permits, none of which was free for the acquire (all held, or the
	// free ones reserved for the waiters ahead); the service names no
	// holder then. 0 otherwise.
	Limit int
}

// Holder is a held resource and who holds it, in a HeldError.
type Holder struct {
	Resource string
	// Owner is the holder's owner text, if it gave one and the service
	// shows it to the caller.
	Owner string
	// Token is the holder's fencing token of Resource.
	Token uint64
	// ExpiresAt is the service's view of the holder's expiry (zero if the
	// service sent none).
	ExpiresAt time.Time
}

func (e *HeldError) Error() string {
	if e.Limit > 0 {
		return fmt.Sprintf("jetlock: semaphore %s has no free permit (limit %d)", e.Resource, e.Limit)
	}
	if e.Set == nil {
		return fmt.Sprintf("jetlock: %s is locked by %s (token %d, expires %s)", e.Resource, holderName(e.Owner), e.Token, e.ExpiresAt.Format(time.RFC3339))
	}
	held := make([]string, 0, len(e.Holders))
	for _, h := range e.Holders {
		held = append(held, fmt.Sprintf("%s by %s (token %d, expires %s)", h.Resource, holderName(h.Owner), h.Token, h.ExpiresAt.Format(time.RFC3339)))
	}
	if len(held) == 0 {
		held = append(held, "holders not named by the service")
	}
	return fmt.Sprintf("jetlock: lock set of %d resources is locked: %s", len(e.Set), strings.Join(held, ", "))
}

// holderName names a holder by its owner text. The service shows the
// owner only to the NATS user that holds the lease (and to operators): an
// empty one is another user's lease, or a lease acquired without an owner;
// held either way.
func holderName(owner string) string {
	if owner == "" {
		return "a holder whose owner is not shown (another user's lease, or none given)"
	}
	return strconv.Quote(owner)
}

// Is makes a HeldError match ErrLocked.
func (e *HeldError) Is(target error) bool { return target == ErrLocked }

// wrapped is a sentinel with its detail and, when there is one, the error
// that caused it; it matches both with errors.Is and errors.As.
type wrapped struct {
	sentinel error
	cause    error // may be nil
	text     string
}

func (e *wrapped) Error() string { return e.text }

func (e *wrapped) Unwrap() []error {
	if e.cause == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.cause}
}

// wrapText returns sentinel with detail, a text such as a service's error
// message. A detail that repeats the sentinel's own words at its start
// ("invalid request: ttl_ms ..." under ErrInvalidRequest, as the service
// words its messages) reads once.
func wrapText(sentinel error, detail string) error {
	return &wrapped{sentinel: sentinel, text: sentinel.Error() + ": " + trimWords(detail, sentinel)}
}

// wrapErr returns sentinel caused by cause (kept for errors.Is and As),
// whose text reads once like wrapText's.
func wrapErr(sentinel, cause error) error {
	return &wrapped{sentinel: sentinel, cause: cause, text: sentinel.Error() + ": " + trimWords(cause.Error(), sentinel)}
}

// trimWords drops from s what a reader has already been told by sentinel:
// the sentinel's own text wherever s wraps it again ("renewal refused:
// jetlock: lease lost: ..." under ErrLeaseLost), and at its start
// "jetlock: ", the sentinel's words, and the words of streams.ErrInvalid
// (the contract validators' "invalid request: ").
func trimWords(s string, sentinel error) string {
	s = strings.ReplaceAll(s, sentinel.Error()+": ", "")
	for _, p := range []string{"jetlock: ", words(sentinel) + ": ", streams.ErrInvalid.Error() + ": "} {
		s = strings.TrimPrefix(s, p)
	}
	return s
}

// words is a sentinel's text without the package's "jetlock: ".
func words(sentinel error) string { return strings.TrimPrefix(sentinel.Error(), "jetlock: ") }

// permissionError returns ErrPermission for the server's refusal err (a
// nats.ErrPermissionViolation), worded "publish to "SUBJECT" refused".
func permissionError(err error) error {
	what := err.Error()
	if _, after, ok := strings.Cut(what, "Permissions Violation for "); ok {
		what = strings.ToLower(after[:1]) + after[1:] // Publish to "x" -> publish to "x"
	}
	return &wrapped{sentinel: ErrPermission, cause: err, text: ErrPermission.Error() + ": " + what + " refused by the NATS server"}
}

// deniedPublish reports whether err is the server's refusal to let this
// connection publish to subject.
func deniedPublish(err error, subject string) bool {
	return errors.Is(err, nats.ErrPermissionViolation) &&
		strings.Contains(err.Error(), fmt.Sprintf("Publish to %q", subject))
}

// newRefusal reports whether last, a connection's last error, is a refusal
// to publish to subject that came after before, the last error when the
// request started. Each -ERR the server sends makes a new error value in
// nats.go (a pointer, so comparable): a refusal from an earlier request
// does not count, in case the server's permissions changed since.
func newRefusal(before, last error, subject string) bool {
	return deniedPublish(last, subject) && (!deniedPublish(before, subject) || last != before)
}
