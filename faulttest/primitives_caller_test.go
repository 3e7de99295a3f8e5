package faulttest

import (
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// The requests on lock sets, semaphores and elections, sent raw and
// recorded, as a client in any language would send them; and the
// observer of election events.

// decodeSet reads the grant or renewal of a set.
func decodeSet(o *Op, data []byte) {
	var l streams.SetLeaseResponse
	if err := json.Unmarshal(data, &l); err != nil {
		o.Result, o.Code = Unknown, "bad reply"
		return
	}
	o.LeaseID, o.TTL, o.Members = l.LeaseID, time.Duration(l.TTLms)*time.Millisecond, l.Resources
}

// AcquireSet sends an acquire of the lock set res (named in the order
// given) and records it.
func (c *Caller) AcquireSet(res []string, rid string, ttl, wait time.Duration, retry bool) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resources: slices.Clone(res), RequestID: rid, TTL: ttl, Wait: wait, Retry: retry})
	r := c.call(streams.OpAcquire, streams.AcquireRequest{Resources: res, RequestID: rid, Owner: c.owner(),
		TTLms: ttl.Milliseconds(), WaitMs: wait.Milliseconds()}, wait)
	c.finishNoting(op, r, decodeSet)
	return *op
}

// AcquireSetDropReply sends an acquire of a set whose reply nobody
// receives; it is recorded as unknown.
func (c *Caller) AcquireSetDropReply(res []string, rid string, ttl time.Duration) {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resources: slices.Clone(res), RequestID: rid, TTL: ttl, Note: "reply dropped"})
	c.publishDropped(streams.AcquireRequest{Resources: res, RequestID: rid, Owner: c.owner(), TTLms: ttl.Milliseconds()})
	c.H.End(op, Unknown, func(o *Op) { o.Code = "reply dropped" })
}

// publishDropped sends an acquire whose reply goes to an inbox nobody
// listens on.
func (c *Caller) publishDropped(req streams.AcquireRequest) {
	data, _ := json.Marshal(req)
	_ = c.NC.PublishRequest(streams.Subject(streams.DefaultPrefix, streams.OpAcquire), nats.NewInbox(), data)
}

// RenewSet sends the renewal of the set lease lease of res (in the order
// given) and records it.
func (c *Caller) RenewSet(res []string, lease string, ttl time.Duration) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KRenew, Resources: slices.Clone(res), LeaseID: lease, TTL: ttl})
	r := c.call(streams.OpRenew, streams.RenewRequest{Resources: res, LeaseID: lease, TTLms: ttl.Milliseconds()}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		id := o.LeaseID
		decodeSet(o, data)
		if o.LeaseID != id {
			o.Note = "renewal answered with lease " + short(o.LeaseID)
		}
	})
	return *op
}

// ReleaseSet sends the release of the set lease lease of res and records
// it.
func (c *Caller) ReleaseSet(res []string, lease string) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KRelease, Resources: slices.Clone(res), LeaseID: lease})
	r := c.call(streams.OpRelease, streams.ReleaseRequest{Resources: res, LeaseID: lease}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		var rr streams.SetReleaseResponse
		if json.Unmarshal(data, &rr) != nil {
			o.Result, o.Code = Unknown, "bad reply"
		}
		o.Flag = rr.Released
	})
	return *op
}

// CancelSet sends the cancel of the acquire rid of the set res and records
// it.
func (c *Caller) CancelSet(res []string, rid string) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KCancel, Resources: slices.Clone(res), RequestID: rid})
	r := c.call(streams.OpCancel, streams.CancelRequest{Resources: res, RequestID: rid, Owner: c.owner()}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		var cr streams.SetCancelResponse
		if json.Unmarshal(data, &cr) != nil {
			o.Result, o.Code = Unknown, "bad reply"
		}
		o.Flag = cr.Cancelled
	})
	return *op
}

// AcquirePermit sends an acquire of a permit of the semaphore sem of limit
// permits and records it; a grant names its permit.
func (c *Caller) AcquirePermit(sem string, limit int, rid string, ttl, wait time.Duration, retry bool) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resource: sem, Limit: limit, RequestID: rid, TTL: ttl, Wait: wait, Retry: retry})
	r := c.call(streams.OpAcquire, streams.AcquireRequest{Resource: sem, Limit: limit, RequestID: rid, Owner: c.owner(),
		TTLms: ttl.Milliseconds(), WaitMs: wait.Milliseconds()}, wait)
	c.finishNoting(op, r, decodePermit)
	return *op
}

func decodePermit(o *Op, data []byte) {
	var l streams.LeaseResponse
	if err := json.Unmarshal(data, &l); err != nil {
		o.Result, o.Code = Unknown, "bad reply"
		return
	}
	o.LeaseID, o.Token, o.TTL, o.Permit = l.LeaseID, l.Token, time.Duration(l.TTLms)*time.Millisecond, l.Permit
	if l.Resource != o.Resource {
		o.Note = "answered for resource " + l.Resource
	}
}

// AcquirePermitDropReply sends an acquire of a permit whose reply nobody
// receives; it is recorded as unknown.
func (c *Caller) AcquirePermitDropReply(sem string, limit int, rid string, ttl time.Duration) {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resource: sem, Limit: limit, RequestID: rid, TTL: ttl, Note: "reply dropped"})
	c.publishDropped(streams.AcquireRequest{Resource: sem, Limit: limit, RequestID: rid, Owner: c.owner(), TTLms: ttl.Milliseconds()})
	c.H.End(op, Unknown, func(o *Op) { o.Code = "reply dropped" })
}

// RenewPermit sends the renewal of permit of sem, lease lease, and
// records it. The reply's permit is kept in Note when it is another.
func (c *Caller) RenewPermit(sem string, permit int, lease string, ttl time.Duration) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KRenew, Resource: sem, Permit: permit, LeaseID: lease, TTL: ttl})
	r := c.call(streams.OpRenew, streams.RenewRequest{Resource: sem, Permit: permit, LeaseID: lease, TTLms: ttl.Milliseconds()}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		id := o.LeaseID
		decodePermit(o, data)
		switch {
		case o.Permit != permit:
			o.Note = "renewal answered with permit " + itoa(o.Permit)
		case o.LeaseID != id:
			o.Note = "renewal answered with lease " + short(o.LeaseID)
		}
		o.Permit = permit
	})
	return *op
}

// ReleasePermit sends the release of permit of sem, lease lease, and
// records it.
func (c *Caller) ReleasePermit(sem string, permit int, lease string) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KRelease, Resource: sem, Permit: permit, LeaseID: lease})
	r := c.call(streams.OpRelease, streams.ReleaseRequest{Resource: sem, Permit: permit, LeaseID: lease}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		var rr streams.ReleaseResponse
		if json.Unmarshal(data, &rr) != nil {
			o.Result, o.Code = Unknown, "bad reply"
		}
		o.Flag = rr.Released
	})
	return *op
}

// CancelPermit sends the cancel of the acquire rid of a permit of sem and
// records it.
func (c *Caller) CancelPermit(sem string, limit int, rid string) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KCancel, Resource: sem, Limit: limit, RequestID: rid})
	r := c.call(streams.OpCancel, streams.CancelRequest{Resource: sem, Limit: limit, RequestID: rid, Owner: c.owner()}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		var cr streams.CancelResponse
		if json.Unmarshal(data, &cr) != nil {
			o.Result, o.Code = Unknown, "bad reply"
		}
		o.Flag = cr.Cancelled
	})
	return *op
}

// SemaphoreStatus sends the status of semaphore sem and records it: Flag
// is whether any permit is held, SetSize the held_permits it reported,
// Members each permit listed ("<sem>#<k>" and its token).
func (c *Caller) SemaphoreStatus(sem string, limit int) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KStatus, Resource: sem, Limit: limit})
	r := c.call(streams.OpStatus, streams.StatusRequest{Resource: sem, Limit: limit}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		var st streams.SemaphoreStatus
		if json.Unmarshal(data, &st) != nil {
			o.Result, o.Code = Unknown, "bad reply"
			return
		}
		o.Flag, o.SetSize = st.HeldPermits > 0, st.HeldPermits
		for _, p := range st.Permits {
			o.Members = append(o.Members, streams.SetMember{Resource: streams.PermitResource(sem, p.Permit), Token: p.Token})
		}
	})
	return *op
}

// Campaign sends an acquire of the election res with value (a candidate's
// campaign, usually waiting) and records it.
func (c *Caller) Campaign(res, rid, value string, ttl, wait time.Duration, retry bool) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resource: res, RequestID: rid, Value: value, TTL: ttl, Wait: wait, Retry: retry})
	r := c.call(streams.OpAcquire, streams.AcquireRequest{Resource: res, RequestID: rid, Owner: c.owner(), Value: value,
		TTLms: ttl.Milliseconds(), WaitMs: wait.Milliseconds()}, wait)
	c.finishNoting(op, r, decodeLease)
	return *op
}

// CampaignDropReply sends a campaign whose reply nobody receives; it is
// recorded as unknown.
func (c *Caller) CampaignDropReply(res, rid, value string, ttl time.Duration) {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resource: res, RequestID: rid, Value: value, TTL: ttl, Note: "reply dropped"})
	c.publishDropped(streams.AcquireRequest{Resource: res, RequestID: rid, Owner: c.owner(), Value: value, TTLms: ttl.Milliseconds()})
	c.H.End(op, Unknown, func(o *Op) { o.Code = "reply dropped" })
}

// Proclaim sends a renewal of the leader's lease with a new value and
// records it.
func (c *Caller) Proclaim(res, lease, value string, ttl time.Duration) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KRenew, Resource: res, LeaseID: lease, Value: value, TTL: ttl})
	r := c.call(streams.OpRenew, streams.RenewRequest{Resource: res, LeaseID: lease, Value: value, TTLms: ttl.Milliseconds()}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		id := o.LeaseID
		decodeLease(o, data)
		if o.LeaseID != id {
			o.Note = "renewal answered with lease " + short(o.LeaseID)
		}
	})
	return *op
}

// Observer records every election event published under the default
// prefix, as an operation of kind KEvent received at its completion time.
type Observer struct {
	H      *History
	Client int

	sub *nats.Subscription
	mu  sync.Mutex
	n   int
}

// Observe subscribes nc to every election event (streams.EventSubject of
// any resource) and records each in h.
func Observe(nc *nats.Conn, h *History, client int) (*Observer, error) {
	o := &Observer{H: h, Client: client}
	sub, err := nc.Subscribe(streams.DefaultPrefix+".events.>", func(m *nats.Msg) {
		var ev streams.ElectionEvent
		bad := json.Unmarshal(m.Data, &ev) != nil
		op := h.Begin(Op{Client: client, Kind: KEvent, Resource: ev.Resource, Token: ev.Token, Value: ev.Value,
			Event: ev.Event, Revision: ev.Revision})
		h.End(op, OK, func(op *Op) {
			if bad || m.Subject != streams.EventSubject(streams.DefaultPrefix, ev.Resource) {
				op.Result, op.Code = Fail, "event on "+m.Subject+": "+string(m.Data)
			}
		})
		o.mu.Lock()
		o.n++
		o.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	sub.SetPendingLimits(-1, -1)
	o.sub = sub
	return o, nc.Flush()
}

// Received returns the number of events received.
func (o *Observer) Received() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// Stop ends the subscription.
func (o *Observer) Stop() { _ = o.sub.Unsubscribe() }
