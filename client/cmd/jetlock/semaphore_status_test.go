package main_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

// A semaphore's permits are shown with their numbers: status of its name
// (with or without --limit), ls --json; an operator revokes one permit
// with revoke --permit; a lock of the semaphore's name is refused.
func TestSemaphoreStatusLsAndRevokePermit(t *testing.T) {
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sem, err := c.NewSemaphore("cli/encoders", 3)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sem.TryAcquire(ctx, client.TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(ctx)

	for _, args := range [][]string{{"status", "--json", "cli/encoders"}, {"status", "--json", "--limit", "3", "cli/encoders"}} {
		r := jl(t, args...)
		wantCode(t, r, 0)
		var st streams.StatusResponse
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatalf("%v: %v: %s", args, err, r.stdout)
		}
		if !st.Held || st.Limit != 3 || len(st.Permits) != 1 || st.Permits[0].Permit != p.Permit() || st.Permits[0].Token != p.Token() {
			t.Fatalf("%v: %s, want permit %d held of limit 3", args, r.stdout, p.Permit())
		}
	}
	r := jl(t, "status", "cli/encoders")
	wantCode(t, r, 0)
	if !strings.Contains(r.stdout, "semaphore of 3 permits, 1 held") {
		t.Fatalf("status of the semaphore's name: %q", r.stdout)
	}
	r = jl(t, "ls", "--json", "cli/")
	wantCode(t, r, 0)
	var lr streams.ListResponse
	if err := json.Unmarshal([]byte(r.stdout), &lr); err != nil || len(lr.Leases) != 1 || lr.Leases[0].Permit != p.Permit() {
		t.Fatalf("ls --json: %s (%v), want permit %d", r.stdout, err, p.Permit())
	}
	r = jl(t, "acquire", "cli/encoders")
	if r.code == 0 || !strings.Contains(r.stderr, "semaphore of limit 3") {
		t.Fatalf("a lock of the semaphore's name: exit %d, %q", r.code, r.stderr)
	}
	r = jl(t, operator("revoke", "--json", "--permit", "9", "cli/encoders", "--reason", "test")...)
	wantCode(t, r, 0)
	if !strings.Contains(r.stdout, `"revoked":false`) {
		t.Fatalf("revoke of a permit not held: %s", r.stdout)
	}
	r = jl(t, operator("revoke", "--permit", strconv.Itoa(p.Permit()), "cli/encoders", "--reason", "test")...)
	wantCode(t, r, 0)
	if !strings.Contains(r.stdout, "permit") || !strings.Contains(r.stdout, "revoked") {
		t.Fatalf("revoke --permit: %q", r.stdout)
	}
	select {
	case <-p.Lost():
	case <-time.After(40 * time.Second):
		t.Fatal("the revoked permit's lease was never lost")
	}
}
