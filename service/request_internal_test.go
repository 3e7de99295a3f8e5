package service

import (
	"encoding/json"
	"testing"
	"time"

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
