package main_test

import (
	"strings"
	"testing"
)

// Credentials the server refuses are exit 77 with the flags and variables
// to check.
func TestRefusedCredentialsNameTheFlags(t *testing.T) {
	r := jl(t, "--user", "operator", "--password", "wrong", "status", "orders/refused")
	wantError(t, r, 77)
	if want := "check --user/--password, --creds, --nkey or --context (NATS_USER, NATS_PASSWORD, NATS_CREDS, NATS_NKEY, NATS_CONTEXT)"; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr %q does not say %q", r.stderr, want)
	}
}
