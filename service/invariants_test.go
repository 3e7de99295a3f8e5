package service_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/service"
	"github.com/jetlock/jetlock/streams"
)

// Invariant 2: tokens strictly increase per resource, over many grants,
// across a service restart and across a stream leader change.
func TestTokensStrictlyIncrease(t *testing.T) {
	env := testenv.Start(t)
	inst := env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	var last uint64
	grant := func(i int) {
		l := c.mustAcquire("one/resource", rid(i), 5000)
		if l.Token <= last {
			t.Fatalf("grant %d: token %d not above %d", i, l.Token, last)
		}
		last = l.Token
		if ok, _ := c.release("one/resource", l.LeaseID); !ok {
			t.Fatalf("release %d failed", i)
		}
	}
	for i := 0; i < 1000; i++ {
		grant(i)
	}
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	env.Serve(testenv.Config())
	for i := 1000; i < 1050; i++ {
		grant(i)
	}
	if err := env.Cluster.StepDown(streams.StreamName(streams.DefaultBucket)); err != nil {
		t.Fatal(err)
	}
	for i := 1050; i < 1100; i++ {
		grant(i)
	}

	// Many resources, concurrently: per-resource order and global
	// uniqueness.
	var mu sync.Mutex
	seen := map[uint64]string{}
	var wg sync.WaitGroup
	for r := 0; r < 50; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := fmt.Sprintf("many/%d", r)
			var prev uint64
			for i := 0; i < 10; i++ {
				l, rep := c.acquire(streams.AcquireRequest{Resource: res, RequestID: rid(i), TTLms: 5000})
				if rep.errCode != "" {
					t.Errorf("%s: %s", res, rep.errCode)
					return
				}
				if l.Token <= prev {
					t.Errorf("%s: token %d not above %d", res, l.Token, prev)
				}
				prev = l.Token
				mu.Lock()
				if other, dup := seen[l.Token]; dup {
					t.Errorf("token %d granted to %s and %s", l.Token, other, res)
				}
				seen[l.Token] = res
				mu.Unlock()
				c.release(res, l.LeaseID)
			}
		}()
	}
	wg.Wait()
}

// Invariant 2 across a whole-cluster restart: tokens continue above.
func TestTokensSurviveClusterRestart(t *testing.T) {
	env := testenv.Start(t)
	inst := env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	var last uint64
	for i := 0; i < 20; i++ {
		l := c.mustAcquire("restart/1", rid(i), 5000)
		last = l.Token
		c.release("restart/1", l.LeaseID)
	}
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		env.Cluster.Stop(i)
	}
	for i := 0; i < 3; i++ {
		if err := env.Cluster.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	env.Serve(testenv.Config())
	c2 := caller{t: t, nc: env.Connect()}
	var l streams.LeaseResponse
	testenv.Eventually(t, 30*time.Second, func() bool {
		var rep reply
		l, rep = c2.acquire(streams.AcquireRequest{Resource: "restart/1", RequestID: "after", TTLms: 5000})
		return rep.errCode == ""
	}, "no grant after cluster restart")
	if l.Token <= last {
		t.Fatalf("token %d after cluster restart not above %d", l.Token, last)
	}
}

type skewedClock time.Duration

func (s skewedClock) Now() time.Time { return time.Now().Add(time.Duration(s)) }

// Two instances whose wall clocks are 20s apart never expire a renewed
// lease early, and do expire an abandoned one within TTL plus grace (and
// a margin for a busy machine far below the skew).
//
// Every "too early" is judged by when an answer reached the test: an
// answer that the lease is gone, received before TTL after the last
// renewal was sent, was decided earlier still. A renewal the service
// refused after the test itself came late proves nothing: that attempt
// starts over on another resource.
func TestSkewedClocksNeverExpireEarly(t *testing.T) {
	env := testenv.Start(t)
	for _, skew := range []time.Duration{10 * time.Second, -10 * time.Second} {
		cfg := testenv.Config()
		cfg.Clock = skewedClock(skew)
		env.Serve(cfg)
	}
	c := caller{t: t, nc: env.Connect()}
	for attempt := range 3 {
		if renewedAcrossSkew(t, c, fmt.Sprintf("skew/%d", attempt)) {
			return
		}
		t.Logf("attempt %d: a renewal was sent after the lease's TTL; again", attempt)
	}
	t.Fatal("no attempt in 3 renewed in time")
}

// renewedAcrossSkew renews a lease of res for about 3.5 TTLs, then
// abandons it and checks when it ends; it returns false when a renewal
// was refused that the test sent too late to count.
func renewedAcrossSkew(t *testing.T, c caller, res string) bool {
	const ttl = 2 * time.Second
	// The service decides a request after it was sent: the lease stands
	// until TTL after the last request that kept it was sent, at least.
	lastSent := time.Now()
	l := c.mustAcquire(res, "a", ttl.Milliseconds())
	for i := 0; i < 12; i++ { // renewals at ttl/7
		time.Sleep(ttl / 7)
		sent := time.Now()
		_, rep := c.renew(res, l.LeaseID, ttl.Milliseconds())
		if rep.errCode == streams.CodeLeaseLost && time.Since(lastSent) >= ttl {
			return false
		}
		if rep.errCode != "" {
			t.Fatalf("renewal %d, sent %v after the previous one, refused: %s", i, sent.Sub(lastSent), rep.errCode)
		}
		lastSent = sent
	}
	// Abandon it. Until TTL after the last renewal was sent it must hold.
	for i := 0; i < 1000; i++ {
		st := c.status(res)
		answered := time.Since(lastSent)
		if answered >= ttl {
			break
		}
		if !st.Held || st.Token != l.Token {
			t.Fatalf("lease gone %v after its last renewal, before its TTL %v", answered, ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// It ends: after TTL plus grace, and long before the 10s either
	// instance's clock is off would make it.
	grace := testenv.Config().ExpiryGrace
	testenv.Eventually(t, 30*time.Second, func() bool { return !c.status(res).Held }, "abandoned lease not expired")
	if el := time.Since(lastSent); el > ttl+grace+5*time.Second {
		t.Fatalf("expired after %v", el)
	}
	return true
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	env, c := setup(t)
	held := c.mustAcquire("valid/res", "holder", 5000)
	js, err := jetstream.New(env.ConnectAs(devcluster.Inspector))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(context.Background(), streams.StreamName(streams.DefaultBucket))
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	before := info.State.LastSeq

	long := func(n int) string { return strings.Repeat("a", n) }
	cases := []struct {
		name, op, body string
	}{
		{"not json", streams.OpAcquire, `not json`},
		{"array", streams.OpAcquire, `[]`},
		{"empty body", streams.OpAcquire, ``},
		{"trailing data", streams.OpAcquire, `{"resource":"a","request_id":"r"} {}`},
		{"unknown field", streams.OpAcquire, `{"resource":"a","request_id":"r","ttl":5000}`},
		{"field name in another case", streams.OpAcquire, `{"Resource":"a","request_id":"r"}`},
		{"repeated field", streams.OpAcquire, `{"resource":"a","resource":"b","request_id":"r"}`},
		{"invalid utf-8", streams.OpAcquire, "{\"resource\":\"a\",\"request_id\":\"r\xff\"}"},
		{"wrong type", streams.OpAcquire, `{"resource":5,"request_id":"r"}`},
		{"missing resource", streams.OpAcquire, `{"request_id":"r"}`},
		{"empty resource", streams.OpAcquire, `{"resource":"","request_id":"r"}`},
		{"oversized resource", streams.OpAcquire, `{"resource":"` + long(201) + `","request_id":"r"}`},
		{"space in resource", streams.OpAcquire, `{"resource":"a b","request_id":"r"}`},
		{"star in resource", streams.OpAcquire, `{"resource":"a*","request_id":"r"}`},
		{"gt in resource", streams.OpAcquire, `{"resource":"a>","request_id":"r"}`},
		{"non-ascii resource", streams.OpAcquire, `{"resource":"café","request_id":"r"}`},
		{"leading dot", streams.OpAcquire, `{"resource":".a","request_id":"r"}`},
		{"trailing dot", streams.OpAcquire, `{"resource":"a.","request_id":"r"}`},
		{"leading slash", streams.OpAcquire, `{"resource":"/a","request_id":"r"}`},
		{"trailing slash", streams.OpAcquire, `{"resource":"a/","request_id":"r"}`},
		{"missing request id", streams.OpAcquire, `{"resource":"a"}`},
		{"oversized request id", streams.OpAcquire, `{"resource":"a","request_id":"` + long(129) + `"}`},
		{"control char in request id", streams.OpAcquire, `{"resource":"a","request_id":"a\u0001"}`},
		{"oversized owner", streams.OpAcquire, `{"resource":"a","request_id":"r","owner":"` + long(129) + `"}`},
		{"ttl too small", streams.OpAcquire, `{"resource":"a","request_id":"r","ttl_ms":999}`},
		{"ttl too large", streams.OpAcquire, `{"resource":"a","request_id":"r","ttl_ms":600001}`},
		{"negative ttl", streams.OpAcquire, `{"resource":"a","request_id":"r","ttl_ms":-5}`},
		{"negative wait", streams.OpAcquire, `{"resource":"a","request_id":"r","wait_ms":-1}`},
		{"wait too long", streams.OpAcquire, `{"resource":"a","request_id":"r","wait_ms":300001}`},
		{"renew without lease id", streams.OpRenew, `{"resource":"valid/res"}`},
		{"renew ttl too large", streams.OpRenew, `{"resource":"valid/res","lease_id":"` + held.LeaseID + `","ttl_ms":600001}`},
		{"renew unknown field", streams.OpRenew, `{"resource":"valid/res","lease_id":"` + held.LeaseID + `","token":1}`},
		{"release without lease id", streams.OpRelease, `{"resource":"valid/res"}`},
		{"release bad resource", streams.OpRelease, `{"resource":"valid res","lease_id":"` + held.LeaseID + `"}`},
		{"cancel without request id", streams.OpCancel, `{"resource":"valid/res"}`},
		{"status without resource", streams.OpStatus, `{}`},
		{"status bad resource", streams.OpStatus, `{"resource":"a#b"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep := caller{t: t, nc: c.nc}.send(tc.op, tc.body)
			if rep.errCode != streams.CodeInvalidRequest || rep.status != 400 {
				t.Fatalf("got status %d code %q (%s), want 400 invalid_request", rep.status, rep.errCode, rep.raw)
			}
			if rep.err.Message == "" {
				t.Fatal("error without a message")
			}
		})
	}
	info, err = stream.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq != before {
		t.Fatalf("bad input changed the bucket: last sequence %d -> %d", before, info.State.LastSeq)
	}
	if st := c.status("valid/res"); !st.Held || st.Token != held.Token {
		t.Fatalf("held lease disturbed: %+v", st)
	}
}

// Invariant 5: without a quorum no lease is granted and no renewal
// succeeds; service resumes when the nodes return.
func TestNoQuorumAnswersUnavailable(t *testing.T) {
	env := testenv.Start(t)
	cfg := testenv.Config()
	cfg.OpTimeout = time.Second // a budget of 2s with QueueWait's 1s
	env.Serve(cfg)
	c := caller{t: t, nc: env.Connect()}
	// A TTL that outlasts the outage below however slowly it goes, so
	// that the renewal after it can succeed.
	l := c.mustAcquire("q/1", "a", 300000)
	env.Cluster.Stop(1)
	env.Cluster.Stop(2)
	// While the connections move to the surviving node a request may get
	// no answer at all; that is "outcome unknown", never a success. Once
	// settled, the service answers unavailable. "No responders" comes back
	// at once while the service's own connection is still moving, so the
	// wait is bounded in time, not in requests.
	unavailable := 0
	for i, deadline := 0, time.Now().Add(60*time.Second); unavailable < 4 && time.Now().Before(deadline); i++ {
		for _, send := range []func() (reply, error){
			func() (reply, error) {
				return c.try(streams.OpAcquire, streams.AcquireRequest{Resource: fmt.Sprintf("q/new%d", i), RequestID: "b", TTLms: 5000}, 5*time.Second)
			},
			func() (reply, error) {
				return c.try(streams.OpRenew, streams.RenewRequest{Resource: "q/1", LeaseID: l.LeaseID, TTLms: 300000}, 5*time.Second)
			},
		} {
			rep, err := send()
			switch {
			case err != nil:
				t.Logf("no answer: %v", err)
				time.Sleep(100 * time.Millisecond)
			case rep.errCode == "":
				t.Fatalf("success without quorum: %s", rep.raw)
			case rep.errCode != streams.CodeUnavailable:
				t.Fatalf("without quorum: %q, want unavailable", rep.errCode)
			default:
				unavailable++
			}
		}
	}
	if unavailable < 4 {
		t.Fatalf("only %d unavailable answers without quorum", unavailable)
	}
	for _, i := range []int{1, 2} {
		if err := env.Cluster.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		_, rep := c.renew("q/1", l.LeaseID, 300000)
		return rep.errCode == ""
	}, "renewal did not resume")
	if _, rep := c.acquire(streams.AcquireRequest{Resource: "q/new0", RequestID: "b", TTLms: 5000}); rep.errCode != "" {
		t.Fatalf("acquire after recovery: %s", rep.errCode)
	}
}

func TestConfigValidate(t *testing.T) {
	mod := func(f func(*service.Config)) service.Config {
		c := service.DefaultConfig()
		f(&c)
		return c
	}
	bad := map[string]service.Config{
		"empty prefix":   mod(func(c *service.Config) { c.Prefix = "" }),
		"prefix wild":    mod(func(c *service.Config) { c.Prefix = "a.*" }),
		"min ttl 0":      mod(func(c *service.Config) { c.MinTTL = 0 }),
		"max below min":  mod(func(c *service.Config) { c.MaxTTL = 500 * time.Millisecond }),
		"default beyond": mod(func(c *service.Config) { c.DefaultTTL = time.Hour }),
		"r1":             mod(func(c *service.Config) { c.Bucket.Replicas = 1 }),
		"no clock":       mod(func(c *service.Config) { c.Clock = nil }),
		"in flight 0":    mod(func(c *service.Config) { c.MaxInFlight = 0 }),
		"queued -1":      mod(func(c *service.Config) { c.MaxQueued = -1 }),
		"queue wait -1s": mod(func(c *service.Config) { c.QueueWait = -time.Second }),
		"no patience":    mod(func(c *service.Config) { c.HighWaterPatience = 0 }),
	}
	for name, cfg := range bad {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := service.DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if err := mod(func(c *service.Config) { c.MaxQueued = 0 }).Validate(); err != nil {
		t.Fatalf("no queue (shed beyond MaxInFlight): %v", err)
	}
}

// Invariant 6 across a whole-cluster restart: JetStream rebuilds its
// duplicate table only from the messages still stored (nats-server issue
// 3272), so the service itself remembers ended request ids for the retry
// window. A regression test for a bug found by the fault suite.
func TestRequestIDRememberedAcrossClusterRestart(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	c := caller{t: t, nc: env.Connect()}
	first := c.mustAcquire("rr/1", "r1", 5000)
	if ok, _ := c.release("rr/1", first.LeaseID); !ok {
		t.Fatal("release failed")
	}
	for i := 0; i < 3; i++ {
		env.Cluster.Stop(i)
	}
	for i := 0; i < 3; i++ {
		if err := env.Cluster.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	var rep reply
	testenv.Eventually(t, 30*time.Second, func() bool {
		var err error
		rep, err = c.try(streams.OpAcquire, streams.AcquireRequest{Resource: "rr/1", RequestID: "r1", TTLms: 5000}, 5*time.Second)
		return err == nil && rep.errCode != streams.CodeUnavailable
	}, "no answer after the cluster restart")
	if rep.errCode != streams.CodeLeaseLost {
		t.Fatalf("retry of an ended request after a cluster restart: %q %s, want lease_lost", rep.errCode, rep.raw)
	}
	var st streams.StatusResponse
	testenv.Eventually(t, 30*time.Second, func() bool {
		rep, err := c.try(streams.OpStatus, streams.StatusRequest{Resource: "rr/1"}, 5*time.Second)
		if err != nil || rep.errCode != "" {
			return false // the cluster is still settling
		}
		rep.decode(t, &st)
		return true
	}, "no status after the cluster restart")
	if st.Held {
		t.Fatalf("retry created a second lease: %+v", st)
	}
}

// A stream that reports a last sequence below the token high-water mark
// keeps Run re-checking for HighWaterPatience: a replica that is behind
// can answer while the stream has no leader, and that passes. If the
// stream catches up, Run serves; if it stays below, Run refuses the bucket
// (its tokens would go backwards).
func TestBucketBelowHighWaterWaitsThenRefuses(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	js, err := jetstream.New(env.ConnectAs(devcluster.Store))
	if err != nil {
		t.Fatal(err)
	}
	b, err := streams.Ensure(ctx, js, streams.BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// raise puts the high-water mark n above the stream's last sequence.
	raise := func(n uint64) {
		info, err := b.Stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.RecordHighWater(ctx, info.State.LastSeq+n); err != nil {
			t.Fatal(err)
		}
	}
	raise(3)
	run := func(patience time.Duration) (*service.Service, <-chan error, context.CancelFunc) {
		cfg := testenv.Config()
		cfg.HighWaterPatience = patience
		svc, err := service.New(env.ConnectAs(devcluster.Service), env.ConnectAs(devcluster.Store), cfg)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- svc.Run(rctx) }()
		return svc, done, cancel
	}

	// Below by 3: not serving; three writes later it serves.
	svc, done, cancel := run(time.Minute)
	select {
	case <-svc.Ready():
		t.Fatal("served a stream below the high-water mark")
	case err := <-done:
		t.Fatalf("refused at once: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	for i := range 3 {
		if _, err := b.KV.Put(ctx, fmt.Sprintf("probe.%d", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-svc.Ready():
	case err := <-done:
		t.Fatalf("refused after the stream caught up: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("not serving 60s after the stream caught up")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Below for longer than the patience: refused.
	raise(1000)
	start := time.Now()
	_, done, cancel = run(time.Second)
	defer cancel()
	select {
	case err := <-done:
		if !errors.Is(err, streams.ErrBucketConfig) || !errors.Is(err, streams.ErrBelowHighWater) {
			t.Fatalf("Run returned %v, want the bucket refused as below the high-water mark", err)
		}
		if d := time.Since(start); d < time.Second {
			t.Fatalf("refused after %v, before the patience of 1s", d)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run still waiting 60s after a patience of 1s")
	}
}
