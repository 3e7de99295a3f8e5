package service

import (
	"bytes"
	"context"
	"fmt"
	"time"

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
