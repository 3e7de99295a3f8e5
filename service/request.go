package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetlock/jetlock/streams"
)

// The request path reads a request once. decodeCall turns its body into a
// call: which primitive and operation it is, every key it touches, the
// lease it names and whether this instance knows that lease as current on
// every one of those keys. The gate's urgency, the fair-use cost and the
// decision all read that one value: a request is never charged as one
// thing and executed as another.

// kind is the primitive a request is about.
type kind uint8

const (
	kindLock      kind = iota // a lock, or an election (a lock whose lease carries a value)
	kindSet                   // a lock set
	kindSemaphore             // a counting semaphore (a permit, or its queue)
	kindSession               // a session
	kindQuery                 // list
)

// call is one request, decoded and validated.
type call struct {
	op   string
	kind kind
	who  origin

	// resource is the lock's, election's or semaphore's name; resources
	// a set's members, sorted; keys every lease or session key the
	// request touches (a semaphore's acquire and cancel: its queue's).
	resource  string
	resources []string
	keys      []string
	permit    int // a permit of the semaphore resource (renew, release, revoke)
	limit     int // the semaphore's limit (acquire, cancel, status)

	requestID, owner, leaseID, sessionID, value, reason string
	ttl, maxHold, wait                                  time.Duration
	list                                                streams.ListRequest

	// grant and set are an acquire's request as the decision takes it.
	grant *grantReq
	set   *setReq

	// known is set when the renewal, release or keepalive names a lease
	// (or session) this instance knows as current on every key it names:
	// such a request is urgent, due when that lease would expire, and
	// free. Every other request pays cost tokens of its tenant's fair
	// use (and an acquire or open one of its owner's).
	known    bool
	due      time.Time
	cost     float64
	perOwner bool
}

// route finds an operation's handler: the operation and the primitive.
type route struct {
	op   string
	kind kind
}

// handler serves one decoded request; its store work ends with ctx.
type handler func(s *Service, ctx context.Context, c *call, sl *slot) (any, error)

// handlers is every operation of every primitive, each in its
// primitive's file.
var handlers = map[route]handler{
	{streams.OpAcquire, kindLock}:             (*Service).acquireLock,
	{streams.OpRenew, kindLock}:               (*Service).renewLock,
	{streams.OpRelease, kindLock}:             (*Service).releaseLock,
	{streams.OpCancel, kindLock}:              (*Service).cancelLock,
	{streams.OpStatus, kindLock}:              (*Service).statusLock,
	{streams.OpRevoke, kindLock}:              (*Service).revokeLock,
	{streams.OpAcquire, kindSet}:              (*Service).acquireSet,
	{streams.OpRenew, kindSet}:                (*Service).renewSet,
	{streams.OpRelease, kindSet}:              (*Service).releaseSet,
	{streams.OpCancel, kindSet}:               (*Service).cancelSet,
	{streams.OpAcquire, kindSemaphore}:        (*Service).acquirePermit,
	{streams.OpRenew, kindSemaphore}:          (*Service).renewPermit,
	{streams.OpRelease, kindSemaphore}:        (*Service).releasePermit,
	{streams.OpCancel, kindSemaphore}:         (*Service).cancelPermit,
	{streams.OpStatus, kindSemaphore}:         (*Service).statusSemaphore,
	{streams.OpRevoke, kindSemaphore}:         (*Service).revokePermit,
	{streams.OpSessionOpen, kindSession}:      (*Service).openSession,
	{streams.OpSessionKeepalive, kindSession}: (*Service).keepalive,
	{streams.OpSessionClose, kindSession}:     (*Service).closeSession,
	{streams.OpList, kindQuery}:               (*Service).list,
}

// decoders decode each operation's body into a call.
var decoders = map[string]func(s *Service, c *call, data []byte) error{
	streams.OpAcquire:          (*Service).decodeAcquire,
	streams.OpRenew:            (*Service).decodeRenew,
	streams.OpRelease:          (*Service).decodeRelease,
	streams.OpCancel:           (*Service).decodeCancel,
	streams.OpStatus:           (*Service).decodeStatus,
	streams.OpList:             (*Service).decodeList,
	streams.OpRevoke:           (*Service).decodeRevoke,
	streams.OpSessionOpen:      (*Service).decodeOpen,
	streams.OpSessionKeepalive: (*Service).decodeKeepalive,
	streams.OpSessionClose:     (*Service).decodeClose,
}

// mayBeFree reports whether a request of op can be free: only a renewal,
// release or keepalive can. Every other request meets the fair-use check
// before its body is decoded.
func mayBeFree(op string) bool {
	return op == streams.OpRenew || op == streams.OpRelease || op == streams.OpSessionKeepalive
}

// decodeCall decodes and validates the body of a request of op from who.
func (s *Service) decodeCall(op string, data []byte, who origin) (*call, error) {
	dec, ok := decoders[op]
	if !ok {
		return nil, fmt.Errorf("%w: unknown operation %q", streams.ErrInvalid, op)
	}
	c := &call{op: op, who: who, cost: 1}
	if err := dec(s, c, data); err != nil {
		return nil, err
	}
	return c, nil
}

// serve pays a request's fair use, then runs its handler.
func (s *Service) serve(ctx context.Context, c *call, sl *slot) (any, error) {
	if !c.known && c.cost > 0 {
		owner := ""
		if c.perOwner {
			owner = c.owner
		}
		if err := s.limits.allow(owner, c.who, c.cost); err != nil {
			return nil, err
		}
	}
	h, ok := handlers[route{c.op, c.kind}]
	if !ok {
		return nil, fmt.Errorf("no handler for %s of kind %d", c.op, c.kind)
	}
	return h(s, ctx, c, sl)
}

// setCost is what naming a set of n resources costs: a write per four
// resources, at least one.
func setCost(n int) float64 { return float64(1 + (n-1)/4) }

// decodeAcquire decodes an acquire: every number is bounds-checked before
// any arithmetic. It costs one (two when it waits); a set by its size.
func (s *Service) decodeAcquire(c *call, data []byte) error {
	var req streams.AcquireRequest
	if err := decode(data, &req); err != nil {
		return err
	}
	if req.Limit == 0 && req.Resources == nil && bytes.Contains(data, []byte(`"limit"`)) {
		// The field named, with 0 (an escaped quote inside a string value
		// cannot form this text): a semaphore of no permits.
		return fmt.Errorf("%w: limit 0 outside [1, %d]", streams.ErrInvalid, streams.MaxLimit)
	}
	var err error
	if c.ttl, err = s.ttl(req.TTLms); err != nil {
		return err
	}
	if req.WaitMs < 0 || req.WaitMs > s.cfg.MaxWait.Milliseconds() {
		return fmt.Errorf("%w: wait_ms %d outside [0, %d]", streams.ErrInvalid, req.WaitMs, s.cfg.MaxWait.Milliseconds())
	}
	if c.maxHold, err = s.maxHold(req.MaxHoldMs); err != nil {
		return err
	}
	c.wait = time.Duration(req.WaitMs) * time.Millisecond
	c.requestID, c.owner, c.sessionID, c.value, c.perOwner = req.RequestID, req.Owner, req.SessionID, req.Value, true
	if req.Resources != nil {
		return s.decodeSetAcquire(c, req.Resources)
	}
	c.resource, c.limit = req.Resource, req.Limit
	c.grant = s.grantOf(c)
	c.keys = []string{c.grant.key}
	c.kind = kindLock
	if c.limit != 0 {
		c.kind = kindSemaphore
	}
	if c.wait > 0 {
		c.cost = 2
	}
	return nil
}

// grantOf is the decision's view of c, an acquire of a lock or a permit.
func (s *Service) grantOf(c *call) *grantReq {
	tenant := c.who.tenant()
	g := &grantReq{resource: c.resource, requestID: c.requestID, owner: c.owner,
		ttl: c.ttl, maxHold: c.maxHold, who: c.who, tenant: tenant, value: c.value}
	if c.limit != 0 {
		// A permit of a semaphore: decided on the semaphore's queue.
		g.sem, g.limit = c.resource, c.limit
		g.resource = streams.PermitQueue(c.resource)
	}
	g.key, g.hash = streams.LeaseKey(g.resource), requestHash(g.resource, c.requestID, tenant)
	if c.sessionID != "" {
		// Validate has checked its form, and that no ttl_ms came with it.
		g.session, g.secret, _ = streams.SplitSessionID(c.sessionID)
	}
	return g
}

// decodeSetAcquire completes the acquire c of the set resources.
func (s *Service) decodeSetAcquire(c *call, resources []string) error {
	set, err := s.setOf(resources)
	if err != nil {
		return err
	}
	r := newSetReq(set, c.requestID, c.owner, c.who)
	r.ttl, r.maxHold = c.ttl, c.maxHold
	if c.sessionID != "" {
		r.session, r.secret, _ = streams.SplitSessionID(c.sessionID)
	}
	c.kind, c.resources, c.keys, c.set = kindSet, set, r.keys, r
	c.cost = setCost(len(set))
	if c.wait > 0 {
		c.cost *= 2
	}
	return nil
}

// decodeRenew decodes a renewal of a lease, a set or a permit.
func (s *Service) decodeRenew(c *call, data []byte) error {
	var req streams.RenewRequest
	if err := decode(data, &req); err != nil {
		return err
	}
	var err error
	if c.ttl, err = s.ttl(req.TTLms); err != nil {
		return err
	}
	c.value = req.Value
	if err := s.namesLease(c, req.Resource, req.Resources, req.Permit, req.LeaseID); err != nil {
		return err
	}
	if c.known && !s.needed(c) {
		c.known, c.due = false, time.Time{} // pays, and waits its turn
	}
	return nil
}

// minRenewalGap is the part of its TTL a lease's last write must have
// stood, as this instance saw it, for a renewal of it to be free: the
// clients renew every third of the TTL (±10%), so a holder never pays,
// while a lease renewed more often than five times a TTL pays for each
// renewal past that.
const minRenewalGap = 5

// needed reports whether the renewal c, of a lease this instance knows as
// current, is one its holder needs, and so free: it keeps the lease's
// value (an election's proclaim of a new value pays), it is the lease's
// first renewal (the one that follows a hand-over's short TTL at once) or
// comes at least a fifth of the lease's TTL after its last write, and no
// other free renewal of the same write is under way (see
// tracker.takeFree). A lease is kept by renewals, not made a free channel
// of writes.
func (s *Service) needed(c *call) bool {
	now := time.Now()
	revs := make([]uint64, len(c.keys))
	for i, key := range c.keys {
		o, ok := s.tracker.get(key)
		if !ok || !o.held() || c.value != "" && c.value != o.rec.Value || !renewalDue(o, now) {
			return false
		}
		revs[i] = o.rev
	}
	return s.tracker.takeFree(c.keys, revs, now, s.cfg.QueueWait+s.cfg.OpTimeout)
}

// renewalDue reports whether the lease (or session) observed in o is due a free
// renewal (keepalive) at now: it was never renewed, or its last write has
// stood for a fifth of its TTL.
func renewalDue(o observation, now time.Time) bool {
	ttl := time.Duration(o.rec.TTLms) * time.Millisecond
	return o.rec.RenewedAt == o.rec.GrantedAt || now.Sub(o.seen) >= ttl/minRenewalGap
}

// decodeRelease decodes a release of a lease, a set or a permit.
func (s *Service) decodeRelease(c *call, data []byte) error {
	var req streams.ReleaseRequest
	if err := decode(data, &req); err != nil {
		return err
	}
	return s.namesLease(c, req.Resource, req.Resources, req.Permit, req.LeaseID)
}

// namesLease completes a renewal or release c of lease leaseID, held on
// resource (permit k of it, when k is set) or on the set resources: its
// keys, whether the instance knows the lease current on all of them, and
// its cost when it does not (two; a set's twice its size's).
func (s *Service) namesLease(c *call, resource string, resources []string, permit int, leaseID string) error {
	c.leaseID, c.cost = leaseID, 2
	switch {
	case resources != nil:
		set, err := s.setOf(resources)
		if err != nil {
			return err
		}
		c.kind, c.resources, c.keys = kindSet, set, setKeysOf(set)
		c.cost = 2 * setCost(len(set))
	case permit != 0:
		c.kind, c.resource, c.permit = kindSemaphore, resource, permit
		c.keys = []string{permitKey(resource, permit)}
	default:
		c.kind, c.resource = kindLock, resource
		c.keys = []string{streams.LeaseKey(resource)}
	}
	c.known, c.due = s.knownLease(c)
	return nil
}

// knownLease reports whether the lease c names is current, as this
// instance knows it, on every key c names and on no other (a set's lease
// named whole, a lock's or permit's lease that is not a set's), and when
// the first of them is due to expire.
func (s *Service) knownLease(c *call) (bool, time.Time) {
	var due time.Time
	set := ""
	if c.kind == kindSet {
		set = setHash(c.resources)
	}
	for _, key := range c.keys {
		o, ok := s.tracker.get(key)
		if !ok || !o.held() || !sameLease(o.rec.LeaseID, c.leaseID) || o.rec.Set != set {
			return false, time.Time{}
		}
		if d := s.tracker.deadline(&o); due.IsZero() || d.Before(due) {
			due = d
		}
	}
	return true, due
}

// decodeCancel decodes a cancel: of a lock's, a set's or a permit's
// acquire. It costs two (a tombstone and the reads that prove it); a
// set's twice its size's.
func (s *Service) decodeCancel(c *call, data []byte) error {
	var req streams.CancelRequest
	if err := decode(data, &req); err != nil {
		return err
	}
	c.requestID, c.owner, c.cost = req.RequestID, req.Owner, 2
	switch {
	case req.Resources != nil:
		set, err := s.setOf(req.Resources)
		if err != nil {
			return err
		}
		c.kind, c.resources, c.keys = kindSet, set, setKeysOf(set)
		c.cost = 2 * setCost(len(set))
	case req.Limit != 0:
		c.kind, c.resource, c.limit = kindSemaphore, req.Resource, req.Limit
		c.keys = []string{streams.LeaseKey(streams.PermitQueue(req.Resource))}
	default:
		c.kind, c.resource = kindLock, req.Resource
		c.keys = []string{streams.LeaseKey(req.Resource)}
	}
	return nil
}

// decodeStatus decodes a status request: of a lock, or with a limit of a
// semaphore. A semaphore's name asked without a limit is answered as the
// semaphore it is (see statusLock).
func (s *Service) decodeStatus(c *call, data []byte) error {
	var req streams.StatusRequest
	if err := decode(data, &req); err != nil {
		return err
	}
	c.resource, c.limit = req.Resource, req.Limit
	c.kind, c.keys = kindLock, []string{streams.LeaseKey(req.Resource)}
	if req.Limit != 0 {
		c.kind = kindSemaphore
	}
	return nil
}

// decodeList decodes a list request: one, and one more per ten leases
// asked for (encoding a reply of a thousand leases costs the service
// about what a hundred writes cost it).
func (s *Service) decodeList(c *call, data []byte) error {
	if err := decode(data, &c.list); err != nil {
		return err
	}
	limit := c.list.Limit
	if limit == 0 {
		limit = streams.DefaultListLimit
	}
	c.kind, c.cost = kindQuery, float64(1+(limit+9)/10)
	return nil
}

// decodeRevoke decodes a revoke of a lease or of a permit. An operator's
// costs nothing; anyone else's is refused, for the price of one.
func (s *Service) decodeRevoke(c *call, data []byte) error {
	var req streams.RevokeRequest
	if err := decode(data, &req); err != nil {
		return err
	}
	c.resource, c.reason, c.permit = req.Resource, req.Reason, req.Permit
	c.kind, c.keys = kindLock, []string{streams.LeaseKey(req.Resource)}
	if req.Permit != 0 {
		c.kind, c.keys = kindSemaphore, []string{permitKey(req.Resource, req.Permit)}
	}
	if c.who.operator {
		c.cost = 0
	}
	return nil
}

// decodeOpen decodes a session's open.
func (s *Service) decodeOpen(c *call, data []byte) error {
	var req streams.SessionOpenRequest
	if err := decode(data, &req); err != nil {
		return err
	}
	var err error
	if c.ttl, err = s.ttl(req.TTLms); err != nil {
		return err
	}
	c.kind, c.requestID, c.owner, c.perOwner = kindSession, req.RequestID, req.Owner, true
	return nil
}

// decodeKeepalive decodes a session's keepalive: free and urgent when the
// instance knows the session as the caller's and it is due one (see
// needed: a session is renewed by its keepalives), else two.
func (s *Service) decodeKeepalive(c *call, data []byte) error {
	var req streams.SessionKeepaliveRequest
	if err := decode(data, &req); err != nil {
		return err
	}
	if req.TTLms != 0 {
		var err error
		if c.ttl, err = s.ttl(req.TTLms); err != nil {
			return err
		}
	}
	c.kind, c.sessionID, c.cost = kindSession, req.SessionID, 2
	hash, secret, _ := streams.SplitSessionID(req.SessionID)
	c.keys = []string{streams.SessionKey(hash)}
	if o, ok := s.tracker.get(c.keys[0]); ok && holds(o, secret, c.who) && renewalDue(o, time.Now()) &&
		s.tracker.takeFree(c.keys, []uint64{o.rev}, time.Now(), s.cfg.QueueWait+s.cfg.OpTimeout) {
		c.known, c.due = true, s.tracker.deadline(&o)
	}
	return nil
}

// decodeClose decodes a session's close: two (its end, and the batches
// that end its leases).
func (s *Service) decodeClose(c *call, data []byte) error {
	var req streams.SessionCloseRequest
	if err := decode(data, &req); err != nil {
		return err
	}
	hash, _, _ := streams.SplitSessionID(req.SessionID)
	c.kind, c.sessionID, c.cost = kindSession, req.SessionID, 2
	c.keys = []string{streams.SessionKey(hash)}
	return nil
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

// The lock's operations as the request path serves them (decodeCall above).
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
// (decodeCall above): each names the semaphore and its limit (acquire, cancel,
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

// The session's operations as the request path serves them (decodeCall above).

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
// (decodeCall above): each names every resource of the set.

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
