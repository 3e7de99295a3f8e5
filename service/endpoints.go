package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetlock/jetlock/streams"
)

// The transport: requests arrive through micro endpoints, pass the reply
// subject guard and the admission gate (gate.go), and are decoded,
// validated and handed to the lock logic (locks.go) on a worker goroutine
// (gate.go); the reply goes straight back on the request's reply
// subject.

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

// leaseCap refuses an acquire of a tenant that holds MaxLeasesPerTenant
// leases already (as this instance knows them).
func (s *Service) leaseCap(g *grantReq) error {
	if s.cfg.MaxLeasesPerTenant == 0 {
		return nil
	}
	if n := s.tracker.tenantLeaseCount(g.tenant); n >= s.cfg.MaxLeasesPerTenant {
		return newOpError(streams.CodeTooManyWaiters, "this NATS user holds %d leases, the cap", n)
	}
	return nil
}

// decode decodes a request body strictly and validates it.
func decode(data []byte, req interface{ Validate() error }) error {
	if err := streams.Decode(data, req); err != nil {
		return err
	}
	return req.Validate()
}

// setOf checks the resources of a request naming a lock set against the
// deployment's cap and returns them sorted.
func (s *Service) setOf(resources []string) ([]string, error) {
	return streams.NormalizeSet(resources, s.cfg.MaxSetSize)
}

// ttl converts a request's ttl_ms, checked against the bounds first.
func (s *Service) ttl(ms int64) (time.Duration, error) {
	if ms == 0 {
		return s.cfg.DefaultTTL, nil
	}
	if ms < s.cfg.MinTTL.Milliseconds() || ms > s.cfg.MaxTTL.Milliseconds() {
		return 0, fmt.Errorf("%w: ttl_ms %d outside [%d, %d]", streams.ErrInvalid, ms, s.cfg.MinTTL.Milliseconds(), s.cfg.MaxTTL.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// maxHold converts a request's max_hold_ms (0: the deployment's cap),
// checked against the bounds first.
func (s *Service) maxHold(ms int64) (time.Duration, error) {
	if ms == 0 {
		return 0, nil
	}
	limit := s.cfg.MaxHold
	if limit == 0 {
		limit = streams.MaxHoldCeiling
	}
	if ms < s.cfg.MinTTL.Milliseconds() || ms > limit.Milliseconds() {
		return 0, fmt.Errorf("%w: max_hold_ms %d outside [%d, %d]", streams.ErrInvalid, ms, s.cfg.MinTTL.Milliseconds(), limit.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
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

// replyJSON and replyError answer on the request's reply subject directly.
// They run in the request's own goroutine, after micro's handler has
// returned; micro's Respond and Error record the outcome in the request for
// its statistics without a lock, which would race with micro reading it.
// The price: micro's error counts stay zero (the Prometheus metrics and the
// endpoint stats data count results).
func (s *Service) replyJSON(r micro.Request, v any) {
	if a, ok := v.(appender); ok {
		buf := encode(a)
		defer buf.free()
		s.reply(&nats.Msg{Subject: r.Reply(), Data: buf.b})
		return
	}
	body, err := marshal(v)
	if err != nil {
		s.replyError(r, newOpError(streams.CodeInternal, "encode reply: %v", err))
		return
	}
	s.reply(&nats.Msg{Subject: r.Reply(), Data: body})
}

func (s *Service) replyError(r micro.Request, oe *opError) {
	body, _ := json.Marshal(streams.ErrorResponse{Error: streams.ErrorDetail{Code: oe.code, Message: oe.msg, Holder: oe.holder,
		Holders: oe.holders, RetryAfterMs: oe.retryAfter.Milliseconds()}})
	m := &nats.Msg{Subject: r.Reply(), Data: body, Header: nats.Header{}}
	m.Header.Set(micro.ErrorHeader, oe.msg)
	m.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(streams.StatusCode(oe.code)))
	s.reply(m)
}

func (s *Service) reply(m *nats.Msg) {
	if m.Subject == "" {
		return // a request without a reply subject (a plain publish)
	}
	if err := s.nc.PublishMsg(m); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		s.log.Warn("reply failed", "err", err)
	}
}

// marshal encodes a body that has no hand-written encoder (the bodies
// written on every request have theirs: see encode) with the
// encoding/json/v2 prototype. A value json/v2 refuses (a string that is
// not valid UTF-8, which validation keeps out of records and replies) goes
// through encoding/json, which replaces the bad bytes.
func marshal(v any) ([]byte, error) {
	if b, err := jsonv2.Marshal(v); err == nil {
		return b, nil
	}
	return json.Marshal(v)
}

// The lock's operations as the request path serves them (request.go).
// An election is a lock whose lease carries a value (elections.go).

// acquireLock serves the acquire of a lock or an election, and of a
// permit (decided as a lock's acquire, on the semaphore's queue: see
// trySem): the name's kind, the tenant's lease cap, then the decision,
// waiting or not.
func (s *Service) acquireLock(ctx context.Context, c *call, sl *slot) (any, error) {
	if err := s.locks.names.sameKind(c.resource, c.kind, c.limit, c.value); err != nil {
		return nil, err
	}
	if err := s.leaseCap(c.grant); err != nil {
		return nil, err
	}
	// Counted for the hot list once answered: reporting is no part of the
	// decision.
	defer s.report.touched(c.resource)
	if c.wait > 0 {
		return s.acquireWaiting(c.grant, c.wait, sl)
	}
	return s.locks.leases.acquire(ctx, c.grant)
}

// renewLock serves the renewal of a lock's lease (an election's leader
// proclaims with a value).
func (s *Service) renewLock(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.leases.renew(ctx, c.resource, c.leaseID, c.ttl, c.value, c.who)
}

// releaseLock serves the release of a lock's lease.
func (s *Service) releaseLock(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.leases.release(ctx, c.resource, c.leaseID, c.who)
}

// cancelLock serves the cancel of a lock's acquire.
func (s *Service) cancelLock(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.handover.cancel(ctx, c.resource, c.requestID, c.owner, c.who)
}

// statusLock serves the status of a name: a lock's or an election's, or
// a semaphore's when the name is one.
func (s *Service) statusLock(ctx context.Context, c *call, _ *slot) (any, error) {
	if u := s.locks.names.useOf(c.resource); u.limit != 0 && !u.lock && !u.election {
		sem, err := s.locks.sems.semaphoreStatus(c.resource, u.limit, c.who)
		if err != nil {
			return nil, err
		}
		return &streams.StatusResponse{Resource: sem.Resource, Held: sem.HeldPermits > 0, Waiters: sem.Waiters,
			Limit: sem.Limit, HeldPermits: sem.HeldPermits, Permits: sem.Permits}, nil
	}
	return s.locks.leases.status(ctx, c.resource, c.who)
}

// revokeLock serves an operator's revoke of a lock's lease.
func (s *Service) revokeLock(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.leases.revoke(ctx, c.resource, c.reason, c.who)
}

// list serves a page of the held leases.
func (s *Service) list(_ context.Context, c *call, _ *slot) (any, error) {
	return s.locks.leases.list(&c.list, c.who), nil
}

// The semaphore's operations as the request path serves them
// (request.go): each names the semaphore and its limit (acquire, cancel,
// status) or one of its permits (renew, release, revoke).

// acquirePermit serves the acquire of a permit: as a lock's, on the
// semaphore's queue (see acquireLock).
func (s *Service) acquirePermit(ctx context.Context, c *call, sl *slot) (any, error) {
	return s.acquireLock(ctx, c, sl)
}

// renewPermit serves the renewal of a permit's lease.
func (s *Service) renewPermit(ctx context.Context, c *call, _ *slot) (any, error) {
	resp, err := s.locks.leases.renew(ctx, streams.PermitResource(c.resource, c.permit), c.leaseID, c.ttl, c.value, c.who)
	return permitResponse(resp, c.resource, c.permit), err
}

// releasePermit serves the release of a permit's lease.
func (s *Service) releasePermit(ctx context.Context, c *call, _ *slot) (any, error) {
	resp, err := s.locks.leases.release(ctx, streams.PermitResource(c.resource, c.permit), c.leaseID, c.who)
	if resp != nil {
		resp.Resource = c.resource
	}
	return resp, err
}

// cancelPermit serves the cancel of a permit's acquire.
func (s *Service) cancelPermit(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.sems.cancelSem(ctx, c.resource, c.limit, c.requestID, c.owner, c.who)
}

// statusSemaphore serves the status of a semaphore.
func (s *Service) statusSemaphore(_ context.Context, c *call, _ *slot) (any, error) {
	if err := s.locks.names.sameKind(c.resource, kindSemaphore, c.limit, ""); err != nil {
		return nil, err
	}
	return s.locks.sems.semaphoreStatus(c.resource, c.limit, c.who)
}

// revokePermit serves an operator's revoke of one permit's lease.
func (s *Service) revokePermit(ctx context.Context, c *call, _ *slot) (any, error) {
	resp, err := s.locks.leases.revoke(ctx, streams.PermitResource(c.resource, c.permit), c.reason, c.who)
	if resp != nil {
		resp.Resource, resp.Permit = c.resource, c.permit
	}
	return resp, err
}

// The session's operations as the request path serves them (request.go).

// openSession serves a session's open.
func (s *Service) openSession(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.sessions.openSession(ctx, newSessionReq(c.requestID, c.owner, c.ttl, c.who))
}

// keepalive serves a session's keepalive.
func (s *Service) keepalive(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.sessions.keepalive(ctx, c.sessionID, c.ttl, c.who)
}

// closeSession serves a session's close.
func (s *Service) closeSession(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.sessions.closeSession(ctx, c.sessionID, c.who)
}

// The lock set's operations as the request path serves them
// (request.go): each names every resource of the set.

// acquireSet serves the acquire of a lock set: its members' kind, the
// tenant's lease cap, then the decision, waiting or not.
func (s *Service) acquireSet(ctx context.Context, c *call, sl *slot) (any, error) {
	r := c.set
	for _, res := range r.resources {
		if err := s.locks.names.sameKind(res, kindLock, 0, ""); err != nil {
			return nil, err
		}
	}
	if s.cfg.MaxLeasesPerTenant > 0 {
		if n := s.tracker.tenantLeaseCount(r.tenant); n+len(r.keys) > s.cfg.MaxLeasesPerTenant {
			return nil, newOpError(streams.CodeTooManyWaiters, "this NATS user holds %d leases and the set needs %d more: the cap is %d", n, len(r.keys), s.cfg.MaxLeasesPerTenant)
		}
	}
	defer func() {
		for _, res := range r.resources {
			s.report.touched(res)
		}
	}()
	if c.wait > 0 {
		return waits{s}.wait(s.locks.sets.newSetWaiter(r), r.hash, c.wait, sl)
	}
	return s.locks.sets.acquireSet(ctx, r)
}

// renewSet serves the renewal of a set's lease.
func (s *Service) renewSet(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.sets.renewSet(ctx, c.resources, c.leaseID, c.ttl, c.who)
}

// releaseSet serves the release of a set's lease.
func (s *Service) releaseSet(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.sets.releaseSet(ctx, c.resources, c.leaseID, c.who)
}

// cancelSet serves the cancel of a set's acquire.
func (s *Service) cancelSet(ctx context.Context, c *call, _ *slot) (any, error) {
	return s.locks.sets.cancelSet(ctx, c.resources, c.requestID, c.owner, c.who)
}

// acquireWaiting serves an acquire with wait_ms > 0 in the request's own
// goroutine: the waiter's steps (waiter.go), between them its wake
// messages and timers. Waiting costs no store work, so the request gives
// its in-flight place back once queued.
func (s *Service) acquireWaiting(g *grantReq, wait time.Duration, sl *slot) (any, error) {
	return waits{s}.wait(singleWait{s.locks.handover.newWaiter(g)}, g.hash, wait, sl)
}
