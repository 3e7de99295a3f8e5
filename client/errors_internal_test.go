package client

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// An error's text says its sentinel once, whatever its detail or cause
// repeat, and it still matches the sentinel and the cause.
func TestWrapReadsOnce(t *testing.T) {
	refused := fmt.Errorf("%w: %s", ErrLeaseLost, "lease is no longer current")
	for _, tc := range []struct {
		err      error
		sentinel error
		cause    error
		want     string
	}{
		{wrapText(ErrInvalidRequest, "invalid request: ttl_ms 3600000 outside [1000, 600000]"), ErrInvalidRequest, nil,
			"jetlock: invalid request: ttl_ms 3600000 outside [1000, 600000]"},
		{wrapText(ErrUnavailable, "service overloaded: retry with backoff"), ErrUnavailable, nil,
			"jetlock: service unavailable: service overloaded: retry with backoff"},
		{wrapErr(ErrInvalidOption, fmt.Errorf("%w: owner is too long", streams.ErrInvalid)), ErrInvalidOption, streams.ErrInvalid,
			"jetlock: invalid option: owner is too long"},
		{wrapErr(ErrLeaseLost, fmt.Errorf("renewal refused: %w", refused)), ErrLeaseLost, refused,
			"jetlock: lease lost: renewal refused: lease is no longer current"},
	} {
		if tc.err.Error() != tc.want {
			t.Errorf("%q, want %q", tc.err, tc.want)
		}
		if !errors.Is(tc.err, tc.sentinel) || (tc.cause != nil && !errors.Is(tc.err, tc.cause)) {
			t.Errorf("%q does not match its sentinel and cause", tc.err)
		}
	}
}

// A refusal counts for a request only if it names the request's subject
// and came after the request started.
func TestNewRefusal(t *testing.T) {
	const subj = "jetlock.v1.admin.revoke"
	refusal := func(s string) error {
		return fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, s)
	}
	old, fresh, other := refusal(subj), refusal(subj), refusal("jetlock.v1.list")
	for _, tc := range []struct {
		before, last error
		want         bool
	}{
		{nil, fresh, true},
		{other, fresh, true},
		{old, fresh, true}, // a new -ERR is a new value
		{old, old, false},  // nothing new since the request started
		{nil, other, false},
		{nil, nil, false},
		{nil, nats.ErrTimeout, false},
		{old, nats.ErrTimeout, false},
	} {
		if got := newRefusal(tc.before, tc.last, subj); got != tc.want {
			t.Errorf("newRefusal(%v, %v) = %v, want %v", tc.before, tc.last, got, tc.want)
		}
	}
	err := permissionError(fresh)
	if !errors.Is(err, ErrPermission) || !errors.Is(err, nats.ErrPermissionViolation) ||
		err.Error() != `jetlock: permission denied: publish to "jetlock.v1.admin.revoke" refused by the NATS server` {
		t.Fatalf("permissionError: %q", err)
	}
}

// P10: a holder whose owner the service does not show (another user's
// lease) is named as such, never as an owner "" that reads like no holder.
func TestHeldErrorNamesAHiddenHolder(t *testing.T) {
	for _, e := range []*HeldError{
		{Resource: "orders/1", Token: 7},
		{Resource: "a", Token: 7, Set: []string{"a", "b"}, Holders: []Holder{{Resource: "a", Token: 7}}},
	} {
		text := e.Error()
		if !errors.Is(e, ErrLocked) || !strings.Contains(text, "owner is not shown") || strings.Contains(text, `""`) {
			t.Errorf("%q: want the holder named as hidden", text)
		}
	}
	if text := (&HeldError{Resource: "orders/1", Owner: "alice", Token: 7}).Error(); !strings.Contains(text, `by "alice"`) {
		t.Errorf("%q: want the owner", text)
	}
}
