package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/client/fence"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/tcpproxy"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

// viaProxy connects a caller to node i of env's cluster through a proxy
// the test can cut, as when the network between a process and NATS fails.
func viaProxy(t *testing.T, env *testenv.Env, i int) (*tcpproxy.Proxy, *client.Client) {
	t.Helper()
	addr := strings.TrimPrefix(env.Cluster.ClientURL(i), "nats://")
	p, err := tcpproxy.New(func() []string { return []string{addr} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	opts := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)},
		env.Cluster.ConnectOptions(devcluster.Caller)...)
	nc, err := nats.Connect(p.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

// newElection makes the election name on c, failing the test on error.
func newElection(t *testing.T, c *client.Client, name string, opts ...client.AcquireOption) *client.Election {
	t.Helper()
	e, err := c.NewElection(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// campaignResult is what a campaign in the background ended with, and
// when.
type campaignResult struct {
	who string
	ld  *client.Leadership
	err error
	at  time.Time
}

// Three candidates on connections of their own: one leads, and when its
// connection is cut, exactly one of the others is elected, with a larger
// token, after the old leader's Lost fired; the old leader's late write is
// fenced off.
func TestElectionFailoverWhenLeaderConnectionKilled(t *testing.T) {
	env := testenv.Start(t)
	env.Serve(testenv.Config())
	ctx := ctxT(t, 90*time.Second)
	const name = "elect/failover"
	const ttl = 2 * time.Second

	proxies := map[string]*tcpproxy.Proxy{}
	clients := map[string]*client.Client{}
	elections := map[string]*client.Election{}
	for i, who := range []string{"a", "b", "c"} {
		p, c := viaProxy(t, env, i)
		proxies[who], clients[who] = p, c
		elections[who] = newElection(t, c, name, client.TTL(ttl), client.Owner(who))
	}
	results := make(chan campaignResult, 3)
	cctx, cancelCampaigns := context.WithCancel(ctx)
	defer cancelCampaigns()
	for who, e := range elections {
		go func() {
			ld, err := e.Campaign(cctx, "host-"+who)
			results <- campaignResult{who: who, ld: ld, err: err, at: time.Now()}
		}()
	}
	var first campaignResult
	select {
	case first = <-results:
	case <-time.After(20 * time.Second):
		t.Fatal("nobody elected in 20s")
	}
	if first.err != nil {
		t.Fatalf("campaign of %s: %v", first.who, first.err)
	}
	if first.ld.Value() != "host-"+first.who || first.ld.Token() == 0 || first.ld.Resource() != name {
		t.Fatalf("leadership of %s: value %q token %d resource %q", first.who, first.ld.Value(), first.ld.Token(), first.ld.Resource())
	}
	// Nobody else is elected while it leads (three TTLs).
	select {
	case r := <-results:
		t.Fatalf("%s elected (%v) while %s leads", r.who, r.err, first.who)
	case <-time.After(3 * ttl):
	}
	notLost(t, "leader", first.ld.Lost(), first.ld.Context())
	observer := newElection(t, newCaller(t, env), name)
	leader, err := observer.Leader(ctx)
	if err != nil || leader.Value != "host-"+first.who || leader.Token != first.ld.Token() {
		t.Fatalf("Leader: %+v %v, want %s's value and token %d", leader, err, first.who, first.ld.Token())
	}

	guard := fence.NewMemory()
	if err := guard.Check(ctx, first.ld.FenceKey(), first.ld.Token()); err != nil {
		t.Fatal(err)
	}
	lostAt := make(chan time.Time, 1)
	go func() {
		<-first.ld.Lost()
		lostAt <- time.Now()
	}()
	proxies[first.who].Cut()

	var second campaignResult
	select {
	case second = <-results:
	case <-time.After(20 * time.Second):
		t.Fatal("nobody elected in 20s after the leader's connection was cut")
	}
	if second.err != nil {
		t.Fatalf("campaign of %s: %v", second.who, second.err)
	}
	var lost time.Time
	select {
	case lost = <-lostAt:
	default:
		t.Fatalf("%s elected before the old leader %s's Lost fired", second.who, first.who)
	}
	if !lost.Before(second.at) {
		t.Fatalf("old leader lost at %v, new leader elected at %v", lost, second.at)
	}
	if !errors.Is(context.Cause(first.ld.Context()), client.ErrLeaseLost) {
		t.Fatalf("old leader's cause %v", context.Cause(first.ld.Context()))
	}
	if second.ld.Token() <= first.ld.Token() {
		t.Fatalf("new leader's token %d, old %d", second.ld.Token(), first.ld.Token())
	}
	if err := guard.Check(ctx, second.ld.FenceKey(), second.ld.Token()); err != nil {
		t.Fatal(err)
	}
	if err := guard.Check(ctx, first.ld.FenceKey(), first.ld.Token()); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("the old leader's late write: %v, want ErrStaleToken", err)
	}
	// Exactly one new leader: the third candidate still waits.
	select {
	case r := <-results:
		t.Fatalf("%s elected too (%v) while %s leads", r.who, r.err, second.who)
	case <-time.After(2 * ttl):
	}
	leader, err = observer.Leader(ctx)
	if err != nil || leader.Value != "host-"+second.who || leader.Token != second.ld.Token() {
		t.Fatalf("Leader: %+v %v, want %s's", leader, err, second.who)
	}
	cancelCampaigns()
	third := <-results
	if !errors.Is(third.err, context.Canceled) || third.ld != nil {
		t.Fatalf("the third campaign after its ctx ended: %v", third.err)
	}
	// Campaign returned at once; the cancel of its request may still be
	// on its way (the client sends it in the background): Close waits.
	if err := clients[third.who].Close(); err != nil {
		t.Fatal(err)
	}
	if err := second.ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := observer.Leader(ctx); !errors.Is(err, client.ErrNoLeader) {
		t.Fatalf("Leader after the last resigned and the other gave up: %v, want ErrNoLeader", err)
	}
}

// newCaller returns a client on a caller's connection of its own.
func newCaller(t *testing.T, env *testenv.Env) *client.Client {
	t.Helper()
	c, err := client.New(env.Connect())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Resign hands the election to the next candidate at once, not after a
// TTL; Proclaim changes the value and keeps the token; a second Campaign
// of a leading Election returns its leadership.
func TestElectionResignHandsOverAtOnce(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	const name = "elect/resign"
	a := newElection(t, c, name, client.TTL(30*time.Second))
	b := newElection(t, newCaller(t, env), name, client.TTL(30*time.Second))

	la, err := a.Campaign(ctx, "a:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Proclaim(ctx, "a:2"); err != nil {
		t.Fatal(err)
	}
	if la.Value() != "a:2" {
		t.Fatalf("value after Proclaim %q", la.Value())
	}
	leader, err := b.Leader(ctx)
	if err != nil || leader.Value != "a:2" || leader.Token != la.Token() {
		t.Fatalf("Leader after Proclaim: %+v %v (token %d)", leader, err, la.Token())
	}
	again, err := a.Campaign(ctx, "a:3")
	if err != nil || again != la || la.Value() != "a:3" {
		t.Fatalf("second Campaign of the leader: %p %v, want %p with value a:3 (%q)", again, err, la, la.Value())
	}
	if err := b.Proclaim(ctx, "b"); !errors.Is(err, client.ErrNotLeader) {
		t.Fatalf("Proclaim of a non-leader: %v", err)
	}

	got := make(chan campaignResult, 1)
	go func() {
		ld, err := b.Campaign(ctx, "b:1")
		got <- campaignResult{ld: ld, err: err, at: time.Now()}
	}()
	waitWaiters(t, ctx, c, name, 1, 10*time.Second, "b never queued")
	resigned := time.Now()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	isLost(t, "resigned leadership", la.Lost())
	if !errors.Is(context.Cause(la.Context()), client.ErrReleased) {
		t.Fatalf("cause after Resign %v", context.Cause(la.Context()))
	}
	var r campaignResult
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("b not elected within 10s of a's resignation")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	// At once, not after a's 30s TTL: a wide bound tells them apart on
	// a busy machine too.
	if took := r.at.Sub(resigned); took > 10*time.Second {
		t.Fatalf("b elected %v after a resigned: not at once", took)
	}
	if r.ld.Token() <= la.Token() {
		t.Fatalf("b's token %d, a's %d", r.ld.Token(), la.Token())
	}
	if err := a.Proclaim(ctx, "a:4"); !errors.Is(err, client.ErrNotLeader) {
		t.Fatalf("Proclaim after Resign: %v", err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("second Resign: %v", err)
	}
	if err := la.Proclaim(ctx, "a:5"); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("Proclaim of a resigned leadership: %v", err)
	}
	if err := r.ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// nextChange reads the next change from ch within d.
func nextChange(t *testing.T, ch <-chan client.LeaderChange, d time.Duration) client.LeaderChange {
	t.Helper()
	select {
	case c, ok := <-ch:
		if !ok {
			t.Fatal("Observe's channel closed")
		}
		return c
	case <-time.After(d):
		t.Fatalf("no change in %v", d)
	}
	return client.LeaderChange{}
}

// Observe starts with the current state and then sees every change, in
// order; it closes its channel when its ctx ends.
func TestElectionObserveSeesEveryChangeInOrder(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	const name = "elect/observe"
	octx, stop := context.WithCancel(ctx)
	watcher := newElection(t, newCaller(t, env), name)
	changes := watcher.Observe(octx)
	if ch := nextChange(t, changes, 10*time.Second); ch.Leader || ch.Event != streams.EventEnded || !ch.Resync {
		t.Fatalf("first change %+v, want no leader from a status read", ch)
	}
	// The subscription's interest reaches every node: an event published
	// before it would be dropped.
	env.WaitInterest(devcluster.Account, streams.EventSubject(streams.DefaultPrefix, name))

	a := newElection(t, c, name, client.TTL(30*time.Second))
	b := newElection(t, newCaller(t, env), name, client.TTL(30*time.Second))
	la, err := a.Campaign(ctx, "a:1")
	if err != nil {
		t.Fatal(err)
	}
	want := func(leader bool, token uint64, value, event string) {
		t.Helper()
		ch := nextChange(t, changes, 10*time.Second)
		if ch.Leader != leader || ch.Token != token || ch.Value != value || ch.Event != event || ch.Resync || ch.Revision == 0 {
			t.Fatalf("change %+v, want leader %v token %d value %q event %s from an event", ch, leader, token, value, event)
		}
	}
	want(true, la.Token(), "a:1", streams.EventElected)
	for _, v := range []string{"a:2", "a:3", "a:4"} {
		if err := la.Proclaim(ctx, v); err != nil {
			t.Fatal(err)
		}
		want(true, la.Token(), v, streams.EventProclaimed)
	}
	got := make(chan campaignResult, 1)
	go func() {
		ld, err := b.Campaign(ctx, "b:1")
		got <- campaignResult{ld: ld, err: err}
	}()
	waitWaiters(t, ctx, c, name, 1, 10*time.Second, "b never queued")
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	// The hand-over: a's end (when its event comes first), then b.
	ch := nextChange(t, changes, 10*time.Second)
	if ch.Event == streams.EventEnded {
		if ch.Leader || ch.Token != la.Token() || ch.Resync {
			t.Fatalf("a's end %+v", ch)
		}
		ch = nextChange(t, changes, 10*time.Second)
	}
	if !ch.Leader || ch.Token != r.ld.Token() || ch.Value != "b:1" || ch.Event != streams.EventElected || ch.Resync {
		t.Fatalf("change %+v, want b elected with token %d", ch, r.ld.Token())
	}
	if err := r.ld.Proclaim(ctx, "b:2"); err != nil {
		t.Fatal(err)
	}
	want(true, r.ld.Token(), "b:2", streams.EventProclaimed)
	if err := r.ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	want(false, r.ld.Token(), "", streams.EventEnded)

	// Nothing more, not even from the periodic status reads.
	select {
	case ch := <-changes:
		t.Fatalf("unexpected change %+v", ch)
	case <-time.After(6 * time.Second):
	}
	stop()
	select {
	case _, ok := <-changes:
		if ok {
			t.Fatal("a change after ctx ended")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Observe's channel not closed after ctx ended")
	}
}

// An observer that misses events (its connection cut while the leader
// changes) catches up with a status read once it is back.
func TestElectionObserveResyncsAfterAGap(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	const name = "elect/gap"
	p, oc := viaProxy(t, env, 1)
	changes := newElection(t, oc, name).Observe(ctx)
	if ch := nextChange(t, changes, 10*time.Second); ch.Leader {
		t.Fatalf("first change %+v, want no leader", ch)
	}
	p.Cut()
	a := newElection(t, c, name, client.TTL(30*time.Second))
	la, err := a.Campaign(ctx, "a:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Proclaim(ctx, "a:2"); err != nil {
		t.Fatal(err)
	}
	p.Heal()
	var ch client.LeaderChange
	for ch.Value != "a:2" {
		ch = nextChange(t, changes, 10*time.Second)
	}
	if !ch.Leader || ch.Token != la.Token() || !ch.Resync || ch.Event != streams.EventElected {
		t.Fatalf("change after the gap %+v, want a elected (a:2) from a status read", ch)
	}
	// Events flow again.
	if err := la.Proclaim(ctx, "a:3"); err != nil {
		t.Fatal(err)
	}
	if ch := nextChange(t, changes, 10*time.Second); ch.Value != "a:3" || ch.Event != streams.EventProclaimed {
		t.Fatalf("change %+v, want a:3 proclaimed", ch)
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// A leadership held in a session ends with the session: the next
// candidate is elected when it is closed.
func TestSessionElection(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	const name = "elect/session"
	s, err := c.NewSession(ctx, client.SessionTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.NewElection(name, client.TTL(time.Second)); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("TTL with a session: %v", err)
	}
	a, err := s.NewElection(name)
	if err != nil {
		t.Fatal(err)
	}
	la, err := a.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	leader, err := a.Leader(ctx)
	if err != nil || !leader.InSession || leader.Token != la.Token() || leader.Value != "a" {
		t.Fatalf("Leader %+v %v", leader, err)
	}
	if err := la.Proclaim(ctx, "a2"); err != nil {
		t.Fatalf("Proclaim in a session: %v", err)
	}
	if leader, err := a.Leader(ctx); err != nil || leader.Value != "a2" || leader.Token != la.Token() {
		t.Fatalf("Leader after Proclaim in a session: %+v %v", leader, err)
	}
	notLost(t, "leadership", la.Lost(), la.Context())
	b := newElection(t, newCaller(t, env), name)
	got := make(chan campaignResult, 1)
	go func() {
		ld, err := b.Campaign(ctx, "b")
		got <- campaignResult{ld: ld, err: err}
	}()
	waitWaiters(t, ctx, c, name, 1, 10*time.Second, "b never queued")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	isLost(t, "leadership of a closed session", la.Lost())
	select {
	case r := <-got:
		if r.err != nil || r.ld.Token() <= la.Token() {
			t.Fatalf("b: %v, token %d after %d", r.err, r.ld.Token(), la.Token())
		}
		_ = r.ld.Resign(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("b not elected after a's session closed")
	}
}

// Bad names and values are refused before anything is sent.
func TestElectionValidation(t *testing.T) {
	_, nc, c := setup(t)
	ctx := ctxT(t, 30*time.Second)
	if _, err := c.NewElection("bad#name"); !errors.Is(err, client.ErrInvalidOption) || !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := c.NewElection("elect/ok", client.TTL(0)); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("bad option: %v", err)
	}
	e := newElection(t, c, "elect/validation")
	for _, v := range []string{"", strings.Repeat("v", streams.MaxValueLen+1), "line\nbreak"} {
		ld, err := e.Campaign(ctx, v)
		if !errors.Is(err, client.ErrInvalidOption) || !errors.Is(err, client.ErrInvalidRequest) || ld != nil {
			t.Fatalf("Campaign with value %.20q: %v", v, err)
		}
		if !strings.Contains(err.Error(), "value") {
			t.Fatalf("the error does not say what is wrong: %v", err)
		}
	}
	if st, err := c.Status(ctx, "elect/validation"); err != nil || st.Held || st.Waiters != 0 {
		t.Fatalf("a refused campaign left %+v %v", st, err)
	}
	// The largest value is fine, and the service refuses a larger one too.
	ld, err := e.Campaign(ctx, strings.Repeat("v", streams.MaxValueLen))
	if err != nil {
		t.Fatal(err)
	}
	if err := ld.Proclaim(ctx, strings.Repeat("w", streams.MaxValueLen+1)); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("Proclaim of a value too large: %v", err)
	}
	notLost(t, "leadership", ld.Lost(), ld.Context())
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	msg, err := nc.Request(streams.Subject(streams.DefaultPrefix, streams.OpAcquire),
		[]byte(`{"resource":"elect/validation","request_id":"r1","value":"`+strings.Repeat("v", streams.MaxValueLen+1)+`"}`), 5*time.Second)
	if err != nil || msg.Header.Get(streams.HeaderErrorCode) != "400" {
		t.Fatalf("the service's answer to a value too large: %v %q", err, msgText(msg))
	}
}

func msgText(m *nats.Msg) string {
	if m == nil {
		return ""
	}
	return string(m.Data)
}
