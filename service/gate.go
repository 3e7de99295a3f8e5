package service

import (
	"container/heap"
	"container/list"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"golang.org/x/time/rate"

	"github.com/jetlock/jetlock/streams"
)

// A request's way in, before it is decided: the transport and admission.
// Requests arrive through micro endpoints (addEndpoints); dispatch drops
// those whose reply subject the service must not publish on, admit checks
// the body's size and the sender (as the NATS server names it: origin)
// and has the body decoded once (request.go), and the gate admits requests
// in order of urgency and sheds what cannot be served in time. Workers run
// the admitted requests within their deadlines; the fair-use limits of
// each owner and tenant (limits) are charged on the way. The handlers,
// which hand a decoded request to the engine, and the replies are in
// request.go.

// addEndpoints registers one micro endpoint per operation on svc.
func (s *Service) addEndpoints(svc micro.Service) error {
	grp := svc.AddGroup(s.cfg.Prefix + "." + streams.APIVersion)
	for _, op := range streams.Operations {
		// micro endpoint names allow no dots: "admin.revoke" is endpoint
		// admin_revoke on subject <prefix>.v1.admin.revoke.
		name := strings.ReplaceAll(op, ".", "_")
		if err := grp.AddEndpoint(name, micro.HandlerFunc(func(r micro.Request) { s.dispatch(op, r) }), micro.WithEndpointSubject(op)); err != nil {
			return fmt.Errorf("add endpoint %s: %w", op, err)
		}
	}
	return nil
}

// replyAllowed reports whether the service may publish a reply on subject.
// It never publishes on a subject that starts with '$' (the JetStream, KV
// and system APIs) or lies under its own prefix (its request, wake and
// heartbeat subjects), nor on one that is not a valid subject: a request
// names its reply subject, and a reply published there would act with the
// service's rights. A request without a reply subject (a plain publish) is
// not executed either: nobody could learn its outcome, a lease it granted
// would be nobody's, and it would cost a write for nothing.
func (s *Service) replyAllowed(subject string) bool {
	if subject == "" {
		return false
	}
	if subject[0] == '$' || subject == s.cfg.Prefix || strings.HasPrefix(subject, s.cfg.Prefix+".") {
		return false
	}
	return !strings.ContainsAny(subject, "*> \t\r\n") && !strings.Contains(subject, "..") &&
		subject[0] != '.' && subject[len(subject)-1] != '.'
}

// dispatch answers a request in a worker goroutine, so that one slow store
// round trip never holds up the subscription. A request whose reply
// subject the service must not publish on is dropped before any work, and
// a body over the cap (Config.MaxBodyBytes) is refused before it is decoded. The body is
// then decoded once (decodeCall), and that call is what the gate ranks,
// fair use charges and the handler serves. The gate bounds the requests
// processed at once (MaxInFlight) and queues the next MaxQueued; beyond
// those, or after QueueWait in the queue, the service sheds load: it
// answers unavailable rather than letting requests queue until their
// callers have given up. Renewals and releases of leases the instance
// knows go first, the lease closest to expiry first, and while any wait,
// other requests are shed at once.
func (s *Service) dispatch(op string, r micro.Request) {
	if !s.replyAllowed(r.Reply()) {
		s.report.refusedReply(op, r.Reply())
		return
	}
	received := time.Now()
	c, oe := s.admit(op, r)
	if oe != nil {
		s.replyError(r, oe)
		s.report.request(op, oe.code, time.Since(received))
		return
	}
	s.dispatched.Add(1)
	s.inflight.Add(1)
	s.gate.enter(pending{
		at:     received,
		urgent: c.known,
		due:    c.due,
		run: func(sl *slot) {
			defer func() {
				sl.release()
				s.inflight.Done()
			}()
			resp, err := s.serve(s.deadlines.get(received), c, sl)
			code := ""
			if err != nil {
				oe := toOpError(err)
				code = oe.code
				if oe.code == streams.CodeInternal {
					s.log.Error("internal error", "op", op, "err", err)
				}
				s.replyError(r, oe)
			} else {
				s.replyJSON(r, resp)
			}
			s.report.request(op, code, time.Since(received))
		},
		shed: func(reason string, waited time.Duration) {
			defer s.inflight.Done()
			s.replyError(r, s.shedError(reason, waited))
			s.report.shed(op, reason, waited)
		},
	})
}

// admit checks a request's size and sender and decodes it, or returns the
// answer that refuses it. A tenant with no fair-use token left is refused
// before its body is decoded, unless the request may be free (a renewal,
// release or keepalive of a lease it holds), which is decoded first to
// tell.
func (s *Service) admit(op string, r micro.Request) (*call, *opError) {
	if n, limit := len(r.Data()), s.maxBody; n > limit {
		return nil, newOpError(streams.CodeInvalidRequest, "body of %d bytes: at most %d", n, limit)
	}
	who := s.requestOrigin(r.Headers())
	if n := len(who.tenant()); n > streams.MaxTenantLen {
		// Records carry the tenant, and a record with a longer one would
		// read as foreign: nobody's lease, its key blocked.
		return nil, newOpError(streams.CodeInvalidRequest, "the sender's account and user name take %d bytes: at most %d", n, streams.MaxTenantLen)
	}
	if !mayBeFree(op) && !who.operator {
		if err := s.limits.spent(who); err != nil {
			return nil, toOpError(err)
		}
	}
	c, err := s.decodeCall(op, r.Data(), who)
	if err != nil {
		return nil, toOpError(err)
	}
	if !c.known && c.cost > 0 && mayBeFree(op) {
		if err := s.limits.spent(who); err != nil {
			return nil, toOpError(err)
		}
	}
	return c, nil
}

// shedError is the answer to a request the gate shed for reason.
func (s *Service) shedError(reason string, waited time.Duration) *opError {
	var oe *opError
	switch reason {
	case shedWaited:
		oe = newOpError(streams.CodeUnavailable, "service overloaded: the request waited %v for one of %d places; retry with backoff", waited.Round(time.Millisecond), s.cfg.MaxInFlight)
	case shedUrgent:
		oe = newOpError(streams.CodeUnavailable, "service overloaded: renewals go first; retry with backoff")
	default:
		oe = newOpError(streams.CodeUnavailable, "service overloaded: %d requests in progress and %d queued; retry with backoff", s.cfg.MaxInFlight, s.cfg.MaxQueued)
	}
	oe.retryAfter = s.shedRetryAfter()
	return oe
}

// shedRetryAfter is the retry_after_ms of a shed request: a quarter of the
// queue wait, jittered, so that shed callers do not come back together.
func (s *Service) shedRetryAfter() time.Duration {
	base := max(s.cfg.QueueWait/4, 50*time.Millisecond)
	return base/2 + rand.N(base)
}

// requestInfoHeader is the header in which the NATS server stamps who sent
// a request that crosses an account import (nats-server's ClientInfoHdr).
const requestInfoHeader = "Nats-Request-Info"

// requestOrigin returns who sent a request, from the Nats-Request-Info
// header the NATS server sets on requests that cross an account import
// (deploy/ makes callers and operators reach the service that way, and the
// server replaces whatever header of that name the sender set, so the
// header is the server's word, not the caller's). Within the service's own
// account nothing is stamped: there only the service's users may publish
// requests (see deploy/).
//
// A connection's header is the same on each of its requests (until the
// server updates its round-trip time), so the origins of the last headers
// seen are kept (origins) rather than decoded on every request.
func (s *Service) requestOrigin(h micro.Headers) origin {
	info := nats.Header(h).Get(requestInfoHeader)
	if info == "" {
		return origin{}
	}
	if o, ok := s.origins.get(info); ok {
		return o
	}
	var ci struct {
		Account string `json:"acc"`
		User    string `json:"user"`
	}
	if jsonv2.Unmarshal([]byte(info), &ci, jsonv2.RejectUnknownMembers(false)) != nil {
		return origin{}
	}
	o := origin{account: ci.Account, user: ci.User}
	o.operator = s.isOperator(o)
	s.origins.put(info, o)
	return o
}

// originCache maps Nats-Request-Info headers to what they say. It holds at
// most maxOrigins headers: when full it starts again empty, so a flood of
// new connections costs decoding, never memory.
type originCache struct {
	mu sync.RWMutex
	m  map[string]origin
}

const maxOrigins = 4096

func (c *originCache) get(info string) (origin, bool) {
	c.mu.RLock()
	o, ok := c.m[info]
	c.mu.RUnlock()
	return o, ok
}

func (c *originCache) put(info string, o origin) {
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxOrigins {
		c.m = make(map[string]origin)
	}
	c.m[info] = o
	c.mu.Unlock()
}

// isOperator reports whether o is on the operator list.
func (s *Service) isOperator(o origin) bool {
	if o.account == "" {
		return false
	}
	for _, op := range s.cfg.Operators {
		acc, user, one := strings.Cut(op, "/")
		if acc == o.account && (!one || user == o.user) {
			return true
		}
	}
	return false
}

// origin is who sent a request, as the NATS server vouched for it on an
// account import (the Nats-Request-Info header); empty when unknown.
// operator is set when that identity is on the service's operator list.
type origin struct {
	account, user string
	operator      bool
}

// tenant names the caller whose leases and waits a request may touch by
// request id: "ACCOUNT/user", or empty for a request that crossed no
// import (every such caller is one tenant). A '/' or '%' inside either
// name is written %2F or %25, so that no two (account, user) pairs give
// one tenant: account X with user y/z is "X/y%2Fz", account X/y with user
// z "X%2Fy/z". Names without them, all that deploy/ uses, read as before.
func (o origin) tenant() string {
	if o.account == "" && o.user == "" {
		return ""
	}
	return escapeTenantPart(o.account) + "/" + escapeTenantPart(o.user)
}

// escapeTenantPart writes '%' and '/' of a tenant's account or user name
// as %25 and %2F.
func escapeTenantPart(name string) string {
	if !strings.ContainsAny(name, "%/") {
		return name
	}
	return strings.NewReplacer("%", "%25", "/", "%2F").Replace(name)
}

// sees reports whether o may see the owner of rec: its own tenant's
// records, and every record for an operator.
func (o origin) sees(rec *streams.Record) bool {
	return o.operator || rec.Tenant == o.tenant()
}

// ownerFor returns rec's owner as who may see it: empty for another
// tenant's lease.
func ownerFor(rec *streams.Record, who origin) string {
	if who.sees(rec) {
		return rec.Owner
	}
	return ""
}

// Admission: the gate, the workers that run admitted requests, the
// deadlines that bound each one's work, and the fair-use limits.

// Reasons a request is shed, the label of jetlock_requests_shed_total.
const (
	shedQueueFull = "queue_full" // MaxQueued requests were already waiting
	shedWaited    = "waited"     // it waited longer than QueueWait for its turn
	shedUrgent    = "renewals"   // renewals and releases were waiting: they go first
)

// gate admits requests for processing: at most limit at once; beyond that
// up to maxQueued wait in arrival order. A request whose turn comes after it
// has waited longer than maxWait is shed then, before it has done any store
// work, so that under overload the stream serves only requests whose callers
// are still waiting, and the queue in front of it drains at once.
//
// The queue is what lets a busy instance ride out a stall of its stream (a
// slow fsync, a paused virtual machine) without shedding, while the bound on
// requests processed at once keeps the stream's own queue short: a request
// that times out inside the stream has used it for nothing.
//
// Renewals and releases are urgent: they wait in a queue of their own,
// ordered by when their lease would expire (the closest first), and every
// free place goes to them before any other request. While any of them
// wait, a new request of another kind is shed at once rather than queued:
// under saturation the leases already held are kept, and new work is
// turned away early with a retry_after_ms, before it has cost anything.
type gate struct {
	limit, maxQueued int
	maxWait          time.Duration
	spawn            func(func())
	queuedGauge      func(int) // reports the queue length, or nil

	mu      sync.Mutex
	running int
	queue   []pending // queue[head:] wait, oldest first
	head    int
	urgent  urgentQueue
}

// pending is a request waiting for its turn.
type pending struct {
	at   time.Time   // receipt
	run  func(*slot) // processes it; must release the slot
	shed func(reason string, waited time.Duration)
	// urgent marks a renewal or release, due when its lease expires.
	urgent bool
	due    time.Time
}

// slot is a request's place among those processed at once. A waiting
// acquire gives it back while it waits.
type slot struct {
	once sync.Once
	g    *gate
}

func (sl *slot) release() { sl.once.Do(sl.g.leave) }

// enter runs p at once (through spawn) if fewer than limit requests are
// being processed, queues it if fewer than maxQueued wait, and otherwise
// sheds it.
func (g *gate) enter(p pending) {
	g.mu.Lock()
	switch {
	case g.running < g.limit && (p.urgent || len(g.urgent) == 0):
		g.running++
		g.mu.Unlock()
		g.start(p)
	case p.urgent && len(g.urgent) < max(g.maxQueued, 1):
		heap.Push(&g.urgent, p)
		g.report()
		g.mu.Unlock()
	case p.urgent:
		g.mu.Unlock()
		p.shed(shedQueueFull, 0)
	case len(g.urgent) > 0:
		g.mu.Unlock()
		p.shed(shedUrgent, 0)
	case len(g.queue)-g.head < g.maxQueued:
		g.queue = append(g.queue, p)
		g.report()
		g.mu.Unlock()
	default:
		g.mu.Unlock()
		p.shed(shedQueueFull, 0)
	}
}

func (g *gate) start(p pending) {
	g.spawn(func() { p.run(&slot{g: g}) })
}

// leave hands a finished request's place to the most urgent queued
// renewal or release, or else to the oldest queued request, that has not
// waited too long, shedding those that have.
func (g *gate) leave() {
	now := time.Now()
	var late []pending
	var next pending
	found := false
	g.mu.Lock()
	for len(g.urgent) > 0 && !found {
		p := heap.Pop(&g.urgent).(pending)
		if now.Sub(p.at) > g.maxWait {
			late = append(late, p)
		} else {
			next, found = p, true
		}
	}
	for g.head < len(g.queue) && !found {
		p := g.queue[g.head]
		g.queue[g.head] = pending{}
		g.head++
		if now.Sub(p.at) > g.maxWait {
			late = append(late, p)
		} else {
			next, found = p, true
		}
	}
	switch {
	case g.head == len(g.queue):
		g.queue, g.head = g.queue[:0], 0
	case g.head >= 1024 && 2*g.head >= len(g.queue):
		// Reuse the front half of the backing array.
		n := copy(g.queue, g.queue[g.head:])
		clear(g.queue[n:])
		g.queue, g.head = g.queue[:n], 0
	}
	if !found {
		g.running--
	}
	if len(late) > 0 || found {
		g.report()
	}
	g.mu.Unlock()
	for _, p := range late {
		p.shed(shedWaited, now.Sub(p.at))
	}
	if found {
		g.start(next)
	}
}

// report passes the queue length to queuedGauge; g.mu is held.
func (g *gate) report() {
	if g.queuedGauge != nil {
		g.queuedGauge(len(g.queue) - g.head + len(g.urgent))
	}
}

// load returns the requests being processed and those waiting.
func (g *gate) load() (running, queued int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running, len(g.queue) - g.head + len(g.urgent)
}

// urgentQueue is a heap of urgent requests, the earliest due first (in
// arrival order among equals).
type urgentQueue []pending

func (q urgentQueue) Len() int { return len(q) }
func (q urgentQueue) Less(i, j int) bool {
	if !q[i].due.Equal(q[j].due) {
		return q[i].due.Before(q[j].due)
	}
	return q[i].at.Before(q[j].at)
}
func (q urgentQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *urgentQueue) Push(x any)   { *q = append(*q, x.(pending)) }
func (q *urgentQueue) Pop() any {
	old := *q
	p := old[len(old)-1]
	old[len(old)-1] = pending{}
	*q = old[:len(old)-1]
	return p
}

// workerIdle is how long a worker waits for another request before it
// exits: between one and two times this.
const workerIdle = 10 * time.Second

// workers runs requests on goroutines kept for the next request, because
// a fresh goroutine grows its stack several times over during a request,
// copying it each time.
//
// The idle workers form a stack: a request goes to the worker that became
// idle last. Handed out in turn instead, every worker that a burst once
// created would stay in use, and the collector, which shrinks the stacks
// of parked goroutines at each cycle, would have each of them grow its
// stack again on its next request; handed out last-in first-out, only as
// many workers as the load needs stay in use, and the rest exit.
type workers struct {
	done <-chan struct{} // closed when the service has finished: workers exit

	mu   sync.Mutex
	idle []*worker // idle[len-1] became idle last
	tick uint64    // periods of idle seen by reap
}

// worker is one worker goroutine; it receives its next request on next, or
// nil when it is to exit.
type worker struct {
	next chan func()
	tick uint64 // the pool's tick when it last became idle
}

// newWorkers returns a pool whose workers exit when done is closed, and,
// while reap runs, after one to two idle periods without a request.
func newWorkers(done <-chan struct{}) *workers {
	return &workers{done: done}
}

// spawn runs f on the worker that became idle last, or on a new one.
func (p *workers) spawn(f func()) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.next <- f // buffered: only spawn sends, to a worker it took off idle
		return
	}
	p.mu.Unlock()
	go p.run(&worker{next: make(chan func(), 1)}, f)
}

// run runs f and then the requests spawn hands w.
func (p *workers) run(w *worker, f func()) {
	for f != nil {
		f()
		p.mu.Lock()
		w.tick = p.tick
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		select {
		case f = <-w.next:
		case <-p.done:
			if p.remove(w) {
				return
			}
			// spawn took it off idle and is handing it a request, or
			// reap did, just before done, and is telling it to exit.
			f = <-w.next
		}
	}
}

// remove takes w off the idle stack, and reports whether it was there.
func (p *workers) remove(w *worker) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.Index(p.idle, w)
	if i < 0 {
		return false
	}
	p.idle = slices.Delete(p.idle, i, i+1)
	return true
}

// reap tells the workers that stayed idle for a whole period to exit,
// until done is closed. The longest idle are at the bottom of the stack,
// so it takes them from there. It needs no timer per request: a worker's
// idle start is the tick it became idle in.
func (p *workers) reap(period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-p.done:
			return
		}
		p.mu.Lock()
		n := 0
		for n < len(p.idle) && p.idle[n].tick < p.tick {
			p.idle[n].next <- nil
			n++
		}
		p.idle = slices.Delete(p.idle, 0, n)
		p.tick++
		p.mu.Unlock()
	}
}

// deadlineStep is the granularity of the requests' shared deadlines.
const deadlineStep = 10 * time.Millisecond

// deadlines hands out the contexts that bound a request's store work:
// each ends budget after the request was received, rounded up to the next
// deadlineStep, and requests received in the same step share one. A
// context of its own per request cost a timer and three allocations on
// every request, about a sixth of what the service allocated at the design
// load.
//
// The budget counts from receipt, so the time a request waited in the
// queue is taken from the same budget as its store work: a request that
// did not wait has the whole of it for a slow stretch of the stream.
//
// Deadlines are counted on the monotonic clock from base, so a step of the
// wall clock moves none of them.
type deadlines struct {
	budget time.Duration
	base   time.Time // carries a monotonic reading

	mu sync.Mutex
	// The two latest steps' contexts: requests received at about the same
	// time are handled in a slightly different order, so around a step's
	// end both are asked for.
	cur, prev shared
}

// shared is one step's context.
type shared struct {
	step   int64 // of the deadline, counted from base
	ctx    context.Context
	cancel context.CancelFunc // ctx's; it ends at its deadline anyway
}

func newDeadlines(budget time.Duration) *deadlines {
	return &deadlines{budget: budget, base: time.Now()}
}

// get returns a context that ends between budget and budget+deadlineStep
// after received.
func (d *deadlines) get(received time.Time) context.Context {
	step := int64((received.Sub(d.base)+d.budget)/deadlineStep) + 1
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.cur.ctx != nil && step == d.cur.step:
		return d.cur.ctx
	case d.prev.ctx != nil && step == d.prev.step:
		return d.prev.ctx
	}
	sh := shared{step: step}
	sh.ctx, sh.cancel = context.WithDeadline(context.Background(), d.base.Add(time.Duration(step)*deadlineStep))
	switch {
	case d.cur.ctx == nil || step > d.cur.step:
		d.prev, d.cur = d.cur, sh
	case step > d.prev.step:
		d.prev = sh
	}
	return sh.ctx
}

// limits is fair use: acquires (waiting or not) are limited per owner, and
// every operation per NATS user (tenant) by its cost (opCost), each with a
// token bucket of rate r per second and burst 2r, so that one noisy caller
// cannot take every place from the others. A caller over its rate is
// answered unavailable with retry_after_ms.
//
// Owners are chosen by callers, so the buckets live in an LRU set of at
// most maxLimited keys: a caller that sends a new owner with every request
// evicts only idle buckets, and each new owner starts with a fresh one —
// the per-user limit, whose keys the NATS server vouches for, is what
// bounds such a caller.
type limits struct {
	perOwner, perUser float64
	tenantRates       map[string]float64 // overrides of perUser: "ACCOUNT/user" or "ACCOUNT"
	refused           func(scope string)

	mu    sync.Mutex
	byKey map[string]*list.Element
	lru   *list.List // of *limited, most recent first
}

const maxLimited = 100_000

type limited struct {
	key string
	lim *rate.Limiter
}

func newLimits(perOwner, perUser float64, tenantRates map[string]float64, refused func(scope string)) *limits {
	return &limits{perOwner: perOwner, perUser: perUser, tenantRates: tenantRates, refused: refused,
		byKey: map[string]*list.Element{}, lru: list.New()}
}

// userRate returns the rate of who's tenant: its own (TenantRates names it,
// or its account), else the default; 0 means no limit.
func (l *limits) userRate(who origin) float64 {
	if r, ok := l.tenantRates[who.tenant()]; ok {
		return r
	}
	if r, ok := l.tenantRates[who.account]; ok {
		return r
	}
	return l.perUser
}

// allow takes one token from the owner's bucket (for an acquire, which
// names an owner) and cost tokens from the tenant's, or returns the
// unavailable answer with the wait until they are free.
func (l *limits) allow(owner string, who origin, cost float64) error {
	if l.perOwner > 0 && owner != "" {
		if err := l.take("owner", "o\x00"+owner, l.perOwner, 1); err != nil {
			return err
		}
	}
	if who.tenant() == "" {
		return nil
	}
	if r := l.userRate(who); r > 0 {
		if err := l.take("user", "u\x00"+who.account+"\x00"+who.user, r, int(max(1, cost))); err != nil {
			return err
		}
	}
	return nil
}

// spent reports whether who's tenant has no token left at all: every
// request it sends but the renewal or release of a lease it holds would be
// refused. dispatch refuses those at once, before a place, a goroutine or
// a decode is spent on them, so that a tenant flooding far beyond its rate
// costs the others as little as possible. The answer is the one allow
// would give.
func (l *limits) spent(who origin) error {
	if who.tenant() == "" {
		return nil
	}
	r := l.userRate(who)
	if r <= 0 {
		return nil
	}
	now := time.Now()
	key := "u\x00" + who.account + "\x00" + who.user
	l.mu.Lock()
	e, ok := l.byKey[key]
	var tokens float64
	if ok {
		tokens = e.Value.(*limited).lim.TokensAt(now)
	}
	l.mu.Unlock()
	if !ok || tokens >= 1 {
		return nil
	}
	l.refused("user")
	delay := time.Duration((1 - tokens) / r * float64(time.Second))
	return &opError{code: streams.CodeUnavailable, retryAfter: max(delay, time.Millisecond),
		msg: fmt.Sprintf("fair use: this user sends operations (weighted by cost) faster than %g a second; retry after %v", r, delay.Round(time.Millisecond))}
}

func (l *limits) take(scope, key string, r float64, n int) error {
	now := time.Now()
	l.mu.Lock()
	lim := l.limiter(key, r)
	res := lim.ReserveN(now, min(n, lim.Burst())) // a cost over the burst could never be paid
	delay := res.DelayFrom(now)
	if delay > 0 {
		res.CancelAt(now) // a refused request costs no token
	}
	l.mu.Unlock()
	if delay <= 0 {
		return nil
	}
	l.refused(scope)
	what := "operations (weighted by cost)"
	if scope == "owner" {
		what = "acquires"
	}
	return &opError{code: streams.CodeUnavailable, retryAfter: max(delay, time.Millisecond),
		msg: fmt.Sprintf("fair use: this %s sends %s faster than %g a second; retry after %v", scope, what, r, delay.Round(time.Millisecond))}
}

// limiter returns key's bucket, making it the most recent; l.mu is held.
func (l *limits) limiter(key string, r float64) *rate.Limiter {
	if e, ok := l.byKey[key]; ok {
		l.lru.MoveToFront(e)
		return e.Value.(*limited).lim
	}
	if l.lru.Len() >= maxLimited {
		old := l.lru.Back()
		l.lru.Remove(old)
		delete(l.byKey, old.Value.(*limited).key)
	}
	it := &limited{key: key, lim: rate.NewLimiter(rate.Limit(r), max(1, int(2*r)))}
	l.byKey[key] = l.lru.PushFront(it)
	return it.lim
}
