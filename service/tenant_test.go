package service_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// The tests of this file run the least-privilege accounts of deploy/ (the
// dev cluster's): the victim is a caller of account CALLERS, the attacker
// an application of another account (APP), and operators reach the
// service through an import of their own (OPERATORS). Each shows that an
// attack fails and that the honest caller beside it keeps its lease and
// gets its answers.

// Knowing another tenant's request id and owner gives nothing: a "retry"
// of its acquire is answered locked without the lease, and a cancel by its
// request id cancels nothing; the victim's lease stays and renews.
func TestRequestIDIsNoPassword(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	victim := caller{t: t, nc: env.Connect()}
	attacker := caller{t: t, nc: env.ConnectAs(devcluster.App)}

	held, rep := victim.acquire(streams.AcquireRequest{Resource: "t/1", RequestID: "job-1", Owner: "backup", TTLms: 30000})
	if rep.errCode != "" {
		t.Fatalf("victim's acquire: %s", rep.errCode)
	}
	r := attacker.send(streams.OpAcquire, streams.AcquireRequest{Resource: "t/1", RequestID: "job-1", Owner: "backup", TTLms: 30000})
	if r.errCode != streams.CodeLocked || strings.Contains(string(r.raw), held.LeaseID) {
		t.Fatalf("another tenant's retry of the victim's request: %q %s, want locked without the lease", r.errCode, r.raw)
	}
	if r.err.Holder == nil || r.err.Holder.Owner != "" || r.err.Holder.Token != held.Token {
		t.Fatalf("locked shows another tenant %+v: want the token, not the owner", r.err.Holder)
	}
	var cr streams.CancelResponse
	attacker.send(streams.OpCancel, streams.CancelRequest{Resource: "t/1", RequestID: "job-1"}).decode(t, &cr)
	if cr.Cancelled {
		t.Fatal("another tenant cancelled the victim's request")
	}
	if l, rep := victim.renew("t/1", held.LeaseID, 30000); rep.errCode != "" || l.Token != held.Token {
		t.Fatalf("the victim's renewal after the attack: %q %+v", rep.errCode, l)
	}
	// The victim's own retry still finds its lease, and its own cancel
	// still ends it.
	again, rep := victim.acquire(streams.AcquireRequest{Resource: "t/1", RequestID: "job-1", Owner: "backup", TTLms: 30000})
	if rep.errCode != "" || again.LeaseID != held.LeaseID {
		t.Fatalf("the victim's retry: %q, lease %q want %q", rep.errCode, again.LeaseID, held.LeaseID)
	}
	if !victim.cancel("t/1", "job-1", "backup") {
		t.Fatal("the victim's own cancel cancelled nothing")
	}

	// A waiting request likewise: the attacker's cancel of the victim's
	// wait leaves it queued; the victim is granted on release.
	holder := caller{t: t, nc: env.ConnectAs(devcluster.Operator)}
	h := holder.mustAcquire("t/2", "h", 30000)
	wait := victim.acquireAsync(streams.AcquireRequest{Resource: "t/2", RequestID: "job-2", WaitMs: 20000})
	waitForWaiters(t, victim, "t/2", 1)
	attacker.send(streams.OpCancel, streams.CancelRequest{Resource: "t/2", RequestID: "job-2"}).decode(t, &cr)
	if cr.Cancelled {
		t.Fatal("another tenant cancelled the victim's wait")
	}
	if ok, _ := holder.release("t/2", h.LeaseID); !ok {
		t.Fatal("release")
	}
	var granted streams.LeaseResponse
	(<-wait).decode(t, &granted)
	if granted.Token <= h.Token {
		t.Fatalf("the victim's wait got token %d after %d", granted.Token, h.Token)
	}
}

// status, list and locked show a lease's owner to its own tenant and to
// operators only; a caller cannot pass for an operator by setting the
// header the NATS server stamps (the server replaces it on the import).
func TestOwnersShownOnlyToTheirTenantAndOperators(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	owner := caller{t: t, nc: env.Connect()}
	other := caller{t: t, nc: env.ConnectAs(devcluster.App)}
	op := caller{t: t, nc: env.ConnectAs(devcluster.Operator)}
	if _, rep := owner.acquire(streams.AcquireRequest{Resource: "v/1", RequestID: "r1", Owner: "secret-owner"}); rep.errCode != "" {
		t.Fatalf("acquire: %s", rep.errCode)
	}

	for _, c := range []struct {
		name string
		c    caller
		want string
	}{{"owner's tenant", owner, "secret-owner"}, {"another tenant", other, ""}, {"operator", op, "secret-owner"}} {
		if st := c.c.status("v/1"); !st.Held || st.Owner != c.want {
			t.Errorf("%s: status %+v, want owner %q", c.name, st, c.want)
		}
		var lr streams.ListResponse
		c.c.send(streams.OpList, streams.ListRequest{Prefix: "v/"}).decode(t, &lr)
		if len(lr.Leases) != 1 || lr.Leases[0].Owner != c.want {
			t.Errorf("%s: list %+v, want owner %q", c.name, lr.Leases, c.want)
		}
		if strings.Contains(string(c.c.send(streams.OpList, streams.ListRequest{}).raw), "lease_id") {
			t.Errorf("%s: a list reply carries a lease id", c.name)
		}
	}
	// A forged stamp: the caller claims to be the operator.
	forged := nats.NewMsg(streams.Subject(streams.DefaultPrefix, streams.OpStatus))
	forged.Header.Set("Nats-Request-Info", `{"acc":"OPERATORS","user":"operator"}`)
	forged.Data = []byte(`{"resource":"v/1"}`)
	m, err := other.nc.RequestMsg(forged, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var st streams.StatusResponse
	if err := json.Unmarshal(m.Data, &st); err != nil || !st.Held || st.Owner != "" {
		t.Fatalf("status with a forged operator stamp: %s (%v), want the lease without its owner", m.Data, err)
	}
}

// Only an operator whose identity the NATS server stamped revokes: a
// request from inside the service's account (no stamp) is forbidden and
// changes nothing; callers cannot reach the subject at all. The end mark of the revoke
// says why, with the operator's reason, for watch and the audit.
func TestRevokeNeedsAStampedOperator(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	env.Serve(cfg)
	holder := caller{t: t, nc: env.Connect()}
	l := holder.mustAcquire("rv/x", "h", 30000)

	// Inside the service's own account nothing is stamped, and a stamp
	// set there by hand cannot be told from the server's: deploy/ lets no
	// user of that account but the service publish requests. A request
	// from there without a stamp is forbidden.
	inside := env.ConnectAs(devcluster.Admin)
	plain := caller{t: t, nc: inside}
	if r := plain.send(streams.OpRevoke, streams.RevokeRequest{Resource: "rv/x", Reason: "no stamp"}); r.errCode != streams.CodeForbidden || r.status != 403 {
		t.Fatalf("revoke without a stamp: %q %d, want forbidden 403", r.errCode, r.status)
	}
	if _, err := holder.try(streams.OpRevoke, streams.RevokeRequest{Resource: "rv/x", Reason: "caller"}, time.Second); err == nil {
		t.Fatal("a caller reached admin.revoke")
	}
	if l2, rep := holder.renew("rv/x", l.LeaseID, 30000); rep.errCode != "" || l2.Token != l.Token {
		t.Fatalf("the holder's renewal after refused revokes: %q", rep.errCode)
	}
	op := caller{t: t, nc: env.ConnectAs(devcluster.Operator)}
	var rv streams.RevokeResponse
	op.send(streams.OpRevoke, streams.RevokeRequest{Resource: "rv/x", Reason: "stuck job"}).decode(t, &rv)
	if !rv.Revoked || rv.Token != l.Token {
		t.Fatalf("the operator's revoke: %+v", rv)
	}
	mark := endMark(t, env, "rv/x")
	if mark.Why != streams.EndRevoke || mark.Reason != "stuck job" || mark.RequestID != "h" {
		t.Fatalf("end mark %+v, want why revoke, the reason and the request", mark)
	}
	if n := testenv.Metric(t, reg, "jetlock_requests_total", map[string]string{"op": "admin.revoke", "code": "forbidden"}); n != 1 {
		t.Errorf("jetlock_requests_total{op=admin.revoke,code=forbidden} = %v, want 1", n)
	}
}

// endMark reads the delete marker that ended resource's last lease.
func endMark(t *testing.T, env *testenv.Env, resource string) *streams.EndMark {
	t.Helper()
	m := lastWrite(t, env, resource)
	mark := streams.DecodeEndMark(m.Data)
	if mark == nil {
		t.Fatalf("last write of %s is no end mark: %q", resource, m.Data)
	}
	return mark
}

// A body over the cap is refused before it is decoded, and changes
// nothing; a request without a reply subject is not executed (and is
// counted); whitespace JSON does not allow around the body is malformed.
func TestOversizedAndUnanswerableRequestsChangeNothing(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}

	padded := `{"resource":"big/1","request_id":"r1","owner":"me"}` + strings.Repeat(" ", 900_000)
	if r := c.send(streams.OpAcquire, padded); r.errCode != streams.CodeInvalidRequest || !strings.Contains(r.err.Message, strconv.Itoa(streams.MaxRequestBytes(cfg.MaxSetSize))) {
		t.Fatalf("a 900 KB acquire: %q %s, want invalid_request naming the cap", r.errCode, r.err.Message)
	}
	if st := c.status("big/1"); st.Held {
		t.Fatal("an oversized acquire was granted")
	}
	for _, ws := range []string{"\v", "\f", "\u00a0", "\u0085"} {
		if r := c.send(streams.OpAcquire, `{"resource":"ws/1","request_id":"r1"}`+ws); r.errCode != streams.CodeInvalidRequest {
			t.Fatalf("a body ending in %q: %q, want invalid_request", ws, r.errCode)
		}
	}
	if st := c.status("ws/1"); st.Held {
		t.Fatal("a malformed acquire was granted")
	}

	data, _ := json.Marshal(streams.AcquireRequest{Resource: "noreply/1", RequestID: "r1"})
	if err := c.nc.Publish(streams.Subject(streams.DefaultPrefix, streams.OpAcquire), data); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return testenv.Metric(t, reg, "jetlock_requests_refused_total", map[string]string{"op": "acquire", "reason": "no_reply"}) == 1
	}, "the acquire without a reply subject counted as refused")
	if st := c.status("noreply/1"); st.Held {
		t.Fatal("an acquire without a reply subject was executed")
	}
}

// A tenant flooding every kind of request (cancels of random ids, renews
// of bogus leases, list pages, statuses) is held to its fair-use rate and
// answered unavailable with retry_after_ms, while another tenant beside it
// acquires, renews and releases without a refusal; the flooder's own
// renewals of a lease it holds, sent as the clients send them (a third of
// the TTL after the last), are never refused for its rate.
func TestFairUseCoversEveryOperation(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	// A burst of 10, and a rate that 200 requests outrun unless each
	// takes 190ms: far slower than any busy machine.
	cfg.UserRate = 5
	env.Serve(cfg)
	noisy := caller{t: t, nc: env.ConnectAs(devcluster.App)}
	honest := caller{t: t, nc: env.ConnectAs(devcluster.Operator)}
	const ownTTL = 3 * time.Second
	mine := noisy.mustAcquire("noisy/own", "own", ownTTL.Milliseconds())
	renewed := time.Now()

	ops := []func(i int) reply{
		func(i int) reply {
			return noisy.send(streams.OpCancel, streams.CancelRequest{Resource: fmt.Sprintf("n/%d", i), RequestID: fmt.Sprintf("x%d", i)})
		},
		func(i int) reply {
			return noisy.send(streams.OpRenew, streams.RenewRequest{Resource: fmt.Sprintf("n/%d", i), LeaseID: "00000000000000000000000000000000"})
		},
		func(int) reply { return noisy.send(streams.OpList, streams.ListRequest{Limit: 1000}) },
		func(i int) reply {
			return noisy.send(streams.OpStatus, streams.StatusRequest{Resource: fmt.Sprintf("n/%d", i)})
		},
	}
	for k, op := range ops {
		refused := false
		for i := 0; i < 200 && !refused; i++ {
			r := op(i)
			refused = r.errCode == streams.CodeUnavailable && r.err.RetryAfterMs > 0 && strings.Contains(r.err.Message, "fair use")
		}
		if !refused {
			t.Fatal("a flood of 200 requests of one kind was never refused for fair use")
		}
		// The honest tenant beside it.
		l := honest.mustAcquire("h/1", fmt.Sprintf("h%d", k), 30000)
		if _, rep := honest.renew("h/1", l.LeaseID, 30000); rep.errCode != "" {
			t.Fatalf("the honest tenant's renewal: %q %s", rep.errCode, rep.err.Message)
		}
		if ok, rep := honest.release("h/1", l.LeaseID); !ok || rep.errCode != "" {
			t.Fatalf("the honest tenant's release: %q", rep.errCode)
		}
		// The flooder's own lease renews although it is over its rate.
		time.Sleep(time.Until(renewed.Add(ownTTL / 3)))
		if _, rep := noisy.renew("noisy/own", mine.LeaseID, ownTTL.Milliseconds()); rep.errCode != "" {
			t.Fatalf("the flooder's renewal of its own lease: %q %s", rep.errCode, rep.err.Message)
		}
		renewed = time.Now()
	}
}
