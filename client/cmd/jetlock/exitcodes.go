package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

// Exit codes. They follow sysexits.h where one fits.
const (
	exitFailure     = 1
	exitUsage       = 2
	exitUnavailable = 69 // EX_UNAVAILABLE
	exitLocked      = 75 // EX_TEMPFAIL: try again later
	exitNoPerm      = 77 // EX_NOPERM
	exitLost        = 79 // beyond sysexits: the lease was lost
	exitCannotExec  = 126
	exitNotFound    = 127
	exitSignalBase  = 128
)

// exitError ends the command with code, after printing msg (unless empty)
// as one line.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func exitf(code int, format string, args ...any) *exitError {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// errPermission is the cause of a session's context when the server
// refused a publish or subscription for lack of rights.
var errPermission = errors.New("permission denied")

// usagef is a bad-input error: exit 2, nothing started.
func usagef(format string, args ...any) *exitError {
	return exitf(exitUsage, "usage: "+format, args...)
}

// classify maps an error of the client or of NATS to its exit code and its
// one-line message, which starts with the wire contract's code.
func classify(err error) *exitError {
	var held *client.HeldError
	switch {
	case errors.Is(err, errPermission), errors.Is(err, nats.ErrPermissionViolation), errors.Is(err, nats.ErrAuthorization):
		return exitf(exitNoPerm, "permission denied: %s (this needs other credentials: --creds, --user/--password, --nkey or --context; revoke and watch need an operator's)",
			strings.TrimPrefix(strings.TrimPrefix(clean(err), errPermission.Error()+": "), "nats: permissions violation: "))
	case errors.As(err, &held):
		return exitf(exitLocked, "%s: resource is held by another lease (%s)", streams.CodeLocked, holderText(held.Owner, held.Token))
	case errors.Is(err, client.ErrLeaseLost):
		return exitf(exitLost, "%s: %s", streams.CodeLeaseLost, clean(err))
	case errors.Is(err, client.ErrInvalidRequest), errors.Is(err, client.ErrInvalidOption), errors.Is(err, streams.ErrInvalid):
		return exitf(exitUsage, "%s: %s", streams.CodeInvalidRequest, clean(err))
	case errors.Is(err, client.ErrTooManyWaiters):
		return exitf(exitFailure, "%s: %s", streams.CodeTooManyWaiters, clean(err))
	case errors.Is(err, client.ErrInternal):
		return exitf(exitFailure, "%s: %s", streams.CodeInternal, clean(err))
	case errors.Is(err, client.ErrUnavailable), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders):
		return exitf(exitUnavailable, "%s: %s", streams.CodeUnavailable, clean(err))
	}
	return exitf(exitFailure, "%s", clean(err))
}

func holderText(owner string, token uint64) string {
	if owner == "" {
		return fmt.Sprintf("token %d", token)
	}
	return fmt.Sprintf("owner %s, token %d", owner, token)
}

// clean drops the client's repeated "jetlock: " prefixes from a message.
func clean(err error) string {
	s := strings.ReplaceAll(err.Error(), "jetlock: ", "")
	return strings.ReplaceAll(s, streams.ErrInvalid.Error()+": ", "")
}

// oneLine folds a message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// checkDuration refuses a duration flag outside [lo, hi] (zero is "not
// given" and always allowed).
func checkDuration(flag string, d, lo, hi time.Duration) error {
	if d == 0 {
		return nil
	}
	if d < lo || d > hi {
		return usagef("--%s %v outside [%v, %v]", flag, d, lo, hi)
	}
	if d%time.Millisecond != 0 {
		return usagef("--%s %v is not a whole number of milliseconds", flag, d)
	}
	return nil
}

// checkResource validates a resource name with the wire contract's rules.
func checkResource(r string) error {
	if err := streams.ValidateResource(r); err != nil {
		return usagef("resource %q: %s", r, clean(err))
	}
	return nil
}
