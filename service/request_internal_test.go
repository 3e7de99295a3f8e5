package service

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// Tenants of different (account, user) pairs never share a key, whatever
// the names hold: account X with user y/z and account X/y with user z
// are two tenants. Names without '/' or '%' read as before.
func TestTenantKeysAreUnambiguous(t *testing.T) {
	pairs := []origin{
		{account: "X", user: "y/z"}, {account: "X/y", user: "z"},
		{account: "X", user: "y%2Fz"}, {account: "X%2Fy", user: "z"},
		{account: "X/", user: "y"}, {account: "X", user: "/y"},
	}
	seen := map[string]origin{}
	for _, o := range pairs {
		k := o.tenant()
		if prev, ok := seen[k]; ok {
			t.Fatalf("%+v and %+v share tenant %q", prev, o, k)
		}
		seen[k] = o
	}
	if got := (origin{account: "CALLERS", user: "caller"}).tenant(); got != "CALLERS/caller" {
		t.Fatalf("a plain tenant reads %q", got)
	}
}

// A lease of a session has no TTL of its own: the tracker does not
// expire it at its record's ttl_ms (a day at most) while its session
// lives, but at its hold limit, or never without one.
func TestSessionLeaseOutlivesItsRecordTTL(t *testing.T) {
	tr := newTracker(2*time.Second, time.Minute, time.Minute)
	now := time.Now()
	sess := &streams.Record{LeaseID: "secret", Tenant: "A/u", TTLms: 10000}
	setExpiry(sess, now, 10*time.Second, time.Time{})
	tr.observe(streams.SessionKey("h"), entry{rev: 1, rec: sess})

	noCap := newLease(now, "r1", "o", "A/u", time.Minute, time.Time{})
	sessionLease(noCap, now, "h", time.Time{})
	o := tr.observe(streams.LeaseKey("a"), entry{rev: 2, rec: noCap})
	if d := tr.deadline(&o); d.Before(now.Add(365 * 24 * time.Hour)) {
		t.Fatalf("a session's lease without a hold limit is due at %v", d.Sub(now))
	}
	twoDays := now.Add(48 * time.Hour)
	capped := newLease(now, "r2", "o", "A/u", time.Minute, twoDays)
	sessionLease(capped, now, "h", twoDays)
	if capped.TTLms != streams.MaxRecordTTL.Milliseconds() {
		t.Fatalf("the record's ttl_ms %d", capped.TTLms)
	}
	o = tr.observe(streams.LeaseKey("b"), entry{rev: 3, rec: capped})
	if d := tr.deadline(&o).Sub(now); d < 48*time.Hour || d > 48*time.Hour+time.Minute {
		t.Fatalf("a session's lease held for 48 h is due after %v", d)
	}
	// A waiter of a session keeps its own liveness.
	w := &streams.Record{RequestID: "w", Tenant: "A/u", TTLms: 5000, Session: "h"}
	setExpiry(w, now, 5*time.Second, time.Time{})
	o = tr.observe(streams.WaitKey("c", "x"), entry{rev: 4, rec: w})
	if d := tr.deadline(&o).Sub(now); d > 10*time.Second {
		t.Fatalf("a session's waiter record is due after %v", d)
	}
}

// The same against the real cluster: a lease granted in a session by a
// service without a hold cap, with a hold of two days, is due when its
// hold ends, not when its record's day-long ttl_ms would have run out.
func TestSessionLeaseOfTwoDaysIsKeptPastADay(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxHold = 0
	s, req := runInternal(t, cfg)
	var sess streams.SessionResponse
	if err := json.Unmarshal(req(streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: "s", TTLms: 10000}).Data, &sess); err != nil || sess.SessionID == "" {
		t.Fatalf("open: %v %+v", err, sess)
	}
	before := time.Now()
	m := req(streams.OpAcquire, streams.AcquireRequest{Resource: "two/days", RequestID: "l", SessionID: sess.SessionID, MaxHoldMs: (48 * time.Hour).Milliseconds()})
	var l streams.LeaseResponse
	if err := json.Unmarshal(m.Data, &l); err != nil || l.LeaseID == "" {
		t.Fatalf("acquire: %v %s", err, m.Data)
	}
	o, ok := s.tracker.get(streams.LeaseKey("two/days"))
	if !ok || !o.held() {
		t.Fatal("the instance does not know the lease it granted")
	}
	if d := s.tracker.deadline(&o).Sub(before); d < 47*time.Hour {
		t.Fatalf("the lease of a 48 h hold is due after %v", d)
	}
}

// A request's place in the renewal queue and its cost follow what it
// names, all of it: a permit's renewal of a permit held is urgent and
// free; a "set" renewal naming a plain lease's key with 63 others, with
// that lease's id, is neither, and costs as a set of 64; so is a renewal
// naming part of a set.
func TestUrgencyAndCostFollowEveryKeyNamed(t *testing.T) {
	s, req := runInternal(t, DefaultConfig())
	var plain, permit streams.LeaseResponse
	var set streams.SetLeaseResponse
	json.Unmarshal(req(streams.OpAcquire, streams.AcquireRequest{Resource: "a", RequestID: "a"}).Data, &plain)
	json.Unmarshal(req(streams.OpAcquire, streams.AcquireRequest{Resource: "sem", RequestID: "p", Limit: 2}).Data, &permit)
	json.Unmarshal(req(streams.OpAcquire, streams.AcquireRequest{Resources: []string{"x", "y", "z"}, RequestID: "s"}).Data, &set)
	names := []string{"a"}
	for i := 1; i < 64; i++ {
		names = append(names, fmt.Sprintf("o/%d", i))
	}
	for _, tc := range []struct {
		name  string
		body  any
		known bool
		cost  float64
	}{
		{"the plain lease", streams.RenewRequest{Resource: "a", LeaseID: plain.LeaseID}, true, 0},
		{"the permit", streams.RenewRequest{Resource: "sem", Permit: permit.Permit, LeaseID: permit.LeaseID}, true, 0},
		{"the set, whole", streams.RenewRequest{Resources: []string{"z", "y", "x"}, LeaseID: set.LeaseID}, true, 0},
		{"a plain lease as a set of 64", streams.RenewRequest{Resources: names, LeaseID: plain.LeaseID}, false, 32},
		{"part of the set", streams.RenewRequest{Resources: []string{"x", "y"}, LeaseID: set.LeaseID}, false, 2},
		{"a member of the set alone", streams.RenewRequest{Resource: "x", LeaseID: set.LeaseID}, false, 2},
		{"the permit as a lock", streams.RenewRequest{Resource: "sem", LeaseID: permit.LeaseID}, false, 2},
	} {
		data, _ := json.Marshal(tc.body)
		c, err := s.decodeCall(streams.OpRenew, data, origin{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.known != tc.known || (!c.known && c.cost != tc.cost) || c.known && c.due.IsZero() {
			t.Errorf("%s: known %v cost %v due %v, want known %v cost %v", tc.name, c.known, c.cost, c.due, tc.known, tc.cost)
		}
	}
}

// A renewal (a keepalive) is free and urgent only when the holder needs
// it: the lease's first renewal, or one a fifth of its TTL after its last
// write, keeping its value, and one at a time. One sooner, one with a new
// value, or one sent while another free one of the same write is under
// way, costs 2 and waits its turn.
func TestFreeRenewalsAreTheOnesTheLeaseNeeds(t *testing.T) {
	s, req := runInternal(t, DefaultConfig())
	const ttl = 10 * time.Second // a fifth: 2s, longer than any stall between a write and the next check
	var l streams.LeaseResponse
	json.Unmarshal(req(streams.OpAcquire, streams.AcquireRequest{Resource: "e", RequestID: "e", TTLms: ttl.Milliseconds(), Value: "v1"}).Data, &l)
	var sr streams.SessionResponse
	json.Unmarshal(req(streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: "s", TTLms: ttl.Milliseconds()}).Data, &sr)
	renew := func(value string) streams.RenewRequest {
		return streams.RenewRequest{Resource: "e", LeaseID: l.LeaseID, TTLms: ttl.Milliseconds(), Value: value}
	}
	keepalive := streams.SessionKeepaliveRequest{SessionID: sr.SessionID}
	check := func(step, op string, body any, free bool) {
		t.Helper()
		data, _ := json.Marshal(body)
		c, err := s.decodeCall(op, data, origin{})
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if c.known != free || !free && c.cost != 2 || free && c.due.IsZero() {
			t.Errorf("%s: known %v cost %v due %v, want free %v", step, c.known, c.cost, c.due, free)
		}
	}
	check("the first renewal, with the lease's value", streams.OpRenew, renew("v1"), true)
	check("another first renewal while that one is under way", streams.OpRenew, renew(""), false)
	check("a renewal with a new value", streams.OpRenew, renew("v2"), false)
	check("the first keepalive", streams.OpSessionKeepalive, keepalive, true)
	check("another first keepalive while that one is under way", streams.OpSessionKeepalive, keepalive, false)
	for _, m := range []*nats.Msg{req(streams.OpRenew, renew("")), req(streams.OpSessionKeepalive, keepalive)} {
		if code := m.Header.Get(streams.HeaderErrorCode); code != "" {
			t.Fatalf("%s", m.Data)
		}
	}
	renewed := time.Now()
	check("a renewal at once after the last", streams.OpRenew, renew(""), false)
	check("a keepalive at once after the last", streams.OpSessionKeepalive, keepalive, false)
	time.Sleep(time.Until(renewed.Add(ttl / minRenewalGap)))
	check("a renewal a fifth of the TTL after the last", streams.OpRenew, renew(""), true)
	check("another at the same moment", streams.OpRenew, renew(""), false)
	check("a keepalive a fifth of the TTL after the last", streams.OpSessionKeepalive, keepalive, true)
	check("a renewal with a new value, later", streams.OpRenew, renew("v2"), false)
}
