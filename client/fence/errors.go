package fence

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error a guard returns either is one of these (test
// with errors.Is), wraps the caller's context error, or wraps an error of
// the underlying store (NATS, SQL driver), whose outcome is unknown.
var (
	// ErrStaleToken means a newer token has already been accepted for the
	// resource: the caller's lease is no longer current and the protected
	// operation must not happen. The concrete error is a *StaleTokenError.
	ErrStaleToken = errors.New("fence: stale token")

	// ErrInvalid is wrapped by errors for arguments that can never succeed:
	// an empty resource, a zero token, a token the backend cannot store, or
	// an invalid option.
	ErrInvalid = errors.New("fence: invalid argument")

	// ErrConflict means the KV backend lost the compare-and-set race for a
	// resource on every one of its attempts. Nothing was accepted; the call
	// may be retried.
	ErrConflict = errors.New("fence: too many concurrent updates")

	// ErrCorrupt means a stored guard record could not be decoded. The
	// guard refuses to decide rather than guess a highest token.
	ErrCorrupt = errors.New("fence: guard record is corrupt")

	// ErrNotFound means no guard record exists for the resource: no token
	// was ever accepted for it.
	ErrNotFound = errors.New("fence: no guard record")
)

// StaleTokenError is the error returned when a token is rejected. It
// matches ErrStaleToken through errors.Is.
type StaleTokenError struct {
	// Resource is the resource the token was presented for.
	Resource string
	// Token is the rejected token.
	Token uint64
	// Highest is the highest token accepted for Resource when the token was
	// rejected; it is always larger than Token.
	Highest uint64
}

// Error implements error.
func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("fence: stale token %d for resource %q: token %d already accepted", e.Token, e.Resource, e.Highest)
}

// Is reports whether target is ErrStaleToken.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
