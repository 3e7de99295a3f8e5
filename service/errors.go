package service

import (
	"errors"
	"fmt"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// ErrInvalidConfig is wrapped by Config.Validate and New errors.
var ErrInvalidConfig = errors.New("invalid service config")

// opError is a contract error answered to the caller: a code of the wire
// contract, a message, for "locked" the holder, and for a caller over its
// fair-use rate when to retry.
type opError struct {
	code       string
	msg        string
	holder     *streams.Holder
	holders    []streams.Holder // the held resources of a set
	retryAfter time.Duration
}

func (e *opError) Error() string { return e.code + ": " + e.msg }

func newOpError(code, format string, args ...any) *opError {
	return &opError{code: code, msg: fmt.Sprintf(format, args...)}
}

// toOpError maps any error of a handler to the error answered on the wire.
func toOpError(err error) *opError {
	var oe *opError
	switch {
	case errors.As(err, &oe):
		return oe
	case errors.Is(err, streams.ErrInvalid):
		return &opError{code: streams.CodeInvalidRequest, msg: err.Error()}
	case errors.Is(err, errUnavailable), errors.Is(err, errConflict):
		// A conflict that outlived every retry is contention we could not
		// resolve in time: the outcome is "try again", like unavailability.
		return &opError{code: streams.CodeUnavailable, msg: err.Error()}
	default:
		return &opError{code: streams.CodeInternal, msg: err.Error()}
	}
}

// isCode reports whether err is answered on the wire with code.
func isCode(err error, code string) bool {
	var oe *opError
	return errors.As(err, &oe) && oe.code == code
}
