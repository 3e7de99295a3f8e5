package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

// Tests of what a hostile or broken caller can do: every path by which a
// request could change lock state outside the contract is closed.

// leaseRecord reads the record at resource's lease key from the stream
// leader (not a direct get, which a lagging replica may answer).
func leaseRecord(t *testing.T, env *testenv.Env, resource string) (*streams.Record, uint64) {
	t.Helper()
	m := lastWrite(t, env, resource)
	rec, err := streams.ParseLease(m.Data, m.Sequence)
	if err != nil {
		t.Fatalf("record of %s at %d: %v (%q)", resource, m.Sequence, err, m.Data)
	}
	return rec, m.Sequence
}

// lastWrite reads the last write of resource's lease key from the stream
// leader, as an inspector.
func lastWrite(t *testing.T, env *testenv.Env, resource string) *jetstream.RawStreamMsg {
	t.Helper()
	js, err := jetstream.New(env.ConnectAs(devcluster.Inspector))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(context.Background(), streams.StreamName(streams.DefaultBucket))
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(context.Background(), streams.SubjectPrefix(streams.DefaultBucket)+streams.LeaseKey(resource))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A reply subject is the caller's choice: a request whose reply subject
// starts with '$' or lies under the service's prefix is dropped (and
// counted) before any work, so no reply — success or error — can land on
// a lease key. The service here answers through a connection that could
// write the bucket (an admin's), as one without deploy/'s permissions
// would: only its own check protects the victim. The attacker is an
// operator, who may publish in the service's account.
func TestReplySubjectCannotWriteTheBucket(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	env.ServeOn(env.ConnectAs(devcluster.Admin), env.ConnectAs(devcluster.Admin), cfg)
	victim := caller{t: t, nc: env.Connect()}
	held := victim.mustAcquire("victim", "a", 30000)
	before, rev := leaseRecord(t, env, "victim")

	attacker := caller{t: t, nc: env.ConnectAs(devcluster.Admin)}
	x := attacker.mustAcquire("x", "attacker", 30000)
	onVictim := streams.SubjectPrefix(streams.DefaultBucket) + streams.LeaseKey("victim")
	attacks := []struct {
		op, reply string
		body      any
	}{
		{streams.OpRenew, onVictim, streams.RenewRequest{Resource: "x", LeaseID: x.LeaseID}},
		{streams.OpRenew, onVictim, `{"resource":"x"}`}, // an error reply
		{streams.OpStatus, "$JS.API.STREAM.PURGE." + streams.StreamName(streams.DefaultBucket), streams.StatusRequest{Resource: "x"}},
		{streams.OpStatus, streams.Subject(streams.DefaultPrefix, streams.OpRelease), streams.StatusRequest{Resource: "x"}},
		{streams.OpStatus, "jetlock.wake.someone.else", streams.StatusRequest{Resource: "x"}},
	}
	for _, a := range attacks {
		data, ok := a.body.(string)
		if !ok {
			b, _ := json.Marshal(a.body)
			data = string(b)
		}
		if err := attacker.nc.PublishRequest(streams.Subject(streams.DefaultPrefix, a.op), a.reply, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return testenv.Metric(t, reg, "jetlock_requests_refused_total", map[string]string{"reason": "reply_subject"}) == float64(len(attacks))
	}, "the %d attacks counted as refused", len(attacks))

	if released, _ := attacker.release("victim", x.LeaseID); released {
		t.Fatal("the attacker released the victim's lease with its own lease id")
	}
	after, afterRev := leaseRecord(t, env, "victim")
	if afterRev != rev || after.LeaseID != before.LeaseID || after.RequestID != "a" {
		t.Fatalf("the victim's record changed: revision %d → %d, %+v", rev, afterRev, after)
	}
	if st := victim.status("victim"); !st.Held || st.Token != held.Token {
		t.Fatalf("victim's status after the attack: %+v", st)
	}
	if _, rep := victim.renew("victim", held.LeaseID, 30000); rep.errCode != "" {
		t.Fatalf("the victim's renewal after the attack: %s %s", rep.errCode, rep.err.Message)
	}
}

// Through the normal path a caller's reply subject never even reaches the
// service: callers live in an account of their own, and the import maps
// their reply subjects, so a "$KV..." reply lands in the caller's own
// account, where there is no bucket.
func TestCallerReplySubjectStaysInTheCallersAccount(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	victim := caller{t: t, nc: env.Connect()}
	held := victim.mustAcquire("victim", "a", 30000)
	_, rev := leaseRecord(t, env, "victim")
	attacker := caller{t: t, nc: env.Connect()}
	x := attacker.mustAcquire("x", "attacker", 30000)
	body, _ := json.Marshal(streams.RenewRequest{Resource: "x", LeaseID: x.LeaseID})
	onVictim := streams.SubjectPrefix(streams.DefaultBucket) + streams.LeaseKey("victim")
	if err := attacker.nc.PublishRequest(streams.Subject(streams.DefaultPrefix, streams.OpRenew), onVictim, body); err != nil {
		t.Fatal(err)
	}
	// The renewal itself was served (its reply went nowhere).
	var st streams.StatusResponse
	testenv.Eventually(t, 30*time.Second, func() bool {
		st = attacker.status("x")
		return st.Held && st.ExpiresAt != x.ExpiresAt
	}, "the attacker's renewal served: %+v, granted %+v", &st, x)
	if _, afterRev := leaseRecord(t, env, "victim"); afterRev != rev {
		t.Fatalf("the victim's record moved from revision %d to %d", rev, afterRev)
	}
	if _, rep := victim.renew("victim", held.LeaseID, 30000); rep.errCode != "" {
		t.Fatalf("the victim's renewal: %s", rep.errCode)
	}
}

// A value under lease. that is not a complete jetlock record is nobody's
// lease: status shows the resource free, no lease id renews or releases
// it, and an acquire is refused until the value has stood for the longest
// TTL (plus grace) since the instance first saw it, then wins by
// compare-and-set over it, with a larger token. It never wedges the key.
func TestForeignValuesAreNobodysLease(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	cfg.MinTTL, cfg.DefaultTTL, cfg.MaxTTL = time.Second, time.Second, 2*time.Second
	cfg.HandoverTTL = time.Second
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	js, err := jetstream.New(env.ConnectAs(devcluster.Store))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), streams.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{
		"f/json":     `not json`,
		"f/ttl0":     `{"lease_id":"x","request_id":"r","ttl_ms":0}`,
		"f/ttl-huge": `{"lease_id":"x","request_id":"r","ttl_ms":9223372036854775807}`,
		"f/token":    `{"lease_id":"x","request_id":"r","ttl_ms":1000,"token":999999999}`,
		"f/no-id":    `{"request_id":"r","ttl_ms":1000}`,
		"f/no-req":   `{"lease_id":"x","ttl_ms":1000}`,
		"f/waiter":   `{"request_id":"r","ttl_ms":1000,"wake":"jetlock.wake.i.h"}`,
	}
	revs := map[string]uint64{}
	// The service counts a foreign value's TTL from when it saw it, after
	// it was written: an answer received before MaxTTL from here was
	// decided while the value still stood.
	written := time.Now()
	for res, v := range values {
		rev, err := kv.Put(context.Background(), streams.LeaseKey(res), []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		revs[res] = rev
	}
	for res := range values {
		if st := c.status(res); st.Held || st.Token != 0 {
			t.Fatalf("%s: status %+v, want free", res, st)
		}
		if _, rep := c.renew(res, "x", 1000); rep.errCode != streams.CodeLeaseLost {
			t.Fatalf("%s: renew answered %q, want lease_lost", res, rep.errCode)
		}
		if released, rep := c.release(res, "x"); released || rep.errCode != "" {
			t.Fatalf("%s: release answered %v %q, want released:false", res, released, rep.errCode)
		}
		_, rep := c.acquire(streams.AcquireRequest{Resource: res, RequestID: "early"})
		if rep.errCode == "" && time.Since(written) >= cfg.MaxTTL {
			// Too late to tell: the test was slower than the TTL.
			t.Logf("%s: the early acquire came %v after the foreign value was written", res, time.Since(written))
			continue
		}
		if rep.errCode != streams.CodeLocked {
			t.Fatalf("%s: acquire right away answered %q, want locked until the longest TTL has passed", res, rep.errCode)
		}
	}
	for res := range values {
		var l streams.LeaseResponse
		testenv.Eventually(t, cfg.MaxTTL+cfg.ExpiryGrace+30*time.Second, func() bool {
			var rep reply
			l, rep = c.acquire(streams.AcquireRequest{Resource: res, RequestID: "later"})
			return rep.errCode == ""
		}, "%s taken over after the longest TTL", res)
		if l.Token <= revs[res] {
			t.Fatalf("%s: token %d not above the foreign value's revision %d", res, l.Token, revs[res])
		}
	}
	if n := testenv.Metric(t, reg, "jetlock_foreign_records_total", nil); n < float64(len(values)) {
		t.Fatalf("%v foreign values reported, want at least %d", n, len(values))
	}
}

// Numbers are bounds-checked before any arithmetic: a ttl_ms or wait_ms
// whose milliseconds overflow a duration (one wrapped to exactly 30s) is
// invalid_request, and nothing changes.
func TestOverflowingNumbersAreInvalid(t *testing.T) {
	env, c := setup(t)
	for _, body := range []string{
		`{"resource":"n/1","request_id":"r","ttl_ms":288230376151741744}`,
		`{"resource":"n/1","request_id":"r","ttl_ms":9223372036854775807}`,
		`{"resource":"n/1","request_id":"r","ttl_ms":-1}`,
		`{"resource":"n/1","request_id":"r","wait_ms":288230376151741744}`,
		`{"resource":"n/1","request_id":"r","wait_ms":9223372036854775807}`,
		`{"resource":"n/1","request_id":"r","wait_ms":-5}`,
		`{"resource":"n/1","request_id":"r","max_hold_ms":9223372036854775807}`,
		`{"resource":"n/1","request_id":"r","max_hold_ms":288230376151741744}`,
		`{"resource":"n/1","request_id":"r","max_hold_ms":1}`,
	} {
		if rep := c.send(streams.OpAcquire, body); rep.errCode != streams.CodeInvalidRequest {
			t.Errorf("acquire %s answered %q, want invalid_request", body, rep.errCode)
		}
	}
	l := c.mustAcquire("n/2", "r", 60000)
	for _, ttl := range []string{"288230376151741744", "9223372036854775807", "-1"} {
		body := fmt.Sprintf(`{"resource":"n/2","lease_id":%q,"ttl_ms":%s}`, l.LeaseID, ttl)
		if rep := c.send(streams.OpRenew, body); rep.errCode != streams.CodeInvalidRequest {
			t.Errorf("renew %s answered %q, want invalid_request", body, rep.errCode)
		}
	}
	if st := c.status("n/1"); st.Held {
		t.Fatalf("a refused acquire changed the lock: %+v", st)
	}
	if st := c.status("n/2"); st.ExpiresAt != l.ExpiresAt {
		t.Fatalf("a refused renewal changed the lease: %+v, granted %+v", st, l)
	}
	_ = env
}

// A retried request_id is the same logical acquire only from the same
// owner: another owner reusing it is answered locked, never handed the
// lease.
func TestRetryByAnotherOwnerIsLocked(t *testing.T) {
	_, c := setup(t)
	first, rep := c.acquire(streams.AcquireRequest{Resource: "ro/1", RequestID: "shared", Owner: "alice"})
	if rep.errCode != "" {
		t.Fatal(rep.errCode)
	}
	_, rep = c.acquire(streams.AcquireRequest{Resource: "ro/1", RequestID: "shared", Owner: "mallory"})
	if rep.errCode != streams.CodeLocked || rep.err.Holder == nil || rep.err.Holder.Owner != "alice" {
		t.Fatalf("retry by another owner answered %q %+v, want locked by alice", rep.errCode, rep.err)
	}
	again, rep := c.acquire(streams.AcquireRequest{Resource: "ro/1", RequestID: "shared", Owner: "alice"})
	if rep.errCode != "" || again.LeaseID != first.LeaseID || again.Token != first.Token {
		t.Fatalf("retry by the same owner: %+v %q, want the same lease", again, rep.errCode)
	}
}

// A stream recreated (or restored) behind a running service at a lower
// sequence must not hand out tokens that went backwards: the service
// notices the sequence below its high-water mark, forgets what it knew,
// and refuses grants until the stream is above the mark again; then the
// tokens continue above every earlier one.
func TestStreamRecreatedBehindTheServiceRefusesGrants(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	var top uint64
	for i := range 20 {
		l := c.mustAcquire(fmt.Sprintf("rb/%d", i), "r", 30000)
		top = max(top, l.Token)
	}
	js, err := jetstream.New(env.ConnectAs(devcluster.Store))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	hwMark := func() uint64 {
		hw, err := streams.LoadHighWater(ctx, js, streams.DefaultBucket)
		if err != nil {
			t.Fatal(err)
		}
		return hw
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return hwMark() >= top }, "the high-water mark recorded")
	name := streams.StreamName(streams.DefaultBucket)
	if err := js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, streams.BucketConfig{}.StreamConfig(1)); err != nil {
		t.Fatal(err)
	}
	// Every acquire now is refused (or, before the service noticed, its
	// grant is not handed out): no token at or below the mark.
	refused := 0
	for i := range 10 {
		l, rep := c.acquire(streams.AcquireRequest{Resource: fmt.Sprintf("after/%d", i), RequestID: "r"})
		switch {
		case rep.errCode == streams.CodeUnavailable:
			refused++
		case rep.errCode == "" && l.Token <= top:
			t.Fatalf("granted token %d on the recreated stream, at or below the earlier %d", l.Token, top)
		case rep.errCode != "":
			t.Fatalf("acquire on the recreated stream: %s %s", rep.errCode, rep.err.Message)
		}
	}
	if refused == 0 {
		t.Fatal("no acquire was refused on a stream below the high-water mark")
	}
	// The operator puts it right: the stream starts above the mark.
	if err := js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, streams.BucketConfig{}.StreamConfig(hwMark()+streams.RecreateGap)); err != nil {
		t.Fatal(err)
	}
	var l streams.LeaseResponse
	testenv.Eventually(t, 30*time.Second, func() bool {
		var rep reply
		l, rep = c.acquire(streams.AcquireRequest{Resource: "fixed", RequestID: "r"})
		return rep.errCode == ""
	}, "grants resume once the stream is above the mark")
	if l.Token <= top {
		t.Fatalf("token %d after the repair, not above the earlier %d", l.Token, top)
	}
}

// The service refuses to serve on one connection passed twice: its
// replies would then be published with the rights that write the bucket.
func TestOneConnectionForBothIsRefused(t *testing.T) {
	env := testenv.Start(t)
	nc := env.ConnectAs(devcluster.Store)
	if _, err := service.New(nc, nc, testenv.Config()); !errors.Is(err, service.ErrInvalidConfig) || !strings.Contains(err.Error(), "two connections") {
		t.Fatalf("one connection for both: %v", err)
	}
	var none *nats.Conn
	if _, err := service.New(nc, none, testenv.Config()); !errors.Is(err, service.ErrInvalidConfig) {
		t.Fatalf("no store connection: %v", err)
	}
}
