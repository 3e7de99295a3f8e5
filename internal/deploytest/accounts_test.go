package deploytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

func errorsIsPermission(err error) bool { return errors.Is(err, nats.ErrPermissionViolation) }

var (
	bucketStream = streams.StreamName(streams.DefaultBucket)
	kvPrefix     = streams.SubjectPrefix(streams.DefaultBucket)
)

// deploy/'s account setup, started for real: three servers from
// deploy/nats's files (mutual TLS on clients and routes, a throw-away CA),
// the service as its two deploy users. What each kind of user of
// deploy/README.md's table "The users" can and cannot do.
func TestAccountSetup(t *testing.T) {
	c := startCluster(t)
	svc := c.serve()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	orders := c.connect("orders", "")
	billing := c.connect("billing", "")
	operator := c.connect("operator", "")
	inspector := c.connect("inspector", "")
	cl := newClient(t, orders)

	t.Run("caller uses the contract", func(t *testing.T) {
		// A TTL that no stall of a busy machine outlasts between two
		// renewals: losing the lease here would say nothing of the
		// accounts.
		l, err := cl.TryAcquire(ctx, "deploy/1", client.TTL(6*time.Second), client.Owner("orders"))
		if err != nil {
			t.Fatal(err)
		}
		first := l.Expires()
		// The client renews at a third of the TTL.
		testenv.Eventually(t, 30*time.Second, func() bool { return l.Expires().After(first) }, "the lease renewed")
		select {
		case <-l.Lost():
			t.Fatal("lease lost while renewing")
		default:
		}
		st, err := cl.Status(ctx, "deploy/1")
		if err != nil || !st.Held || st.Token != l.Token() || st.Owner != "orders" {
			t.Fatalf("status %+v %v, want held by orders with token %d", st, err, l.Token())
		}
		found := false
		for s, err := range cl.List(ctx, "deploy/") {
			if err != nil {
				t.Fatal(err)
			}
			found = found || s.Resource == "deploy/1" && s.Token == l.Token()
		}
		if !found {
			t.Fatal("list does not show deploy/1")
		}
		// A waiting acquire of another caller gets the lock when it is
		// released (wake subjects, waiter records).
		got := make(chan error, 1)
		go func() {
			w, err := newClient(t, billing).Acquire(ctx, "deploy/1", client.Wait(60*time.Second), client.Owner("billing"))
			if err == nil {
				if w.Token() <= l.Token() {
					err = errors.New("waiter's token not above the holder's")
				}
				_ = w.Release(ctx)
			}
			got <- err
		}()
		testenv.Eventually(t, 30*time.Second, func() bool {
			st, err := cl.Status(ctx, "deploy/1")
			return err == nil && st.Waiters == 1
		}, "billing waits")
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("waiting acquire: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the waiter was not granted in 60s")
		}
		if st, err := cl.Status(ctx, "deploy/1"); err != nil || st.Held {
			t.Fatalf("status after release %+v %v", st, err)
		}
	})

	t.Run("callers and operators use sessions through the imports", func(t *testing.T) {
		req := func(cc *conn, op string, body any) *nats.Msg {
			t.Helper()
			b, err := json.Marshal(body)
			if err != nil {
				t.Fatal(err)
			}
			m, err := cc.RequestWithContext(ctx, streams.Subject(streams.DefaultPrefix, op), b)
			if err != nil {
				t.Fatalf("%s as %s: %v", op, cc.role, err)
			}
			return m
		}
		decode := func(m *nats.Msg, v any) {
			t.Helper()
			if code := m.Header.Get("Nats-Service-Error-Code"); code != "" {
				t.Fatalf("%s: error %s %s", m.Subject, code, msgData(m))
			}
			if err := json.Unmarshal(m.Data, v); err != nil {
				t.Fatalf("%s: %v", msgData(m), err)
			}
		}
		var open streams.SessionResponse
		decode(req(orders, streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: "deploy-s1", Owner: "orders-worker"}), &open)
		var grant streams.LeaseResponse
		decode(req(orders, streams.OpAcquire, streams.AcquireRequest{Resource: "deploy/session", RequestID: "deploy-s1-r1", SessionID: open.SessionID}), &grant)
		var kept streams.KeepaliveResponse
		decode(req(orders, streams.OpSessionKeepalive, streams.SessionKeepaliveRequest{SessionID: open.SessionID}), &kept)
		if kept.Leases != 1 {
			t.Fatalf("keepalive %+v, want 1 lease", kept)
		}
		// The server stamps who sends: another caller holding the id
		// cannot keep the session alive or close it.
		if m := req(billing, streams.OpSessionKeepalive, streams.SessionKeepaliveRequest{SessionID: open.SessionID}); m.Header.Get("Nats-Service-Error-Code") != "410" {
			t.Fatalf("billing kept orders' session alive: %s", msgData(m))
		}
		var closed streams.SessionCloseResponse
		decode(req(billing, streams.OpSessionClose, streams.SessionCloseRequest{SessionID: open.SessionID}), &closed)
		if closed.Closed {
			t.Fatal("billing closed orders' session")
		}
		var st streams.StatusResponse
		decode(req(orders, streams.OpStatus, streams.StatusRequest{Resource: "deploy/session"}), &st)
		if !st.Held || st.Token != grant.Token || !st.InSession || st.SessionOwner != "orders-worker" {
			t.Fatalf("status %+v, want held in orders' session with token %d", st, grant.Token)
		}
		decode(req(orders, streams.OpSessionClose, streams.SessionCloseRequest{SessionID: open.SessionID}), &closed)
		if !closed.Closed || closed.Released != 1 {
			t.Fatalf("close %+v, want closed with 1 lease released", closed)
		}
		// An operator reaches the session subjects through its own imports.
		decode(req(operator, streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: "deploy-s2"}), &open)
		decode(req(operator, streams.OpSessionClose, streams.SessionCloseRequest{SessionID: open.SessionID}), &closed)
		if !closed.Closed {
			t.Fatalf("operator's close %+v", closed)
		}
	})

	t.Run("caller cannot reach the bucket or the JetStream API", func(t *testing.T) {
		cc := c.connect("orders", "")
		victim := kvPrefix + streams.LeaseKey("deploy/1")
		tries := []struct{ what, kind, subject string }{
			{"write a lease record", "Publish", victim},
			{"purge the bucket", "Publish", "$JS.API.STREAM.PURGE." + bucketStream},
			{"read a lease record", "Publish", "$JS.API.DIRECT.GET." + bucketStream + "." + victim},
			{"read the stream leader's record", "Publish", "$JS.API.STREAM.MSG.GET." + bucketStream},
			{"call the JetStream API", "Publish", "$JS.API.INFO"},
			{"call admin.revoke", "Publish", streams.Subject(streams.DefaultPrefix, streams.OpRevoke)},
		}
		for _, tr := range tries {
			if err := cc.PublishRequest(tr.subject, cc.NewRespInbox(), []byte(`{"resource":"deploy/1","reason":"x"}`)); err != nil {
				t.Fatal(err)
			}
			cc.violation(t, tr.what, tr.kind, tr.subject)
		}
		if _, err := cc.SubscribeSync(kvPrefix + ">"); err != nil {
			t.Fatal(err)
		}
		cc.violation(t, "watch the bucket", "Subscription", kvPrefix+">")
		// Through the jetstream API as a program would: no answer.
		js, err := jetstream.New(cc.Conn)
		if err != nil {
			t.Fatal(err)
		}
		jctx, jcancel := context.WithTimeout(ctx, 2*time.Second)
		defer jcancel()
		if _, err := js.KeyValue(jctx, streams.DefaultBucket); err == nil {
			t.Fatal("a caller bound the bucket")
		}
		// The client's Revoke finds no service: the subject is neither
		// allowed nor imported.
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		defer rcancel()
		if _, err := newClient(t, cc).Revoke(rctx, "deploy/1", "caller tries"); err == nil {
			t.Fatal("a caller revoked")
		}
	})

	t.Run("caller cannot see other callers' replies or serve requests", func(t *testing.T) {
		cc := c.connect("orders", "")
		for _, subj := range []string{"_INBOX_billing.>", "_INBOX.>", "_R_.>", streams.Subject(streams.DefaultPrefix, streams.OpAcquire)} {
			if _, err := cc.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			cc.violation(t, "subscribe "+subj, "Subscription", subj)
		}
		acq := streams.Subject(streams.DefaultPrefix, streams.OpAcquire)
		if _, err := cc.QueueSubscribeSync(acq, streams.QueueGroup); err != nil {
			t.Fatal(err)
		}
		cc.violation(t, "join the jetlock queue group", "Subscription", acq)
		// and billing's replies keep reaching billing alone
		if _, err := newClient(t, billing).Status(ctx, "deploy/1"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("operator revokes, inspector inspects read only", func(t *testing.T) {
		l, err := cl.TryAcquire(ctx, "deploy/revoke", client.TTL(9*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(inspector.Conn)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, streams.DefaultBucket)
		if err != nil {
			t.Fatalf("inspector binds the bucket: %v", err)
		}
		// kv.Get is a direct get, which any replica answers: one that
		// has not applied the grant yet answers "not found" for a moment.
		var getErr error
		defer func() {
			if t.Failed() && getErr != nil {
				t.Logf("last read: %v", getErr)
			}
		}()
		testenv.Eventually(t, 30*time.Second, func() bool {
			var e jetstream.KeyValueEntry
			if e, getErr = kv.Get(ctx, streams.LeaseKey("deploy/revoke")); getErr != nil {
				return false
			}
			rec, err := streams.ParseLease(e.Value(), e.Revision())
			if err != nil || rec.LeaseID != l.ID() {
				getErr = fmt.Errorf("record %+v %v, want lease %s", rec, err, l.ID())
				return false
			}
			return true
		}, "inspector reads the lease record")
		st, err := js.Stream(ctx, bucketStream)
		if err != nil {
			t.Fatalf("inspector's stream info: %v", err)
		}
		if info := st.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("stream info: replicas %d, cluster %+v", info.Config.Replicas, info.Cluster)
		}
		// nats micro stats jetlock works for inspectors.
		m, err := inspector.RequestWithContext(ctx, "$SRV.STATS."+streams.ServiceName, nil)
		if err != nil || !strings.Contains(string(m.Data), `"name":"jetlock"`) {
			t.Fatalf("micro stats as inspector: %v %s", err, msgData(m))
		}
		// An inspector sends no request: inside the service's account
		// nothing stamps who it is.
		if _, err := newClient(t, inspector).Revoke(ctx, "deploy/revoke", "deploytest"); err == nil {
			t.Fatal("the inspector revoked")
		}
		inspector.violation(t, "revoke", "Publish", streams.Subject(streams.DefaultPrefix, streams.OpRevoke))
		// The operator, whose identity the server stamps on its import,
		// revokes.
		rev, err := newClient(t, operator).Revoke(ctx, "deploy/revoke", "deploytest")
		if err != nil || !rev.Revoked || rev.Token != l.Token() {
			t.Fatalf("revoke: %+v %v", rev, err)
		}
		select {
		case <-l.Lost():
		case <-time.After(30 * time.Second):
			t.Fatal("the revoked holder's Lost did not close in 30s")
		}
		// Not write: no put, delete, purge or stream change.
		before, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		defer wcancel()
		if _, err := kv.Put(wctx, streams.LeaseKey("deploy/op"), []byte("x")); err == nil {
			t.Fatal("inspector wrote the bucket")
		}
		inspector.violation(t, "put", "Publish", kvPrefix+streams.LeaseKey("deploy/op"))
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
		defer dcancel()
		if err := kv.Delete(dctx, streams.LeaseKey("deploy/revoke")); err == nil {
			t.Fatal("inspector deleted a key")
		}
		inspector.violation(t, "delete", "Publish", kvPrefix+streams.LeaseKey("deploy/revoke"))
		for _, subj := range []string{"$JS.API.STREAM.PURGE." + bucketStream, "$JS.API.STREAM.DELETE." + bucketStream, "$JS.API.STREAM.UPDATE." + bucketStream, "$JS.API.STREAM.MSG.DELETE." + bucketStream} {
			if err := inspector.PublishRequest(subj, inspector.NewRespInbox(), []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			inspector.violation(t, "call "+subj, "Publish", subj)
		}
		// The operator reaches no JetStream API: its permissions allow only
		// the service's requests, and its account has no JetStream.
		octx, ocancel := context.WithTimeout(ctx, 2*time.Second)
		defer ocancel()
		if ojs, err := jetstream.New(operator.Conn); err == nil {
			if _, err := ojs.KeyValue(octx, streams.DefaultBucket); err == nil {
				t.Fatal("the operator bound the bucket")
			}
		}
		operator.violation(t, "bind the bucket", "Publish", "$JS.API.STREAM.INFO."+bucketStream)
		after, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if after.State.LastSeq < before.State.LastSeq || after.State.Msgs == 0 {
			t.Fatalf("stream state moved from %+v to %+v", before.State, after.State)
		}
	})

	t.Run("reply-subject attack", func(t *testing.T) {
		victim, err := newClient(t, billing).TryAcquire(ctx, "victim", client.TTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer victim.Release(ctx)
		onVictim := kvPrefix + streams.LeaseKey("victim")
		recBefore, seqBefore := leaseRecord(t, ctx, inspector, "victim")

		// A caller renews its own lease with the victim's lease key as
		// reply subject: the renewal is served, and its reply lands in
		// the caller's own account, where there is no bucket.
		x, err := cl.TryAcquire(ctx, "x", client.TTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer x.Release(ctx)
		// The grant's revision, read before the renewal is sent: read
		// after it, it could already be the renewal's.
		_, xSeq := leaseRecord(t, ctx, inspector, "x")
		body, _ := json.Marshal(streams.RenewRequest{Resource: "x", LeaseID: x.ID()})
		if err := orders.PublishRequest(streams.Subject(streams.DefaultPrefix, streams.OpRenew), onVictim, body); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() bool {
			_, s := leaseRecord(t, ctx, inspector, "x")
			return s != xSeq
		}, "the attacker's renewal served")

		// A user of the service's own account, where the reply subject
		// is not mapped (only the service's request user may publish
		// requests there), tries the same: the service's own check drops
		// the request unanswered.
		asService := c.connect("service", "")
		if err := asService.PublishRequest(streams.Subject(streams.DefaultPrefix, streams.OpRenew), onVictim, body); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() bool {
			return testenv.Metric(t, svc.reg, "jetlock_requests_refused_total", map[string]string{"op": streams.OpRenew, "reason": "reply_subject"}) == 1
		}, "the service refused the reply subject")

		// And had it published there, the server would have refused:
		// the service's request user has no right on $KV.
		if err := asService.Publish(onVictim, []byte(`{"lease_id":"mine","request_id":"r","ttl_ms":30000}`)); err != nil {
			t.Fatal(err)
		}
		asService.violation(t, "publish on the victim's lease key", "Publish", onVictim)

		recAfter, seqAfter := leaseRecord(t, ctx, inspector, "victim")
		if seqAfter != seqBefore || recAfter.LeaseID != recBefore.LeaseID || recAfter.LeaseID != victim.ID() {
			t.Fatalf("the victim's record changed: %d %+v → %d %+v", seqBefore, recBefore, seqAfter, recAfter)
		}
		select {
		case <-victim.Lost():
			t.Fatal("the victim lost its lease")
		default:
		}
	})

	t.Run("lockd check as the store user and as an inspector", func(t *testing.T) {
		bin := buildLockd(t)
		// The store user, as lockd serves with; an inspector, read-only,
		// with the inbox prefix its permissions allow.
		for _, run := range []struct {
			role  string
			extra []string
		}{{"store", nil}, {"inspector", []string{"--store-inbox-prefix=_INBOX"}}} {
			code, report, stderr := c.lockdCheck(t, bin, run.role, run.extra...)
			if code != 0 || report["exists"] != true || len(report["drifts"].([]any)) != 0 {
				t.Errorf("lockd check as %s: exit %d, report %v, stderr %s", run.role, code, report, stderr)
			}
		}
	})

	t.Run("mutual TLS and nkeys are required", func(t *testing.T) {
		url := c.servers[0].ClientURL()
		kp := c.keys["orders"]
		pub := c.keys.public(t, "orders")
		cert := c.certs["orders"]
		for what, opts := range map[string][]nats.Option{
			"no client certificate": {nats.RootCAs(c.ca.CertFile), nats.Nkey(pub, kp.Sign)},
			"no nkey":               {nats.RootCAs(c.ca.CertFile), nats.ClientCert(cert.CertFile, cert.KeyFile)},
			"no TLS":                {nats.Nkey(pub, kp.Sign)},
		} {
			nc, err := nats.Connect(url, append(opts, nats.NoReconnect(), nats.Timeout(3*time.Second))...)
			if err == nil {
				nc.Close()
				t.Errorf("connected with %s", what)
			}
		}
	})

	t.Run("a client certificate cannot join the cluster", func(t *testing.T) {
		// A server whose route certificate is a caller's (same CA, no
		// host name) dials nats-a's route port: nats-a refuses it
		// (verify_cert_and_check_known_urls). The control: with a
		// certificate that names the route host, the same server joins.
		dir := filepath.Dir(c.ca.CertFile)
		rogue := func(cert, key string) *server.Server {
			tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cert, KeyFile: key, CaFile: c.ca.CertFile, Verify: true, Timeout: 2})
			if err != nil {
				t.Fatal(err)
			}
			tc.RootCAs = tc.ClientCAs // a route is client and server (as nats-server's parser sets it)
			s, err := server.NewServer(&server.Options{ServerName: "rogue", Host: "127.0.0.1", Port: server.RANDOM_PORT,
				NoLog: true, NoSigs: true,
				Cluster: server.ClusterOpts{Name: "jetlock", Host: "127.0.0.1", Port: server.RANDOM_PORT, TLSConfig: tc, TLSTimeout: 2},
				Routes:  server.RoutesFromStr(fmt.Sprintf("nats-route://localhost:%d", c.servers[0].ClusterAddr().Port))})
			if err != nil {
				t.Fatal(err)
			}
			s.Start()
			return s
		}
		before := c.servers[0].NumRoutes()
		r := rogue(c.certs["orders"].CertFile, c.certs["orders"].KeyFile)
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			// nats-a is what refuses; the rogue counts a route of its own
			// for the moment its handshake is in progress.
			if c.servers[0].NumRoutes() > before {
				t.Errorf("a server with a caller's certificate joined: nats-a has %d routes (was %d)", c.servers[0].NumRoutes(), before)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		r.Shutdown()
		r.WaitForShutdown()
		control := rogue(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"))
		testenv.Eventually(t, 30*time.Second, func() bool { return control.NumRoutes() > 0 }, "the control server (a route certificate) joins")
		control.Shutdown()
		control.WaitForShutdown()
	})

	// The service ran the whole time as deploy/'s users without a single
	// permission error on either connection.
	for _, conn := range []string{"requests", "store"} {
		if n := testenv.Metric(t, svc.reg, "jetlock_permission_errors_total", map[string]string{"conn": conn}); n != 0 {
			t.Errorf("%v permission errors on the service's %s connection", n, conn)
		}
	}
	svc.requests.noViolations(t)
	svc.store.noViolations(t)
	if testenv.Metric(t, svc.reg, "jetlock_ready", nil) != 1 {
		t.Error("the service is not ready")
	}
}

func msgData(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}

func newClient(t *testing.T, cc *conn) *client.Client {
	t.Helper()
	cl, err := client.New(cc.Conn, client.WithRequestTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// leaseRecord reads resource's lease record from the stream leader (the
// STREAM.MSG.GET API, not a direct get, which a lagging replica may
// answer), as an inspector.
func leaseRecord(t *testing.T, ctx context.Context, inspector *conn, resource string) (*streams.Record, uint64) {
	t.Helper()
	req, _ := json.Marshal(map[string]string{"last_by_subj": kvPrefix + streams.LeaseKey(resource)})
	msg, err := inspector.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+bucketStream, req)
	if err != nil {
		t.Fatalf("inspector reads %s from the stream leader: %v", resource, err)
	}
	var resp struct {
		Message *struct {
			Seq  uint64 `json:"seq"`
			Data []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Message == nil {
		t.Fatalf("inspector reads %s from the stream leader: %s %v", resource, msg.Data, err)
	}
	rec, err := streams.ParseLease(resp.Message.Data, resp.Message.Seq)
	if err != nil {
		t.Fatalf("record of %s: %v", resource, err)
	}
	return rec, resp.Message.Seq
}
