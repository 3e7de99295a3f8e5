package faulttest

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// The session requests of the contract, sent raw and recorded, as a
// client in any language would send them.

// finishNoting is finish, keeping the error message of a refusal in the
// operation's note.
func (c *Caller) finishNoting(op *Op, r reply, decode func(*Op, []byte)) {
	c.H.End(op, r.result, func(o *Op) {
		o.Code = r.code
		if r.msg != "" {
			o.Note = r.msg
		}
		if r.result == OK && decode != nil {
			decode(o, r.data)
		}
	})
}

// OpenSession sends a session.open and records it: on success its Session
// is the session id, its TTL the session's, its Deadline the client's
// deadline (send time plus TTL).
func (c *Caller) OpenSession(rid string, ttl time.Duration, retry bool) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KOpen, RequestID: rid, TTL: ttl, Retry: retry})
	r := c.call(streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: rid, Owner: c.owner(), TTLms: ttl.Milliseconds()}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		var s streams.SessionResponse
		if json.Unmarshal(data, &s) != nil || streams.ValidateSessionID(s.SessionID) != nil {
			o.Result, o.Code = Unknown, "bad reply"
			return
		}
		o.Session, o.TTL = s.SessionID, time.Duration(s.TTLms)*time.Millisecond
	})
	return *op
}

// OpenDropReply sends a session.open whose reply nobody receives; it is
// recorded as unknown.
func (c *Caller) OpenDropReply(rid string, ttl time.Duration) {
	op := c.H.Begin(Op{Client: c.Client, Kind: KOpen, RequestID: rid, TTL: ttl, Note: "reply dropped"})
	data, _ := json.Marshal(streams.SessionOpenRequest{RequestID: rid, Owner: c.owner(), TTLms: ttl.Milliseconds()})
	_ = c.NC.PublishRequest(streams.Subject(streams.DefaultPrefix, streams.OpSessionOpen), nats.NewInbox(), data)
	c.H.End(op, Unknown, func(o *Op) { o.Code = "reply dropped" })
}

// Keepalive sends a session.keepalive (keeping the session's TTL) and
// records it: on success its TTL is the session's and its Deadline the
// client's new deadline.
func (c *Caller) Keepalive(session string) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KKeepalive, Session: session})
	r := c.call(streams.OpSessionKeepalive, streams.SessionKeepaliveRequest{SessionID: session}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		var k streams.KeepaliveResponse
		if json.Unmarshal(data, &k) != nil || k.TTLms <= 0 {
			o.Result, o.Code = Unknown, "bad reply"
			return
		}
		if k.SessionID != session {
			o.Note = "keepalive answered for session " + short(k.SessionID)
		} else {
			o.Note = "leases=" + itoa(k.Leases)
		}
		o.TTL = time.Duration(k.TTLms) * time.Millisecond
	})
	return *op
}

// CloseSession sends a session.close and records it; Flag is closed.
func (c *Caller) CloseSession(session string) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KClose, Session: session})
	r := c.call(streams.OpSessionClose, streams.SessionCloseRequest{SessionID: session}, 0)
	c.finishNoting(op, r, func(o *Op, data []byte) {
		var cr streams.SessionCloseResponse
		if json.Unmarshal(data, &cr) != nil {
			o.Result, o.Code = Unknown, "bad reply"
			return
		}
		o.Flag = cr.Closed
		o.Note = "released=" + itoa(cr.Released)
	})
	return *op
}

// AcquireIn sends an acquire in session and records it. A grant carries
// the session's TTL; its lease is valid as long as the session is.
func (c *Caller) AcquireIn(res, rid, session string, wait time.Duration, retry bool) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resource: res, RequestID: rid, Session: session, Wait: wait, Retry: retry})
	r := c.call(streams.OpAcquire, streams.AcquireRequest{Resource: res, RequestID: rid, Owner: c.owner(),
		SessionID: session, WaitMs: wait.Milliseconds()}, wait)
	c.finishNoting(op, r, decodeLease)
	return *op
}

// AcquireInDropReply sends an acquire in session whose reply nobody
// receives; it is recorded as unknown.
func (c *Caller) AcquireInDropReply(res, rid, session string) {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resource: res, RequestID: rid, Session: session, Note: "reply dropped"})
	data, _ := json.Marshal(streams.AcquireRequest{Resource: res, RequestID: rid, Owner: c.owner(), SessionID: session})
	_ = c.NC.PublishRequest(streams.Subject(streams.DefaultPrefix, streams.OpAcquire), nats.NewInbox(), data)
	c.H.End(op, Unknown, func(o *Op) { o.Code = "reply dropped" })
}

// AcquireSetIn sends an acquire of the lock set res (named in the order
// given) in session and records it. A grant carries the session's TTL and
// a token per resource; the set is valid as long as the session is.
func (c *Caller) AcquireSetIn(res []string, rid, session string, wait time.Duration, retry bool) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resources: slices.Clone(res), RequestID: rid, Session: session, Wait: wait, Retry: retry})
	r := c.call(streams.OpAcquire, streams.AcquireRequest{Resources: res, RequestID: rid, Owner: c.owner(),
		SessionID: session, WaitMs: wait.Milliseconds()}, wait)
	c.finishNoting(op, r, decodeSet)
	return *op
}

// AcquireSetInDropReply sends an acquire of a lock set in session whose
// reply nobody receives; it is recorded as unknown.
func (c *Caller) AcquireSetInDropReply(res []string, rid, session string) {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resources: slices.Clone(res), RequestID: rid, Session: session, Note: "reply dropped"})
	c.publishDropped(streams.AcquireRequest{Resources: res, RequestID: rid, Owner: c.owner(), SessionID: session})
	c.H.End(op, Unknown, func(o *Op) { o.Code = "reply dropped" })
}

// AcquirePermitIn sends an acquire of a permit of the semaphore sem of
// limit permits in session and records it; a grant names its permit,
// which is valid as long as the session is.
func (c *Caller) AcquirePermitIn(sem string, limit int, rid, session string, wait time.Duration, retry bool) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resource: sem, Limit: limit, RequestID: rid, Session: session, Wait: wait, Retry: retry})
	r := c.call(streams.OpAcquire, streams.AcquireRequest{Resource: sem, Limit: limit, RequestID: rid, Owner: c.owner(),
		SessionID: session, WaitMs: wait.Milliseconds()}, wait)
	c.finishNoting(op, r, decodePermit)
	return *op
}

// AcquirePermitInDropReply sends an acquire of a permit in session whose
// reply nobody receives; it is recorded as unknown.
func (c *Caller) AcquirePermitInDropReply(sem string, limit int, rid, session string) {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resource: sem, Limit: limit, RequestID: rid, Session: session, Note: "reply dropped"})
	c.publishDropped(streams.AcquireRequest{Resource: sem, Limit: limit, RequestID: rid, Owner: c.owner(), SessionID: session})
	c.H.End(op, Unknown, func(o *Op) { o.Code = "reply dropped" })
}
