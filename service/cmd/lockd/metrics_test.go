package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// A workload of every kind of request shows up on /metrics with the
// counts and histogram samples it caused: grants, a renewal, a locked
// answer, a waiter handed the lease on release, a revoke, and a request
// dropped for its reply subject. /healthz answers and /readyz is ready.
func TestMetricsAfterWorkload(t *testing.T) {
	env := testenv.Start(t)
	l := startLockd(t, append(serviceArgs(env), "--metrics", "127.0.0.1:0")...)
	if l.metrics == "" {
		t.Fatalf("no metrics URL in the banner: %s", l.stdout.String())
	}
	if code, body := get(t, l.metrics+"/healthz"); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Fatalf("/healthz = %d %q, want 200 ok", code, body)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { code, _ := get(t, l.metrics+"/readyz"); return code == 200 }, "/readyz not 200")
	env.WaitReachable()

	caller, operator := env.Connect(), env.ConnectAs(devcluster.Operator)
	const res = "orders/1"
	var alice streams.LeaseResponse
	if code := call(t, caller, streams.OpAcquire, streams.AcquireRequest{Resource: res, RequestID: "a1", Owner: "alice", TTLms: 30000}, &alice); code != "" {
		t.Fatalf("acquire: %s", code)
	}
	if code := call(t, caller, streams.OpRenew, streams.RenewRequest{Resource: res, LeaseID: alice.LeaseID}, nil); code != "" {
		t.Fatalf("renew: %s", code)
	}
	if code := call(t, caller, streams.OpAcquire, streams.AcquireRequest{Resource: res, RequestID: "b1", Owner: "bob"}, nil); code != streams.CodeLocked {
		t.Fatalf("second acquire: %q, want locked", code)
	}
	// Carol waits; alice's release hands her the lease in the same write.
	carol := make(chan string, 1)
	var carolLease streams.LeaseResponse
	go func() {
		carol <- call(t, caller, streams.OpAcquire, streams.AcquireRequest{Resource: res, RequestID: "c1", Owner: "carol", WaitMs: 10000}, &carolLease)
	}()
	testenv.Eventually(t, 30*time.Second, func() bool {
		var st streams.StatusResponse
		return call(t, caller, streams.OpStatus, streams.StatusRequest{Resource: res}, &st) == "" && st.Waiters == 1
	}, "carol not waiting")
	var rel streams.ReleaseResponse
	if code := call(t, caller, streams.OpRelease, streams.ReleaseRequest{Resource: res, LeaseID: alice.LeaseID}, &rel); code != "" || !rel.Released {
		t.Fatalf("release: %q %+v", code, rel)
	}
	select {
	case code := <-carol:
		if code != "" || carolLease.Token <= alice.Token {
			t.Fatalf("carol's acquire: %q token %d, want a grant above %d", code, carolLease.Token, alice.Token)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("carol was not granted the lease")
	}
	var rev streams.RevokeResponse
	if code := call(t, operator, streams.OpRevoke, streams.RevokeRequest{Resource: res, Reason: "test"}, &rev); code != "" || !rev.Revoked {
		t.Fatalf("revoke: %q %+v", code, rev)
	}
	// A reply subject the service never publishes on: dropped, counted.
	// (Only a user of the service's own account can name one: an
	// import maps a caller's or operator's reply subject.)
	admin := env.ConnectAs(devcluster.Admin)
	if err := admin.PublishRequest(streams.Subject(streams.DefaultPrefix, streams.OpStatus), "$KV.jetlock.x", []byte(`{"resource":"orders/1"}`)); err != nil {
		t.Fatal(err)
	}

	ok := func(op string) map[string]string { return map[string]string{"op": op, "code": "ok"} }
	const req = "jetlock_requests_total"
	waitFor(t, 30*time.Second, func() string {
		m := scrape(t, l.metrics)
		checks := []struct {
			what string
			have float64
			want float64
		}{
			{"acquire ok", counter(m, req, ok("acquire")), 2},
			{"acquire locked", counter(m, req, map[string]string{"op": "acquire", "code": "locked"}), 1},
			{"renew ok", counter(m, req, ok("renew")), 1},
			{"release ok", counter(m, req, ok("release")), 1},
			{"revoke ok", counter(m, req, ok("admin.revoke")), 1},
			{"acquire latency samples", float64(histCount(m, "jetlock_request_duration_seconds", map[string]string{"op": "acquire"})), 3},
			{"renew latency samples", float64(histCount(m, "jetlock_request_duration_seconds", map[string]string{"op": "renew"})), 1},
			{"hand-overs", counter(m, "jetlock_handovers_total", nil), 1},
			{"hand-over latency samples", float64(histCount(m, "jetlock_handover_duration_seconds", nil)), 1},
			{"revokes", counter(m, "jetlock_revokes_total", nil), 1},
			{"refused reply subjects", counter(m, "jetlock_requests_refused_total", map[string]string{"op": "status", "reason": "reply_subject"}), 1},
			{"ready", counter(m, "jetlock_ready", nil), 1},
		}
		last := ""
		for _, c := range checks {
			if c.have != c.want {
				last += c.what + ": " + ftoa(c.have) + " want " + ftoa(c.want) + "; "
			}
		}
		// Writes: at least the two grants, the renewal, the hand-over and
		// the revoke were committed.
		if n := histCount(m, "jetlock_store_commit_duration_seconds", map[string]string{"op": "put"}) +
			histCount(m, "jetlock_store_commit_duration_seconds", map[string]string{"op": "handover"}) +
			histCount(m, "jetlock_store_commit_duration_seconds", map[string]string{"op": "delete"}); n < 4 {
			last += "store commits: " + ftoa(float64(n)) + " want >= 4; "
		}
		return last
	})
}

func ftoa(f float64) string { b, _ := json.Marshal(f); return string(b) }

// --audit writes one JSON line per grant, renew refusal, release,
// hand-over and revoke, with resource, token, owner, outcome and instance,
// and never a lease id.
func TestAuditLog(t *testing.T) {
	env := testenv.Start(t)
	path := filepath.Join(t.TempDir(), "audit.json")
	l := startLockd(t, append(serviceArgs(env), "--audit", path)...)
	env.WaitReachable()
	caller, operator := env.Connect(), env.ConnectAs(devcluster.Operator)
	var a, b streams.LeaseResponse
	if code := call(t, caller, streams.OpAcquire, streams.AcquireRequest{Resource: "audit/a", RequestID: "r1", Owner: "alice"}, &a); code != "" {
		t.Fatalf("acquire: %s", code)
	}
	if code := call(t, caller, streams.OpRenew, streams.RenewRequest{Resource: "audit/a", LeaseID: "not-the-lease-id-000000000000000"}, nil); code != streams.CodeLeaseLost {
		t.Fatalf("renew with a wrong lease id: %q, want lease_lost", code)
	}
	if code := call(t, caller, streams.OpRelease, streams.ReleaseRequest{Resource: "audit/a", LeaseID: a.LeaseID}, nil); code != "" {
		t.Fatalf("release: %s", code)
	}
	if code := call(t, caller, streams.OpAcquire, streams.AcquireRequest{Resource: "audit/b", RequestID: "r2", Owner: "bob"}, &b); code != "" {
		t.Fatalf("acquire: %s", code)
	}
	if code := call(t, operator, streams.OpRevoke, streams.RevokeRequest{Resource: "audit/b", Reason: "test"}, nil); code != "" {
		t.Fatalf("revoke: %s", code)
	}
	if code := l.shutdown(t); code != 0 {
		t.Fatalf("lockd exited %d: %s", code, l.stderr.String())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("audit file mode %v, %v; want 0600", st.Mode(), err)
	}
	for _, id := range []string{a.LeaseID, b.LeaseID} {
		if bytes.Contains(data, []byte(id)) {
			t.Fatalf("the audit log contains a lease id:\n%s", data)
		}
	}
	type rec struct {
		event, resource, owner, outcome string
		token                           uint64
	}
	var recs []rec
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		for _, k := range []string{"event", "resource", "token", "owner", "outcome", "instance"} {
			if _, ok := m[k]; !ok {
				t.Fatalf("audit line %q lacks %q", line, k)
			}
		}
		if _, ok := m["lease_id"]; ok {
			t.Fatalf("audit line %q has a lease_id", line)
		}
		tok, _ := m["token"].(float64)
		recs = append(recs, rec{m["event"].(string), m["resource"].(string), m["owner"].(string), m["outcome"].(string), uint64(tok)})
	}
	want := []struct {
		event, resource, owner string
		token                  uint64
	}{
		{"grant", "audit/a", "alice", a.Token},
		{"renew_refused", "audit/a", "", 0},
		{"release", "audit/a", "alice", a.Token},
		{"grant", "audit/b", "bob", b.Token},
		{"revoke", "audit/b", "bob", b.Token},
	}
	for _, w := range want {
		found := false
		for _, r := range recs {
			if r.event == w.event && r.resource == w.resource && r.owner == w.owner && (w.token == 0 || r.token == w.token) {
				found = true
			}
		}
		if !found {
			t.Errorf("no audit record %+v in:\n%s", w, data)
		}
	}
}
