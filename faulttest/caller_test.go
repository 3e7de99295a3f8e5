package faulttest

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client/fence"
	"github.com/jetlock/jetlock/streams"
)

// Caller sends raw contract requests, as a client in any language would,
// and records each in a History.
type Caller struct {
	NC      *nats.Conn
	H       *History
	Client  int
	Timeout time.Duration // per request; the default is 2.5s
	// Owner is the owner its acquires name; the default is the client's
	// own ("client-<Client>"). A retry of a request id counts as the same
	// caller only with the same owner.
	Owner string
}

// owner returns the owner c's acquires name.
func (c *Caller) owner() string {
	if c.Owner != "" {
		return c.Owner
	}
	return ownerOf(c.Client)
}

// reply is a decoded answer.
type reply struct {
	result Result
	code   string
	msg    string // the error's message
	data   []byte
}

// call sends one request. No reply, "unavailable" and "internal" are
// Unknown; "no responders" is a failure (nobody received it); any other
// error code is a failure.
func (c *Caller) call(op string, body any, extra time.Duration) reply {
	data, _ := json.Marshal(body)
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 2500 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+extra)
	defer cancel()
	msg, err := c.NC.RequestWithContext(ctx, streams.Subject(streams.DefaultPrefix, op), data)
	if errors.Is(err, nats.ErrNoResponders) {
		return reply{result: Fail, code: "no_responders"}
	}
	if err != nil {
		return reply{result: Unknown, code: "no reply: " + err.Error()}
	}
	if h := msg.Header.Get(streams.HeaderErrorCode); h != "" {
		var er streams.ErrorResponse
		_ = json.Unmarshal(msg.Data, &er)
		code := er.Error.Code
		if code == "" {
			code = "status " + h
		}
		if code == streams.CodeUnavailable || code == streams.CodeInternal {
			return reply{result: Unknown, code: code, msg: er.Error.Message}
		}
		return reply{result: Fail, code: code, msg: er.Error.Message}
	}
	return reply{result: OK, data: msg.Data}
}

func (c *Caller) finish(op *Op, r reply, decode func(*Op, []byte)) {
	c.H.End(op, r.result, func(o *Op) {
		o.Code = r.code
		if r.result == OK && decode != nil {
			decode(o, r.data)
		}
	})
}

func decodeLease(o *Op, data []byte) {
	var l streams.LeaseResponse
	if err := json.Unmarshal(data, &l); err != nil {
		o.Result, o.Code = Unknown, "bad reply"
		return
	}
	o.LeaseID, o.Token, o.TTL = l.LeaseID, l.Token, time.Duration(l.TTLms)*time.Millisecond
}

// Acquire sends an acquire and records it.
func (c *Caller) Acquire(res, rid string, ttl, wait time.Duration, retry bool) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resource: res, RequestID: rid, TTL: ttl, Wait: wait, Retry: retry})
	r := c.call(streams.OpAcquire, streams.AcquireRequest{Resource: res, RequestID: rid, Owner: c.owner(),
		TTLms: ttl.Milliseconds(), WaitMs: wait.Milliseconds()}, wait)
	c.finish(op, r, decodeLease)
	return *op
}

// AcquireDropReply sends an acquire whose reply nobody receives: the
// service does its work, the caller never learns the outcome. It is
// recorded as unknown.
func (c *Caller) AcquireDropReply(res, rid string, ttl time.Duration) {
	op := c.H.Begin(Op{Client: c.Client, Kind: KAcquire, Resource: res, RequestID: rid, TTL: ttl, Note: "reply dropped"})
	data, _ := json.Marshal(streams.AcquireRequest{Resource: res, RequestID: rid, Owner: c.owner(), TTLms: ttl.Milliseconds()})
	_ = c.NC.PublishRequest(streams.Subject(streams.DefaultPrefix, streams.OpAcquire), nats.NewInbox(), data)
	c.H.End(op, Unknown, func(o *Op) { o.Code = "reply dropped" })
}

// Renew sends a renewal and records it.
func (c *Caller) Renew(res, lease string, ttl time.Duration) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KRenew, Resource: res, LeaseID: lease, TTL: ttl})
	r := c.call(streams.OpRenew, streams.RenewRequest{Resource: res, LeaseID: lease, TTLms: ttl.Milliseconds()}, 0)
	c.finish(op, r, func(o *Op, data []byte) {
		id := o.LeaseID
		decodeLease(o, data)
		if o.LeaseID != id {
			o.Note = "renewal answered with lease " + short(o.LeaseID)
		}
	})
	return *op
}

// Release sends a release and records it.
func (c *Caller) Release(res, lease string) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KRelease, Resource: res, LeaseID: lease})
	r := c.call(streams.OpRelease, streams.ReleaseRequest{Resource: res, LeaseID: lease}, 0)
	c.finish(op, r, func(o *Op, data []byte) {
		var rr streams.ReleaseResponse
		if json.Unmarshal(data, &rr) != nil {
			o.Result, o.Code = Unknown, "bad reply"
		}
		o.Flag = rr.Released
	})
	return *op
}

// Cancel sends a cancel and records it.
func (c *Caller) Cancel(res, rid string) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KCancel, Resource: res, RequestID: rid})
	r := c.call(streams.OpCancel, streams.CancelRequest{Resource: res, RequestID: rid, Owner: c.owner()}, 0)
	c.finish(op, r, func(o *Op, data []byte) {
		var cr streams.CancelResponse
		if json.Unmarshal(data, &cr) != nil {
			o.Result, o.Code = Unknown, "bad reply"
		}
		o.Flag = cr.Cancelled
	})
	return *op
}

// Status sends a status request and records it.
func (c *Caller) Status(res string) Op {
	op := c.H.Begin(Op{Client: c.Client, Kind: KStatus, Resource: res})
	r := c.call(streams.OpStatus, streams.StatusRequest{Resource: res}, 0)
	c.finish(op, r, func(o *Op, data []byte) {
		var st streams.StatusResponse
		if json.Unmarshal(data, &st) != nil {
			o.Result, o.Code = Unknown, "bad reply"
		}
		o.Flag, o.Token, o.Value, o.SetSize = st.Held, st.Token, st.Value, st.SetSize
	})
	return *op
}

func ownerOf(client int) string { return "client-" + strconv.Itoa(client) }

// Register is the protected resource: a fenced register per resource
// behind a fence.Memory guard. Every write is recorded in the history;
// the accepted writes of each resource are also logged in the order the
// guard accepted them.
type Register struct {
	Guard *fence.Memory
	H     *History

	mu  sync.Mutex
	log map[string][]uint64
}

// NewRegister returns an empty register recording into h.
func NewRegister(h *History) *Register {
	return &Register{Guard: fence.NewMemory(), H: h, log: map[string][]uint64{}}
}

// Write writes to res with token and reports whether the guard accepted
// it.
func (r *Register) Write(client int, res string, token uint64, note string) bool {
	op := r.H.Begin(Op{Client: client, Kind: KWrite, Resource: res, Token: token, Note: note})
	err := r.Guard.Do(context.Background(), res, token, func() error {
		r.mu.Lock()
		r.log[res] = append(r.log[res], token)
		r.mu.Unlock()
		return nil
	})
	r.H.End(op, OK, func(o *Op) {
		o.Flag = err == nil
		if err != nil && !errors.Is(err, fence.ErrStaleToken) {
			o.Result, o.Code = Fail, err.Error()
		}
	})
	return err == nil
}

// Log returns the accepted tokens of every resource in acceptance order.
func (r *Register) Log() map[string][]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]uint64, len(r.log))
	for k, v := range r.log {
		out[k] = append([]uint64(nil), v...)
	}
	return out
}

// statusWaiters returns the waiter count status reports for res (not
// recorded), or -1.
func statusWaiters(c *Caller, res string) int {
	r := c.call(streams.OpStatus, streams.StatusRequest{Resource: res}, 0)
	var st streams.StatusResponse
	if r.result != OK || json.Unmarshal(r.data, &st) != nil {
		return -1
	}
	return st.Waiters
}

func itoa(i int) string { return strconv.Itoa(i) }
