package client_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/client/fence"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// statusOf returns the status of resource, failing the test on an error.
func statusOf(t *testing.T, ctx context.Context, c *client.Client, resource string) *client.Status {
	t.Helper()
	st, err := c.Status(ctx, resource)
	if err != nil {
		t.Fatalf("status %s: %v", resource, err)
	}
	return st
}

// wantHeldBy fails unless every resource of l is held with l's token of it,
// by owner, as one of a set of len(l.Resources()).
func wantHeldBy(t *testing.T, ctx context.Context, c *client.Client, l *client.Lease, owner string) {
	t.Helper()
	for _, r := range l.Resources() {
		tok, _ := l.TokenOf(r)
		st := statusOf(t, ctx, c, r)
		if !st.Held || st.Token != tok || st.Owner != owner || st.SetSize != len(l.Resources()) {
			t.Fatalf("status of %s: %+v; want held by %q with token %d, set size %d", r, st, owner, tok, len(l.Resources()))
		}
	}
}

// wantFree fails unless no lease holds any of resources and nobody waits.
func wantFree(t *testing.T, ctx context.Context, c *client.Client, resources ...string) {
	t.Helper()
	for _, r := range resources {
		if st := statusOf(t, ctx, c, r); st.Held || st.Waiters != 0 {
			t.Fatalf("%s not free: %+v", r, st)
		}
	}
}

// AcquireAll grants every resource at once with a token each; the lease's
// accessors give them per resource; each resource's fence takes its own
// token and refuses Token's 0; renewals keep the whole set; Release frees
// every resource.
func TestAcquireAllGrantsEveryResourceATokenEachAndRenewsAndReleasesWhole(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	set := []string{"set/c", "set/a", "set/b"} // any order
	// Earlier grants of set/b: its token in the set is above theirs.
	before, err := c.TryAcquire(ctx, "set/b")
	if err != nil {
		t.Fatal(err)
	}
	if err := before.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := c.AcquireAll(ctx, set, client.TTL(3*time.Second), client.Owner("set-owner"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background()) //nolint:errcheck
	if got := l.Resources(); !slices.Equal(got, []string{"set/a", "set/b", "set/c"}) {
		t.Fatalf("Resources %q, want sorted", got)
	}
	if l.Token() != 0 || l.Resource() != "" || l.ID() == "" {
		t.Fatalf("set lease: Token %d, Resource %q, ID %q; want 0, \"\" and an id", l.Token(), l.Resource(), l.ID())
	}
	if tok, ok := l.TokenOf("set/b"); !ok || tok <= before.Token() {
		t.Fatalf("TokenOf(set/b) = %d, %v; want above the earlier grant's %d", tok, ok, before.Token())
	}
	if tok, ok := l.TokenOf("set/d"); ok || tok != 0 {
		t.Fatalf("TokenOf a resource outside the set: %d, %v", tok, ok)
	}
	if r := l.Reply(); r.LeaseID != l.ID() || r.TTLms != 3000 || r.Token != 0 || r.Resource != "" {
		t.Fatalf("Reply of a set: %+v", r)
	}
	wantHeldBy(t, ctx, c, l, "set-owner")

	// Each resource's fence takes its own token; a set's Token is refused.
	guard := fence.NewMemory()
	for _, r := range l.Resources() {
		tok, _ := l.TokenOf(r)
		if err := guard.Check(ctx, r, tok); err != nil {
			t.Fatalf("fence of %s refused token %d: %v", r, tok, err)
		}
	}
	if err := guard.Check(ctx, "set/a", l.Token()); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("fence took the set's Token %d: %v", l.Token(), err)
	}

	// Renewals, of the whole set, keep it past several TTLs.
	first := l.Expires()
	renewed := l.Renewed()
	renewedThrice(t, "set lease", l.Renewed, l.Lost(), l.Context())
	notLost(t, "set lease", l.Lost(), l.Context())
	if !l.Expires().After(first) {
		t.Fatal("deadline never moved: no renewal happened")
	}
	select {
	case <-renewed:
	default:
		t.Fatal("Renewed not closed after renewals")
	}
	wantHeldBy(t, ctx, c, l, "set-owner")

	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	isLost(t, "released set", l.Lost())
	if cause := context.Cause(l.Context()); !errors.Is(cause, client.ErrReleased) {
		t.Fatalf("cause %v, want ErrReleased", cause)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	wantFree(t, ctx, c, set...)
	// Each is free for anyone at once, with a larger token.
	for _, r := range set {
		next, err := c.TryAcquire(ctx, r)
		if err != nil {
			t.Fatalf("%s after the set's release: %v", r, err)
		}
		if old, _ := l.TokenOf(r); next.Token() <= old {
			t.Fatalf("%s: token %d not above the set's %d", r, next.Token(), old)
		}
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TryAcquireAll on a set with held members fails at once naming every held
// member and its holder, and grants nothing: the free members stay free.
// AcquireAll with Wait does the same when the wait runs out, and a wait
// the caller gives up leaves nothing queued.
func TestTryAcquireAllNamesHoldersAndLeavesFreeKeysFree(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	b, err := c.TryAcquire(ctx, "held/b", client.Owner("bob"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(context.Background()) //nolint:errcheck

	_, err = c.TryAcquireAll(ctx, []string{"held/c", "held/b", "held/a"}, client.Owner("setter"))
	var he *client.HeldError
	if !errors.As(err, &he) || !errors.Is(err, client.ErrLocked) {
		t.Fatalf("TryAcquireAll with held/b held: %v, want a HeldError", err)
	}
	if !slices.Equal(he.Set, []string{"held/a", "held/b", "held/c"}) || len(he.Holders) != 1 ||
		he.Holders[0] != (client.Holder{Resource: "held/b", Owner: "bob", Token: b.Token(), ExpiresAt: he.Holders[0].ExpiresAt}) ||
		he.Holders[0].ExpiresAt.IsZero() {
		t.Fatalf("HeldError %+v: want set a b c, holder bob of held/b with token %d", he, b.Token())
	}
	if he.Resource != "held/b" || he.Owner != "bob" || he.Token != b.Token() {
		t.Fatalf("HeldError's first holder %q %q %d", he.Resource, he.Owner, he.Token)
	}
	if msg := err.Error(); !strings.Contains(msg, "lock set of 3 resources") || !strings.Contains(msg, `held/b by "bob"`) {
		t.Fatalf("error text %q", msg)
	}
	wantFree(t, ctx, c, "held/a", "held/c")

	// Two held members: both named, in sorted order.
	a, err := c.TryAcquire(ctx, "held/a", client.Owner("alice"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.TryAcquireAll(ctx, []string{"held/c", "held/b", "held/a"})
	if !errors.As(err, &he) || len(he.Holders) != 2 || he.Holders[0].Resource != "held/a" || he.Holders[0].Owner != "alice" ||
		he.Holders[0].Token != a.Token() || he.Holders[1].Resource != "held/b" || he.Holders[1].Token != b.Token() {
		t.Fatalf("two held: %v (%+v)", err, he)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A bounded wait that runs out: ErrLocked naming the holder, nothing
	// left granted or queued.
	begin := time.Now()
	_, err = c.AcquireAll(ctx, []string{"held/a", "held/b", "held/c"}, client.Wait(500*time.Millisecond))
	if !errors.As(err, &he) || len(he.Holders) != 1 || he.Holders[0].Resource != "held/b" {
		t.Fatalf("AcquireAll with a wait that runs out: %v", err)
	}
	if took := time.Since(begin); took < 400*time.Millisecond || took > 5*time.Second {
		t.Fatalf("the wait took %v, want about 500ms", took)
	}
	wantFree(t, ctx, c, "held/a", "held/c")
	if st := statusOf(t, ctx, c, "held/b"); st.Waiters != 0 {
		t.Fatalf("held/b keeps a waiter after the set's wait ran out: %+v", st)
	}

	// A wait the caller gives up (ctx) is cancelled: nothing queued.
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.AcquireAll(wctx, []string{"held/a", "held/b"})
		done <- err
	}()
	waitWaiters(t, ctx, c, "held/b", 1, 5*time.Second, "the set's acquire never queued on held/b")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled AcquireAll: %v", err)
	}
	waitWaiters(t, ctx, c, "held/b", 0, 5*time.Second, "a cancelled set's wait stays queued on held/b")
	wantFree(t, ctx, c, "held/a")

	// A waiting set is granted, whole, when the last member frees up.
	got := make(chan *client.Lease, 1)
	go func() {
		l, err := c.AcquireAll(ctx, []string{"held/b", "held/a"}, client.Owner("waiter"), client.TTL(5*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitWaiters(t, ctx, c, "held/b", 1, 5*time.Second, "the set's acquire never queued on held/b")
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var l *client.Lease
	select {
	case l = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting set was not granted after the release")
	}
	if l == nil {
		t.FailNow()
	}
	if tok, _ := l.TokenOf("held/b"); tok <= b.Token() {
		t.Fatalf("waited set's token of held/b %d, not above %d", tok, b.Token())
	}
	wantHeldBy(t, ctx, c, l, "waiter")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantFree(t, ctx, c, "held/a", "held/b")
}

// A bad list of names is refused before anything is sent, with an error
// matching ErrInvalidOption (and ErrInvalidRequest, as for Acquire).
func TestAcquireAllValidatesNamesWithoutARequest(t *testing.T) {
	_, nc, _ := setup(t)
	ctx := ctxT(t, 30*time.Second)
	// A prefix a caller may not publish to: a request sent would fail with
	// ErrPermission (see the end), so another error shows none was sent.
	const prefix = "nobody-serves-sets"
	c, err := client.New(nc, client.WithPrefix(prefix), client.WithRetries(0), client.WithRequestTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("v/%d", i)
	}
	for _, tc := range []struct {
		names []string
		text  string
	}{
		{nil, "0 resources: a lock set has 2 to 64"},
		{[]string{"v/a"}, "1 resource: a lock set has 2 to 64 (acquire one resource with Acquire)"},
		{many, "65 resources: a lock set has 2 to 64 (see WithMaxSetSize)"},
		{[]string{"v/a", "v/b", "v/a"}, `"v/a" named twice`},
		{[]string{"v/a", "bad name"}, `resources[1] "bad name": resource has a character outside`},
		{[]string{"v/a", ""}, `resources[1] "": resource is required`},
	} {
		for name, call := range map[string]func() error{
			"AcquireAll":    func() error { _, err := c.AcquireAll(ctx, tc.names); return err },
			"TryAcquireAll": func() error { _, err := c.TryAcquireAll(ctx, tc.names, client.Owner("x")); return err },
			"RenewAll":      func() error { _, err := c.RenewAll(ctx, tc.names, "0a", 0); return err },
			"ReleaseAll":    func() error { _, err := c.ReleaseAll(ctx, tc.names, "0a"); return err },
		} {
			var err error
			if sent := sentBy(t, nc, func() { err = call() }); sent != 0 {
				t.Errorf("%s(%q) sent %d messages, want none", name, tc.names, sent)
			}
			if !errors.Is(err, client.ErrInvalidOption) || !errors.Is(err, client.ErrInvalidRequest) ||
				!strings.HasPrefix(err.Error(), "jetlock: invalid option: lock set: "+tc.text) {
				t.Errorf("%s(%q): %v; want ErrInvalidOption and ErrInvalidRequest, %q", name, tc.names, err, tc.text)
			}
		}
	}
	// An option's own error comes through as for Acquire.
	if _, err := c.TryAcquireAll(ctx, []string{"v/a", "v/b"}, client.TTL(0)); !errors.Is(err, client.ErrInvalidOption) {
		t.Errorf("TTL(0): %v", err)
	}
	for _, n := range []int{1, streams.MaxSetSize + 1} {
		if _, err := client.New(nc, client.WithMaxSetSize(n)); !errors.Is(err, client.ErrInvalidOption) {
			t.Errorf("WithMaxSetSize(%d): %v", n, err)
		}
	}
	// With a larger cap a set of 65 goes out: the NATS server refuses it.
	big, err := client.New(nc, client.WithPrefix(prefix), client.WithRetries(0), client.WithRequestTimeout(time.Second),
		client.WithMaxSetSize(100))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := big.TryAcquireAll(ctx, many); !errors.Is(err, client.ErrPermission) {
		t.Fatalf("a set of 65 with WithMaxSetSize(100): %v, want ErrPermission: sent, and refused", err)
	}
}

// Two clients acquire overlapping sets in opposite orders, {a,b} and
// {b,a}, with waits, again and again: both make progress (no deadlock, no
// starvation), never hold at once, and every grant's tokens rise.
func TestAcquireAllOverlappingSetsInOppositeOrdersBothProgress(t *testing.T) {
	env, _, c1 := setup(t)
	ctx := ctxT(t, 90*time.Second)
	c2, err := client.New(env.Connect())
	if err != nil {
		t.Fatal(err)
	}
	const rounds = 15
	var (
		inside atomic.Int32
		mu     sync.Mutex
		last   = map[string]uint64{}
		done   [2]int
		wg     sync.WaitGroup
	)
	work := func(i int, c *client.Client, names []string) {
		defer wg.Done()
		for range rounds {
			l, err := c.AcquireAll(ctx, names, client.Wait(20*time.Second), client.TTL(5*time.Second), client.Owner(fmt.Sprint("worker-", i)))
			if err != nil {
				t.Errorf("worker %d: %v", i, err)
				return
			}
			if n := inside.Add(1); n != 1 {
				t.Errorf("worker %d: %d holders of {a,b} at once", i, n)
			}
			mu.Lock()
			for _, r := range l.Resources() {
				tok, _ := l.TokenOf(r)
				if tok <= last[r] {
					t.Errorf("worker %d: token of %s %d, not above the last grant's %d", i, r, tok, last[r])
				}
				last[r] = tok
			}
			done[i]++
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			inside.Add(-1)
			if err := l.Release(ctx); err != nil {
				t.Errorf("worker %d: release: %v", i, err)
				return
			}
		}
	}
	wg.Add(2)
	go work(0, c1, []string{"cross/a", "cross/b"})
	go work(1, c2, []string{"cross/b", "cross/a"})
	wg.Wait()
	if done != [2]int{rounds, rounds} {
		t.Fatalf("rounds done %v, want %d each", done, rounds)
	}
	wantFree(t, ctx, c1, "cross/a", "cross/b")
}

// A set acquired in a session lives as long as the session: it does not
// renew itself, status shows it in the session, and Close frees it all.
func TestSessionAcquireAll(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	s, err := c.NewSession(ctx, client.SessionTTL(3*time.Second), client.SessionOwner("worker"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close() //nolint:errcheck
	if _, err := s.TryAcquireAll(ctx, []string{"sset/a", "sset/b"}, client.TTL(time.Minute)); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("TTL with a session's set: %v", err)
	}
	l, err := s.AcquireAll(ctx, []string{"sset/b", "sset/a"}, client.Owner("job"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.TryAcquireAll(ctx, []string{"sset/c", "sset/d"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquireAll(ctx, []string{"sset/a", "sset/e"}); !errors.Is(err, client.ErrLocked) {
		t.Fatalf("a set overlapping the session's own: %v, want ErrLocked", err)
	}
	wantFree(t, ctx, c, "sset/e")
	renewedThrice(t, "session's set", l.Renewed, l.Lost(), l.Context()) // only keepalives keep it
	notLost(t, "session's set", l.Lost(), l.Context())
	if l.Expires() != s.Expires() {
		t.Fatalf("set deadline %v, session's %v", l.Expires(), s.Expires())
	}
	for _, r := range l.Resources() {
		tok, _ := l.TokenOf(r)
		st := statusOf(t, ctx, c, r)
		if !st.Held || st.Token != tok || !st.InSession || st.SessionOwner != "worker" || st.SetSize != 2 {
			t.Fatalf("status of %s: %+v", r, st)
		}
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantFree(t, ctx, c, "sset/c", "sset/d")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Second, func() bool {
		select {
		case <-l.Lost():
			return true
		default:
			return false
		}
	}, "the session's set not lost after Close")
	wantFree(t, ctx, c, "sset/a", "sset/b")
}

// RenewAll and ReleaseAll keep and end a set by its lease id, as Renew and
// Release do a lease: renewed whole with the grant's tokens, lease_lost
// for a wrong id, released once.
func TestRenewAllAndReleaseAllByID(t *testing.T) {
	_, _, c := setup(t)
	ctx := ctxT(t, 30*time.Second)
	l, err := c.TryAcquireAll(ctx, []string{"byid/a", "byid/b"}, client.TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The script's view: the lease id and the names, in another order.
	names := []string{"byid/b", "byid/a"}
	resp, err := c.RenewAll(ctx, names, l.ID(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ta, _ := l.TokenOf("byid/a")
	tb, _ := l.TokenOf("byid/b")
	if resp.TTLms != 10000 || resp.LeaseID != l.ID() ||
		!slices.Equal(resp.Resources, []streams.SetMember{{Resource: "byid/a", Token: ta}, {Resource: "byid/b", Token: tb}}) {
		t.Fatalf("RenewAll: %+v", resp)
	}
	if _, err := c.RenewAll(ctx, names, strings.Repeat("0", len(l.ID())), 0); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("RenewAll with another id: %v, want ErrLeaseLost", err)
	}
	// Naming part of the set, or other resources, is refused as such, and
	// the set stays held (issue 39: it used to answer "lease lost", and a
	// release "already ended").
	if _, err := c.RenewAll(ctx, []string{"byid/a", "byid/c"}, l.ID(), 0); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("RenewAll of another set: %v, want ErrInvalidRequest", err)
	}
	if _, err := c.Renew(ctx, "byid/a", l.ID(), 0); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("Renew of one resource of a set: %v, want ErrInvalidRequest", err)
	}
	if _, err := c.Release(ctx, "byid/a", l.ID()); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("Release of one resource of a set: %v, want ErrInvalidRequest", err)
	}
	if _, err := c.ReleaseAll(ctx, []string{"byid/a", "byid/b", "byid/c"}, l.ID()); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("ReleaseAll of a superset: %v, want ErrInvalidRequest", err)
	}
	for _, r := range names {
		if st, err := c.Status(ctx, r); err != nil || !st.Held || st.SetSize != 2 {
			t.Fatalf("%s after requests naming part of the set: %+v %v", r, st, err)
		}
	}
	released, err := c.ReleaseAll(ctx, names, l.ID())
	if err != nil || !released {
		t.Fatalf("ReleaseAll: %v %v", released, err)
	}
	wantFree(t, ctx, c, names...)
	if released, err := c.ReleaseAll(ctx, names, l.ID()); err != nil || released {
		t.Fatalf("second ReleaseAll: %v %v, want false", released, err)
	}
	// The Lease learns it at its next renewal.
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the set's Lease not lost after its release by id")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, client.ErrLeaseLost) {
		t.Fatalf("cause %v", cause)
	}
}

// A transfer between two accounts locks both at once and fences the write
// to each account with that account's token. (Not run: it needs a
// service; see Example.)
func ExampleClient_AcquireAll() {
	var c *client.Client // client.New(nc)
	ctx := context.Background()
	guard := fence.NewMemory() // the accounts' store keeps a fence per account
	lease, err := c.AcquireAll(ctx, []string{"account:42", "account:17"}, client.TTL(30*time.Second), client.Wait(time.Minute))
	var held *client.HeldError
	if errors.As(err, &held) {
		for _, h := range held.Holders {
			fmt.Printf("%s is held by %s\n", h.Resource, h.Owner)
		}
		return
	}
	if err != nil {
		return
	}
	defer lease.Release(context.Background()) //nolint:errcheck
	for _, account := range lease.Resources() {
		token, _ := lease.TokenOf(account)
		if err := guard.Do(lease.Context(), account, token, func() error { return nil /* write the account */ }); err != nil {
			return // fence.ErrStaleToken: someone newer holds the account; stop
		}
	}
}
