package service_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// list answers the held leases in resource order, filtered by prefix and
// paged with after/next, and never shows a lease id.
func TestListPagesHeldLeasesWithoutLeaseIDs(t *testing.T) {
	_, c := setup(t)
	for i := range 5 {
		c.mustAcquire(fmt.Sprintf("list/a/%d", i), rid(i), 30000)
	}
	c.mustAcquire("list/b/0", "b0", 30000)
	gone := c.mustAcquire("list/a/9", "a9", 30000)
	if ok, _ := c.release("list/a/9", gone.LeaseID); !ok {
		t.Fatal("release list/a/9")
	}
	var got []string
	after := ""
	for page := 0; ; page++ {
		if page > 10 {
			t.Fatal("list does not end")
		}
		r := c.send(streams.OpList, streams.ListRequest{Prefix: "list/a/", After: after, Limit: 2})
		if strings.Contains(string(r.raw), "lease_id") {
			t.Fatalf("list shows a lease id: %s", r.raw)
		}
		var lr streams.ListResponse
		r.decode(t, &lr)
		if len(lr.Leases) > 2 {
			t.Fatalf("page of %d leases, limit 2", len(lr.Leases))
		}
		for _, l := range lr.Leases {
			if l.Token == 0 || l.ExpiresAt == "" {
				t.Fatalf("list entry %+v", l)
			}
			got = append(got, l.Resource)
		}
		if lr.Next == "" {
			break
		}
		after = lr.Next
	}
	if want := "list/a/0 list/a/1 list/a/2 list/a/3 list/a/4"; strings.Join(got, " ") != want {
		t.Fatalf("listed %q, want %q", got, want)
	}
	if r := c.send(streams.OpList, streams.ListRequest{Limit: streams.MaxListLimit + 1}); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("limit above the maximum: %q, want invalid_request", r.errCode)
	}
}

// revoke ends the current lease whoever holds it: the holder's renew is
// lease_lost, and the next grant has a larger token. Callers may not
// revoke; an operator may.
func TestRevokeEvictsTheHolder(t *testing.T) {
	env, c := setup(t)
	op := caller{t: t, nc: env.ConnectAs(devcluster.Operator)}
	l := c.mustAcquire("rv/1", "holder", 30000)

	if _, err := c.try(streams.OpRevoke, streams.RevokeRequest{Resource: "rv/1", Reason: "x"}, time.Second); err == nil {
		t.Fatal("a caller's revoke was answered; callers may not reach admin subjects")
	}
	var rv streams.RevokeResponse
	op.send(streams.OpRevoke, streams.RevokeRequest{Resource: "rv/1", Reason: "stuck job"}).decode(t, &rv)
	if !rv.Revoked || rv.Token != l.Token {
		t.Fatalf("revoke: %+v, want revoked with token %d", rv, l.Token)
	}
	if _, r := c.renew("rv/1", l.LeaseID, 30000); r.errCode != streams.CodeLeaseLost {
		t.Fatalf("the evicted holder's renew: %q, want lease_lost", r.errCode)
	}
	next := c.mustAcquire("rv/1", "next", 30000)
	if next.Token <= l.Token {
		t.Fatalf("token after revoke %d, not above %d", next.Token, l.Token)
	}
	op.send(streams.OpRevoke, streams.RevokeRequest{Resource: "rv/none", Reason: "x"}).decode(t, &rv)
	if rv.Revoked {
		t.Fatalf("revoke of a free resource: %+v", rv)
	}
	if r := op.send(streams.OpRevoke, streams.RevokeRequest{Resource: "rv/1"}); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("revoke without a reason: %q, want invalid_request", r.errCode)
	}
}

// max_hold_ms bounds the whole hold: the grant and status show hold_until,
// no renewal reaches past it, and a renew once it has passed is
// lease_lost. The deployment's cap applies when a request names none.
func TestMaxHoldEndsARenewingLease(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	cfg.MaxHold = time.Minute
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}

	l, r := c.acquire(streams.AcquireRequest{Resource: "mh/1", RequestID: "r1", TTLms: 2000, MaxHoldMs: 3000})
	if r.errCode != "" || l.HoldUntil == "" {
		t.Fatalf("grant with max_hold_ms: %q %s", r.errCode, r.raw)
	}
	hold, err := time.Parse(time.RFC3339Nano, l.HoldUntil)
	if err != nil {
		t.Fatal(err)
	}
	if st := c.status("mh/1"); st.HoldUntil != l.HoldUntil {
		t.Fatalf("status hold_until %q, grant %q", st.HoldUntil, l.HoldUntil)
	}
	for time.Until(hold) > 0 {
		nl, r := c.renew("mh/1", l.LeaseID, 2000)
		if r.errCode == streams.CodeLeaseLost {
			break
		}
		if r.errCode != "" {
			t.Fatalf("renew: %q %s", r.errCode, r.err.Message)
		}
		exp, err := time.Parse(time.RFC3339Nano, nl.ExpiresAt)
		if err != nil {
			t.Fatal(err)
		}
		if exp.After(hold) {
			t.Fatalf("renewed to %v, past the hold limit %v", exp, hold)
		}
		time.Sleep(300 * time.Millisecond)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, r := c.renew("mh/1", l.LeaseID, 2000)
		return r.errCode == streams.CodeLeaseLost
	}, "a renew past the hold limit answered lease_lost")

	// The deployment's cap applies without max_hold_ms, and a larger
	// max_hold_ms is invalid.
	l2, _ := c.acquire(streams.AcquireRequest{Resource: "mh/2", RequestID: "r2"})
	if l2.HoldUntil == "" {
		t.Fatal("no hold_until under the deployment's cap")
	}
	if r := c.send(streams.OpAcquire, streams.AcquireRequest{Resource: "mh/4", RequestID: "r4", MaxHoldMs: 120000}); r.errCode != streams.CodeInvalidRequest {
		t.Fatalf("max_hold_ms above the cap: %q, want invalid_request", r.errCode)
	}
}
