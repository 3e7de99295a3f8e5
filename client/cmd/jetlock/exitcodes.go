package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
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

// Error codes of jetlock's own, besides the wire contract's (streams.Code…):
// the CODE of "jetlock: CODE: message" and of a --json error.
const (
	codeUsage       = "usage"             // bad input, caught before anything connects
	codePermission  = "permission_denied" // the NATS server refused the credentials or a subject
	codeInterrupted = "interrupted"       // a signal ended the command
	codeNotFound    = "command_not_found" // run, elect: no such command (exit 127)
	codeCannotExec  = "cannot_execute"    // run, elect: the command could not be started (exit 126)
	codeFailure     = "failure"           // anything else
)

// exitError ends the command with code, after printing its message (if
// any) as one line: "jetlock: KIND: msg", or "jetlock: msg" without a kind.
type exitError struct {
	code int
	msg  string
	// kind is the error's code, a wire contract code or one of jetlock's
	// (codeUsage…); empty when msg says it all.
	kind string
	// holder is the holder of a locked resource, for --json; holders,
	// for a lock set, every held resource's (holder is the first).
	holder  *streams.Holder
	holders []streams.Holder
}

func (e *exitError) Error() string { return e.line() }

// line is the error's one line, without "jetlock: ".
func (e *exitError) line() string {
	if e.kind == "" {
		return oneLine(e.msg)
	}
	return e.kind + ": " + oneLine(e.msg)
}

// jsonCode is the error's code in --json: its kind, or the kind its exit
// code means.
func (e *exitError) jsonCode() string {
	if e.kind != "" {
		return e.kind
	}
	switch {
	case e.code == exitUsage:
		return codeUsage
	case e.code == exitUnavailable:
		return streams.CodeUnavailable
	case e.code == exitLocked:
		return streams.CodeLocked
	case e.code == exitNoPerm:
		return codePermission
	case e.code == exitLost:
		return streams.CodeLeaseLost
	case e.code == exitNotFound:
		return codeNotFound
	case e.code == exitCannotExec:
		return codeCannotExec
	case e.code > exitSignalBase:
		return codeInterrupted
	}
	return codeFailure
}

// errorJSON is a --json error: {"error":{"code","message","exit_code",
// "holder"?,"holders"?}}, the wire contract's error body plus the exit
// code; "holders" for a lock set, as the contract's.
type errorJSON struct {
	Error struct {
		Code     string           `json:"code"`
		Message  string           `json:"message"`
		ExitCode int              `json:"exit_code"`
		Holder   *streams.Holder  `json:"holder,omitempty"`
		Holders  []streams.Holder `json:"holders,omitempty"`
	} `json:"error"`
}

// report prints e: as one line "jetlock: KIND: msg" on stderr, or, with
// --json, as an errorJSON line on stdout (and nothing on stderr).
func (e *exitError) report(stdout, stderr io.Writer, asJSON bool) {
	if e.msg == "" && e.kind == "" {
		return // the exit code says it all (run passes its command's on)
	}
	if !asJSON {
		fmt.Fprintln(stderr, "jetlock: "+e.line())
		return
	}
	var out errorJSON
	out.Error.Code, out.Error.Message, out.Error.ExitCode, out.Error.Holder = e.jsonCode(), oneLine(e.msg), e.code, e.holder
	out.Error.Holders = e.holders
	_ = json.NewEncoder(stdout).Encode(out)
}

// exitf is an error with exit code, of the kind its code means (see
// jsonCode): every error line names its kind.
func exitf(code int, format string, args ...any) *exitError {
	e := &exitError{code: code, msg: fmt.Sprintf(format, args...)}
	e.kind = e.jsonCode()
	return e
}

// kindf is an error of kind with exit code.
func kindf(code int, kind, format string, args ...any) *exitError {
	return &exitError{code: code, kind: kind, msg: fmt.Sprintf(format, args...)}
}

// errPermission is the cause of a session's context when the server
// refused a publish or subscription for lack of rights.
var errPermission = errors.New("permission denied")

// usagef is a bad-input error: exit 2, nothing started.
func usagef(format string, args ...any) *exitError {
	return kindf(exitUsage, codeUsage, format, args...)
}

// permissionHint ends every permission error.
const permissionHint = "(this needs other credentials: --creds, --user/--password, --nkey or --context; revoke needs an operator's, watch an inspector's)"

// classify maps an error of the client or of NATS to its exit code and its
// one-line message, whose kind is the wire contract's code. The message
// does not repeat the kind: "lease_lost: lease is no longer current".
func classify(err error) *exitError {
	var held *client.HeldError
	switch {
	case errors.Is(err, errPermission), errors.Is(err, client.ErrPermission),
		errors.Is(err, nats.ErrPermissionViolation), errors.Is(err, nats.ErrAuthorization):
		return kindf(exitNoPerm, codePermission, "%s %s", permissionDetail(err), permissionHint)
	case errors.As(err, &held):
		e := kindf(exitLocked, streams.CodeLocked, "%s", heldText(held))
		e.holder = &streams.Holder{Owner: held.Owner, Token: held.Token}
		if !held.ExpiresAt.IsZero() {
			e.holder.ExpiresAt = streams.FormatTime(held.ExpiresAt)
		}
		if held.Limit > 0 {
			e.holder = nil // a full semaphore: the service names no holder
		}
		if held.Set != nil {
			e.holder.Resource = held.Resource
			for _, h := range held.Holders {
				wh := streams.Holder{Resource: h.Resource, Owner: h.Owner, Token: h.Token}
				if !h.ExpiresAt.IsZero() {
					wh.ExpiresAt = streams.FormatTime(h.ExpiresAt)
				}
				e.holders = append(e.holders, wh)
			}
			if len(held.Holders) == 0 {
				e.holder = nil
			}
		}
		return e
	case errors.Is(err, client.ErrLeaseLost):
		return kindf(exitLost, streams.CodeLeaseLost, "%s", detail(err, client.ErrLeaseLost))
	case errors.Is(err, client.ErrInvalidRequest), errors.Is(err, client.ErrInvalidOption), errors.Is(err, streams.ErrInvalid):
		return kindf(exitUsage, streams.CodeInvalidRequest, "%s", flagUnits(detail(err, client.ErrInvalidRequest, client.ErrInvalidOption)))
	case errors.Is(err, client.ErrTooManyWaiters):
		return kindf(exitFailure, streams.CodeTooManyWaiters, "%s", detail(err, client.ErrTooManyWaiters))
	case errors.Is(err, client.ErrInternal):
		return kindf(exitFailure, streams.CodeInternal, "%s", detail(err, client.ErrInternal))
	case errors.Is(err, context.DeadlineExceeded):
		return kindf(exitUnavailable, streams.CodeUnavailable, "no answer in time (--timeout sets how long a request waits)")
	case errors.Is(err, client.ErrUnavailable), errors.Is(err, nats.ErrNoServers), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders):
		return kindf(exitUnavailable, streams.CodeUnavailable, "%s", detail(err, client.ErrUnavailable))
	}
	return exitf(exitFailure, "%s", clean(err))
}

// detail is err's message without what its kind already says: the
// client's "jetlock: " and the words of the sentinels it wraps.
func detail(err error, sentinels ...error) string {
	s := clean(err)
	for _, sen := range sentinels {
		s = strings.TrimPrefix(s, strings.TrimPrefix(sen.Error(), "jetlock: ")+": ")
	}
	return s
}

// permissionDetail says what the server refused, e.g. `publish to
// "jetlock.v1.admin.revoke" refused by the NATS server`.
func permissionDetail(err error) string {
	s := detail(err, client.ErrPermission, errPermission)
	s = strings.TrimPrefix(s, "nats: permissions violation: ")
	if rest, ok := strings.CutPrefix(s, "Permissions Violation for "); ok {
		s = strings.ToLower(rest[:1]) + rest[1:] + " refused by the NATS server"
	}
	return s
}

// holderText names a holder. The service shows an owner only to the NATS
// user that holds the lease and to operators: without one, the lease is
// another user's or was acquired without --owner; held either way.
func holderText(owner string, token uint64) string {
	if owner == "" {
		return fmt.Sprintf("owner not shown, token %d", token)
	}
	return fmt.Sprintf("owner %s, token %d", owner, token)
}

// clean drops the client's "jetlock: " prefixes and the validators'
// "invalid request: " from a message, and a part that says again what an
// earlier part said: "lease lost: renewal refused: jetlock: lease lost:
// lease is no longer current" reads "lease lost: renewal refused: lease
// is no longer current".
func clean(err error) string {
	s := strings.ReplaceAll(err.Error(), "jetlock: ", "")
	s = strings.ReplaceAll(s, streams.ErrInvalid.Error()+": ", "")
	parts := strings.Split(s, ": ")
	out := parts[:0]
	for i, p := range parts {
		if i == len(parts)-1 || !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return strings.Join(out, ": ")
}

// oneLine folds a message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// wireBound is the service's wording of a field out of its bounds, in the
// wire contract's milliseconds: "ttl_ms 3600000 outside [1000, 600000]".
var wireBound = regexp.MustCompile(`\b(ttl_ms|wait_ms|max_hold_ms) (-?\d+) outside \[(-?\d+), (-?\d+)\]`)

// wireFlags names the flag that sets each millisecond field.
var wireFlags = map[string]string{"ttl_ms": "ttl", "wait_ms": "wait", "max_hold_ms": "max-hold"}

// flagUnits rewords the service's bounds in the flags' units, as the
// command's own checks word them: "--ttl 1h outside [1s, 10m] (the
// service's bounds)".
func flagUnits(s string) string {
	return wireBound.ReplaceAllStringFunc(s, func(m string) string {
		f := wireBound.FindStringSubmatch(m)
		ms := func(v string) string {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return v
			}
			return durationText(time.Duration(n) * time.Millisecond)
		}
		return fmt.Sprintf("--%s %s outside [%s, %s] (the service's bounds)", wireFlags[f[1]], ms(f[2]), ms(f[3]), ms(f[4]))
	})
}

// durationText writes d as the flags take it, without zero units:
// 24h, 10m, 1h30m, 1.5s, 500ms (time.Duration's String says 24h0m0s).
func durationText(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// checkDuration refuses a duration flag outside [lo, hi] (zero is "not
// given" and always allowed).
func checkDuration(flag string, d, lo, hi time.Duration) error {
	if d == 0 {
		return nil
	}
	if d < lo || d > hi {
		return usagef("--%s %s outside [%s, %s]", flag, durationText(d), durationText(lo), durationText(hi))
	}
	if d%time.Millisecond != 0 {
		return usagef("--%s %s is not a whole number of milliseconds", flag, durationText(d))
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
