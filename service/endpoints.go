package service

import (
	"bytes"
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
// (workers.go); the reply goes straight back on the request's reply
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
// a body over MaxBodyBytes is refused before it is decoded. The gate
// bounds the requests processed at once (MaxInFlight) and queues the next
// MaxQueued; beyond those, or after QueueWait in the queue, the service
// sheds load: it answers unavailable rather than letting requests queue
// until their callers have given up. Renewals and releases go first, the
// lease closest to expiry first (see urgency), and while any wait, other
// requests are shed at once.
func (s *Service) dispatch(op string, r micro.Request) {
	if !s.replyAllowed(r.Reply()) {
		s.report.refusedReply(op, r.Reply())
		return
	}
	received := time.Now()
	if n := len(r.Data()); n > s.cfg.MaxBodyBytes {
		s.replyError(r, newOpError(streams.CodeInvalidRequest, "body of %d bytes: at most %d", n, s.cfg.MaxBodyBytes))
		s.report.request(op, streams.CodeInvalidRequest, time.Since(received))
		return
	}
	s.dispatched.Add(1)
	s.inflight.Add(1)
	req := request{op: op, r: r, who: s.requestOrigin(r.Headers())}
	if n := len(req.who.tenant()); n > streams.MaxTenantLen {
		// Records carry the tenant, and a record with a longer one would
		// read as foreign: nobody's lease, its key blocked.
		s.inflight.Done()
		s.replyError(r, newOpError(streams.CodeInvalidRequest, "the sender's account and user name take %d bytes: at most %d", n, streams.MaxTenantLen))
		s.report.request(op, streams.CodeInvalidRequest, time.Since(received))
		return
	}
	urgent, due := s.urgency(&req)
	if !urgent && !req.known && op != streams.OpRevoke {
		if err := s.limits.spent(req.who); err != nil {
			s.inflight.Done()
			s.replyError(r, toOpError(err))
			s.report.request(op, streams.CodeUnavailable, time.Since(received))
			return
		}
	}
	s.gate.enter(pending{
		at:     received,
		urgent: urgent,
		due:    due,
		run: func(sl *slot) {
			defer func() {
				sl.release()
				s.inflight.Done()
			}()
			resp, err := s.handle(&req, received, sl)
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
			s.replyError(r, oe)
			s.report.shed(op, reason, waited)
		},
	})
}

// request is one request on its way through dispatch: the operation, the
// message, who sent it, and for a renewal or release the body decoded
// early (to rank it by its lease's expiry) and whether the lease it names
// is current as this instance knows it.
type request struct {
	op        string
	r         micro.Request
	who       origin
	renew     *streams.RenewRequest
	release   *streams.ReleaseRequest
	keepalive *streams.SessionKeepaliveRequest
	known     bool
}

// urgency ranks a request for the gate: a renewal or release of a lease
// this instance knows as current is urgent, due when that lease would
// expire (so the lease closest to expiry goes first). One that names a
// lease the instance does not know (a guessed id, or a lease written before
// the instance's watcher caught up) waits with the other requests: a flood
// of bogus renewals cannot make the gate turn everyone else away. The body
// is decoded here for that, and kept for handle.
func (s *Service) urgency(req *request) (bool, time.Time) {
	var resource, leaseID string
	switch req.op {
	case streams.OpRenew:
		req.renew = new(streams.RenewRequest)
		if decode(req.r.Data(), req.renew) != nil {
			req.renew = nil // handle decodes it again and answers the error
			return false, time.Time{}
		}
		resource, leaseID = req.renew.Resource, req.renew.LeaseID
		if len(req.renew.Resources) > 0 {
			resource = req.renew.Resources[0] // every key of a set holds its lease
		}
	case streams.OpRelease:
		req.release = new(streams.ReleaseRequest)
		if decode(req.r.Data(), req.release) != nil {
			req.release = nil
			return false, time.Time{}
		}
		resource, leaseID = req.release.Resource, req.release.LeaseID
		if len(req.release.Resources) > 0 {
			resource = req.release.Resources[0]
		}
	case streams.OpSessionKeepalive:
		req.keepalive = new(streams.SessionKeepaliveRequest)
		if decode(req.r.Data(), req.keepalive) != nil {
			req.keepalive = nil
			return false, time.Time{}
		}
		hash, secret, _ := streams.SplitSessionID(req.keepalive.SessionID)
		o, ok := s.tracker.get(streams.SessionKey(hash))
		if !ok || !holds(o, secret, req.who) {
			return false, time.Time{}
		}
		req.known = true
		return true, s.tracker.deadline(&o)
	default:
		return false, time.Time{}
	}
	o, ok := s.tracker.get(streams.LeaseKey(resource))
	if !ok || !o.held() || !sameLease(o.rec.LeaseID, leaseID) {
		return false, time.Time{}
	}
	req.known = true
	return true, s.tracker.deadline(&o)
}

// shedRetryAfter is the retry_after_ms of a shed request: a quarter of the
// queue wait, jittered, so that shed callers do not come back together.
func (s *Service) shedRetryAfter() time.Duration {
	base := max(s.cfg.QueueWait/4, 50*time.Millisecond)
	return base/2 + rand.N(base)
}

// handle decodes, validates and serves one request received at received;
// its store work must end within QueueWait+OpTimeout of that. Every
// request but the renewal or release of a lease this instance knows as
// current pays its tenant's fair-use rate first.
func (s *Service) handle(req *request, received time.Time, sl *slot) (any, error) {
	ctx := s.deadlines.get(received)
	who, data := req.who, req.r.Data()
	switch req.op {
	case streams.OpAcquire:
		g, set, wait, err := s.acquireRequest(data, who)
		if err != nil {
			return nil, err
		}
		if set != nil {
			return s.acquireSet(ctx, set, wait, sl)
		}
		if err := s.limits.allow(g.owner, who, opCost(req.op, wait > 0, 0)); err != nil {
			return nil, err
		}
		if err := s.leaseCap(g); err != nil {
			return nil, err
		}
		s.report.touched(g.resource)
		if wait > 0 {
			return s.acquireWaiting(g, wait, sl)
		}
		return s.locks.acquire(ctx, g)
	case streams.OpRenew:
		body := req.renew
		if body == nil {
			body = new(streams.RenewRequest)
			if err := decode(data, body); err != nil {
				return nil, err
			}
		}
		ttl, err := s.ttl(body.TTLms)
		if err != nil {
			return nil, err
		}
		if !req.known {
			if err := s.limits.allow("", who, opCost(req.op, false, 0)); err != nil {
				return nil, err
			}
		}
		if body.Resources != nil {
			set, err := s.setOf(body.Resources)
			if err != nil {
				return nil, err
			}
			return s.locks.renewSet(ctx, set, body.LeaseID, ttl, who)
		}
		if body.Permit != 0 {
			resp, err := s.locks.renew(ctx, streams.PermitResource(body.Resource, body.Permit), body.LeaseID, ttl, body.Value, who)
			return permitResponse(resp, body.Resource, body.Permit), err
		}
		return s.locks.renew(ctx, body.Resource, body.LeaseID, ttl, body.Value, who)
	case streams.OpRelease:
		body := req.release
		if body == nil {
			body = new(streams.ReleaseRequest)
			if err := decode(data, body); err != nil {
				return nil, err
			}
		}
		if !req.known {
			if err := s.limits.allow("", who, opCost(req.op, false, 0)); err != nil {
				return nil, err
			}
		}
		if body.Resources != nil {
			set, err := s.setOf(body.Resources)
			if err != nil {
				return nil, err
			}
			return s.locks.releaseSet(ctx, set, body.LeaseID, who)
		}
		if body.Permit != 0 {
			resp, err := s.locks.release(ctx, streams.PermitResource(body.Resource, body.Permit), body.LeaseID, who)
			if resp != nil {
				resp.Resource = body.Resource
			}
			return resp, err
		}
		return s.locks.release(ctx, body.Resource, body.LeaseID, who)
	case streams.OpCancel:
		var body streams.CancelRequest
		if err := decode(data, &body); err != nil {
			return nil, err
		}
		if err := s.limits.allow("", who, opCost(req.op, false, 0)); err != nil {
			return nil, err
		}
		if body.Resources != nil {
			set, err := s.setOf(body.Resources)
			if err != nil {
				return nil, err
			}
			return s.locks.cancelSet(ctx, set, body.RequestID, who)
		}
		if body.Limit != 0 {
			return s.locks.cancelSem(ctx, body.Resource, body.Limit, body.RequestID, who)
		}
		return s.locks.cancel(ctx, body.Resource, body.RequestID, who)
	case streams.OpStatus:
		var body streams.StatusRequest
		if err := decode(data, &body); err != nil {
			return nil, err
		}
		if err := s.limits.allow("", who, opCost(req.op, false, 0)); err != nil {
			return nil, err
		}
		if body.Limit != 0 {
			return s.locks.semaphoreStatus(body.Resource, body.Limit, who)
		}
		return s.locks.status(ctx, body.Resource, who)
	case streams.OpList:
		var body streams.ListRequest
		if err := decode(data, &body); err != nil {
			return nil, err
		}
		if err := s.limits.allow("", who, opCost(req.op, false, body.Limit)); err != nil {
			return nil, err
		}
		return s.locks.list(&body, who), nil
	case streams.OpRevoke:
		var body streams.RevokeRequest
		if err := decode(data, &body); err != nil {
			return nil, err
		}
		return s.locks.revoke(ctx, body.Resource, body.Reason, who)
	case streams.OpSessionOpen:
		var body streams.SessionOpenRequest
		if err := decode(data, &body); err != nil {
			return nil, err
		}
		ttl, err := s.ttl(body.TTLms)
		if err != nil {
			return nil, err
		}
		if err := s.limits.allow(body.Owner, who, opCost(req.op, false, 0)); err != nil {
			return nil, err
		}
		return s.locks.openSession(ctx, newSessionReq(body.RequestID, body.Owner, ttl, who))
	case streams.OpSessionKeepalive:
		body := req.keepalive
		if body == nil {
			body = new(streams.SessionKeepaliveRequest)
			if err := decode(data, body); err != nil {
				return nil, err
			}
		}
		var ttl time.Duration
		if body.TTLms != 0 {
			var err error
			if ttl, err = s.ttl(body.TTLms); err != nil {
				return nil, err
			}
		}
		if !req.known {
			if err := s.limits.allow("", who, opCost(req.op, false, 0)); err != nil {
				return nil, err
			}
		}
		return s.locks.keepalive(ctx, body.SessionID, ttl, who)
	case streams.OpSessionClose:
		var body streams.SessionCloseRequest
		if err := decode(data, &body); err != nil {
			return nil, err
		}
		if err := s.limits.allow("", who, opCost(req.op, false, 0)); err != nil {
			return nil, err
		}
		return s.locks.closeSession(ctx, body.SessionID, who)
	}
	return nil, fmt.Errorf("unknown operation %q", req.op)
}

// opCost is what a request costs its tenant's fair-use bucket, roughly in
// replicated writes or leader reads: an acquire one (two when it waits: a
// waiter record, and its refreshes), a cancel two (a tombstone and the
// reads of the lease and waiter keys), the renewal or release of a lease
// (or keepalive of a session) the instance does not know as current two (a
// read from the stream leader and the write that proves it before the
// negative answer; one it knows costs nothing, see handle), closing a
// session two (its end, and the batches that end its leases), a list page
// one and one more per ten leases asked for (encoding a reply of a
// thousand leases costs the service about what a hundred writes cost it),
// everything else one.
func opCost(op string, waits bool, listLimit int) float64 {
	switch op {
	case streams.OpAcquire:
		if waits {
			return 2
		}
	case streams.OpCancel, streams.OpRenew, streams.OpRelease, streams.OpSessionKeepalive, streams.OpSessionClose:
		return 2
	case streams.OpList:
		if listLimit == 0 {
			listLimit = streams.DefaultListLimit
		}
		return float64(1 + (listLimit+9)/10)
	}
	return 1
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

// acquireRequest decodes and validates an acquire: every number is
// bounds-checked before any arithmetic. An acquire of a lock set comes
// back as a setReq, any other as a grantReq.
func (s *Service) acquireRequest(data []byte, who origin) (*grantReq, *setReq, time.Duration, error) {
	var req streams.AcquireRequest
	if err := decode(data, &req); err != nil {
		return nil, nil, 0, err
	}
	ttl, err := s.ttl(req.TTLms)
	if err != nil {
		return nil, nil, 0, err
	}
	if req.WaitMs < 0 || req.WaitMs > s.cfg.MaxWait.Milliseconds() {
		return nil, nil, 0, fmt.Errorf("%w: wait_ms %d outside [0, %d]", streams.ErrInvalid, req.WaitMs, s.cfg.MaxWait.Milliseconds())
	}
	hold, err := s.maxHold(req.MaxHoldMs)
	if err != nil {
		return nil, nil, 0, err
	}
	wait := time.Duration(req.WaitMs) * time.Millisecond
	if req.Resources != nil {
		set, err := s.setOf(req.Resources)
		if err != nil {
			return nil, nil, 0, err
		}
		r := newSetReq(set, req.RequestID, req.Owner, who)
		r.ttl, r.maxHold = ttl, hold
		if req.SessionID != "" {
			r.session, r.secret, _ = streams.SplitSessionID(req.SessionID)
		}
		return nil, r, wait, nil
	}
	tenant := who.tenant()
	g := &grantReq{resource: req.Resource, requestID: req.RequestID, owner: req.Owner,
		key: streams.LeaseKey(req.Resource), hash: requestHash(req.Resource, req.RequestID, tenant),
		ttl: ttl, maxHold: hold, who: who, tenant: tenant}
	if req.SessionID != "" {
		// Validate has checked its form, and that no ttl_ms came with it.
		g.session, g.secret, _ = streams.SplitSessionID(req.SessionID)
	}
	g.value = req.Value
	if req.Limit == 0 && bytes.Contains(data, []byte(`"limit"`)) {
		// The field named, with 0 (an escaped quote inside a string
		// value cannot form this text): a semaphore of no permits.
		return nil, nil, 0, fmt.Errorf("%w: limit 0 outside [1, %d]", streams.ErrInvalid, streams.MaxLimit)
	}
	if req.Limit != 0 {
		// A permit of a semaphore: decided on the semaphore's queue.
		g.sem, g.limit = req.Resource, req.Limit
		g.resource = streams.PermitQueue(req.Resource)
		g.key, g.hash = streams.LeaseKey(g.resource), requestHash(g.resource, req.RequestID, tenant)
	}
	return g, nil, wait, nil
}

// setOf checks the resources of a request naming a lock set against the
// deployment's cap and returns them sorted.
func (s *Service) setOf(resources []string) ([]string, error) {
	return streams.NormalizeSet(resources, s.cfg.MaxSetSize)
}

// acquireSet serves the acquire of a lock set: its fair-use cost (a write
// per four resources, at least one; twice that when it waits), the
// tenant's lease cap, then the decision, waiting or not.
func (s *Service) acquireSet(ctx context.Context, r *setReq, wait time.Duration, sl *slot) (any, error) {
	cost := float64(1 + (len(r.keys)-1)/4)
	if wait > 0 {
		cost *= 2
	}
	if err := s.limits.allow(r.owner, r.who, cost); err != nil {
		return nil, err
	}
	if s.cfg.MaxLeasesPerTenant > 0 {
		if n := s.tracker.tenantLeaseCount(r.tenant); n+len(r.keys) > s.cfg.MaxLeasesPerTenant {
			return nil, newOpError(streams.CodeTooManyWaiters, "this NATS user holds %d leases and the set needs %d more: the cap is %d", n, len(r.keys), s.cfg.MaxLeasesPerTenant)
		}
	}
	for _, res := range r.resources {
		s.report.touched(res)
	}
	if wait > 0 {
		return s.wait(s.locks.newSetWaiter(r), r.hash, wait, sl)
	}
	return s.locks.acquireSet(ctx, r)
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
