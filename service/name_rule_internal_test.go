package service

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// acquireOn decodes body as an acquire that does not wait and serves it on
// s, as its request handler would.
func acquireOn(ctx context.Context, s *Service, body string) error {
	c, err := s.decodeCall(streams.OpAcquire, []byte(body), origin{})
	if err != nil {
		return err
	}
	_, err = handlers[route{c.op, c.kind}](s, ctx, c, nil)
	return err
}

// A name is one thing at a time, decided in the commit that grants: two
// (or three) acquires of one fresh name as different kinds, or as a
// semaphore of different limits, sent at once, on one instance and on two
// that serve one bucket, are never granted together. Before the name
// rule, a lock and a limit-1 semaphore were granted together in every
// trial (their keys differ), and limits 1 and 2 in a third of them.
func TestANameIsOneKindInTheCommit(t *testing.T) {
	a, b, _ := twoFollowing(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const trials = 30
	cases := []struct {
		name string
		// bodies of the acquires of name %[1]s; kinds[i] names body i's kind.
		bodies []string
		kinds  []string
	}{
		{"lock-and-semaphore", []string{`{"resource":"%[1]s","request_id":"l"}`, `{"resource":"%[1]s","request_id":"s","limit":1}`}, []string{"lock", "limit 1"}},
		{"set-and-semaphore", []string{`{"resources":["%[1]s","%[1]s-other"],"request_id":"set"}`, `{"resource":"%[1]s","request_id":"s","limit":1}`}, []string{"lock", "limit 1"}},
		{"election-and-semaphore", []string{`{"resource":"%[1]s","request_id":"e","value":"node-a"}`, `{"resource":"%[1]s","request_id":"s","limit":1}`}, []string{"lock", "limit 1"}},
		{"limits-1-2-2", []string{`{"resource":"%[1]s","request_id":"one","limit":1}`, `{"resource":"%[1]s","request_id":"two","limit":2}`, `{"resource":"%[1]s","request_id":"too","limit":2}`}, []string{"limit 1", "limit 2", "limit 2"}},
	}
	for _, tc := range cases {
		for _, shape := range []string{"one instance", "two instances"} {
			on := []*Service{a, a, a}
			if shape == "two instances" {
				on = []*Service{a, b, a}
			}
			for trial := range trials {
				name := fmt.Sprintf("kind/%s/%d/%s", tc.name, trial, map[string]string{"one instance": "one", "two instances": "two"}[shape])
				errs := make([]error, len(tc.bodies))
				var start, done sync.WaitGroup
				start.Add(1)
				for i, body := range tc.bodies {
					done.Add(1)
					go func() {
						defer done.Done()
						start.Wait()
						errs[i] = acquireOn(ctx, on[i], fmt.Sprintf(body, name))
					}()
				}
				start.Done()
				done.Wait()
				granted := map[string]int{}
				for i, err := range errs {
					switch {
					case err == nil:
						granted[tc.kinds[i]]++
					case !isCode(err, streams.CodeInvalidRequest) && !isCode(err, streams.CodeLocked):
						t.Fatalf("%s, %s, trial %d: acquire %d: %v", tc.name, shape, trial, i, err)
					}
				}
				if len(granted) != 1 {
					t.Fatalf("%s, %s, trial %d: granted as %v at once (errors %v): a name is one thing at a time", tc.name, shape, trial, granted, errs)
				}
			}
		}
	}
}

// A name record stays once its semaphore's permits end: the same name
// is then a lock (the record retired on proof that no permit is held),
// a semaphore of another limit, and refused as a lock while a permit is
// held.
func TestANameRecordIsRetiredOnlyWhenItsPermitsAreFree(t *testing.T) {
	a, b, cl := twoFollowing(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "kind/retire"
	sem := func(s *Service, id string, limit int) (*streams.LeaseResponse, error) {
		c, err := s.decodeCall(streams.OpAcquire, fmt.Appendf(nil, `{"resource":%q,"request_id":%q,"limit":%d}`, name, id, limit), origin{})
		if err != nil {
			t.Fatal(err)
		}
		return s.locks.leases.acquire(ctx, c.grant)
	}
	p1, err := sem(a, "p1", 2)
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := streams.ParseNameRecord(lastValue(t, cl, streams.LeaseKey(name))); !ok || n != 2 {
		t.Fatalf("the name's key after a permit's grant: %d %v; want the name record of limit 2", n, ok)
	}
	if err := acquireOn(ctx, b, `{"resource":"kind/retire","request_id":"l1"}`); !isCode(err, streams.CodeInvalidRequest) {
		t.Fatalf("a lock while a permit is held: %v; want invalid_request", err)
	}
	if _, err := sem(b, "p3", 3); !isCode(err, streams.CodeInvalidRequest) {
		t.Fatalf("limit 3 while a permit of limit 2 is held: %v; want invalid_request", err)
	}
	if resp, err := a.locks.leases.release(ctx, streams.PermitResource(name, p1.Permit), p1.LeaseID, origin{}); err != nil || !resp.Released {
		t.Fatalf("release of the permit: %+v %v", resp, err)
	}
	// b refuses early while its view still holds the permit.
	waitFor(t, 10*time.Second, func() bool { return b.locks.names.semaphoreLimit(name) == 0 }, "b sees the permit released")
	if _, err := sem(b, "p3", 3); err != nil {
		t.Fatalf("limit 3 once every permit of limit 2 is free: %v", err)
	}
	if n, _ := streams.ParseNameRecord(lastValue(t, cl, streams.LeaseKey(name))); n != 3 {
		t.Fatalf("the name record after the limit changed: limit %d; want 3", n)
	}
}

// lastValue returns the value of key's last write.
func lastValue(t *testing.T, cl *devcluster.Cluster, key string) []byte {
	t.Helper()
	e, err := storeBucket(t, cl).Get(t.Context(), key)
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return e.Value()
}

// A retry of a lock set's acquire in a session, sent after the session's
// close ended the set and another caller was granted one of its keys, is
// answered lease_lost, never held, by an instance whose view lags (found
// by an adversary: a set answered from the view, where single leases and
// permits were proven on the stream leader). Played on a lone instance
// whose view is set back to the set's grant, as a lagging watcher's is.
func TestASetRetryAfterItsSessionClosedIsNotHeld(t *testing.T) {
	cl := startCluster(t)
	s, _ := startInstance(t, cl, DefaultConfig(), 200*time.Millisecond)
	waitFor(t, 30*time.Second, func() bool { return !s.Following() }, "the lone instance stops following")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resources := []string{"setretry/a", "setretry/b"}
	g := openIn(t, s, "setretry", resources[0])
	setIn(ctx, t, s, g, resources...)
	view := map[string]observation{}
	for _, k := range []string{streams.LeaseKey(resources[0]), streams.LeaseKey(resources[1]), streams.SessionKey(g.session)} {
		view[k], _ = s.tracker.get(k)
	}
	if _, err := s.locks.sessions.closeSession(ctx, g.session+g.secret, origin{}); err != nil {
		t.Fatal(err)
	}
	other := &grantReq{resource: resources[0], requestID: "other", owner: "other", key: streams.LeaseKey(resources[0]),
		hash: requestHash(resources[0], "other", ""), ttl: 30 * time.Second}
	if _, err := s.locks.leases.acquire(ctx, other); err != nil {
		t.Fatal(err)
	}
	// The view of a node that has seen none of it: the set and its session
	// as granted, and no memory of the ends.
	s.tracker.mu.Lock()
	s.tracker.retry.ids.reset()
	s.tracker.mu.Unlock()
	for k, o := range view {
		s.tracker.forget(k)
		s.tracker.observe(k, o.entry)
	}
	r := newSetReq(resources, "set-"+g.requestID, g.owner, origin{})
	r.ttl, r.session, r.secret = 30*time.Second, g.session, g.secret
	resp, err := s.locks.sets.acquireSet(ctx, r)
	if !isCode(err, streams.CodeLeaseLost) {
		t.Fatalf("a set's retry after its session's close: %+v %v; want lease_lost", resp, err)
	}
}

// A semaphore's name record is retired once no permit of it has been held
// for the retry window, so that the bucket and each view keep records only
// for the names used lately; a record whose permit is held is not.
func TestAnIdleNameRecordIsRetired(t *testing.T) {
	cl := startCluster(t)
	cfg := DefaultConfig()
	cfg.Bucket.RetryWindow = time.Second
	cfg.SweepInterval = 50 * time.Millisecond
	s, _ := startInstance(t, cl, cfg, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	grant := func(name, id string) *streams.LeaseResponse {
		c, err := s.decodeCall(streams.OpAcquire, fmt.Appendf(nil, `{"resource":%q,"request_id":%q,"limit":2}`, name, id), origin{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.locks.leases.acquire(ctx, c.grant)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	idle, busy := "idle/sem", "busy/sem"
	p := grant(idle, "p1")
	grant(busy, "p2")
	if resp, err := s.locks.leases.release(ctx, streams.PermitResource(idle, p.Permit), p.LeaseID, origin{}); err != nil || !resp.Released {
		t.Fatalf("release: %+v %v", resp, err)
	}
	kv := storeBucket(t, cl)
	waitFor(t, 20*time.Second, func() bool {
		_, err := kv.Get(ctx, streams.LeaseKey(idle))
		return err != nil
	}, "the idle semaphore's name record is retired")
	o, _ := s.tracker.get(streams.LeaseKey(busy))
	if _, _, err := s.locks.names.retireName(ctx, busy, o, 0, false); !isCode(err, streams.CodeInvalidRequest) {
		t.Fatalf("retiring the name record of a semaphore whose permit is held: %v; want it refused", err)
	}
	if n, ok := streams.ParseNameRecord(lastValue(t, cl, streams.LeaseKey(busy))); !ok || n != 2 {
		t.Fatalf("the held semaphore's name record: %d %v", n, ok)
	}
}
