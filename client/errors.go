package client

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Errors returned by the client wrap one of these (test
// with errors.Is), except a cancelled or expired ctx, which is returned as
// ctx.Err().
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
)

// HeldError is returned when a resource is held by another lease. It
// matches ErrLocked with errors.Is.
type HeldError struct {
	Resource string
	// Owner is the holder's owner text, if it gave one.
	Owner string
	// Token is the holder's fencing token.
	Token uint64
	// ExpiresAt is the service's view of the holder's expiry (zero if the
	// service sent none).
	ExpiresAt time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("jetlock: %s is locked by %q (token %d, expires %s)", e.Resource, e.Owner, e.Token, e.ExpiresAt.Format(time.RFC3339))
}

// Is makes a HeldError match ErrLocked.
func (e *HeldError) Is(target error) bool { return target == ErrLocked }
