package service_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// caller sends raw contract requests, as a client in any language would.
type caller struct {
	t  testing.TB
	nc *nats.Conn
}

// reply is a decoded answer: exactly one of ok or errCode is set.
type reply struct {
	status  int    // header code, 0 on success
	errCode string // error code of the body
	err     streams.ErrorDetail
	raw     []byte
}

func (c caller) send(op string, body any) reply {
	c.t.Helper()
	// Generous for a busy machine, and longer than any wait the request
	// asks for.
	timeout := 30 * time.Second
	if a, ok := body.(streams.AcquireRequest); ok {
		timeout += time.Duration(a.WaitMs) * time.Millisecond
	}
	r, err := c.try(op, body, timeout)
	if err != nil {
		c.t.Fatalf("%s: %v", op, err)
	}
	return r
}

// try sends a request and returns the transport error instead of failing.
func (c caller) try(op string, body any, timeout time.Duration) (reply, error) {
	c.t.Helper()
	var data []byte
	switch b := body.(type) {
	case string:
		data = []byte(b)
	default:
		var err error
		if data, err = json.Marshal(b); err != nil {
			c.t.Fatal(err)
		}
	}
	msg, err := c.nc.Request(streams.Subject(streams.DefaultPrefix, op), data, timeout)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", op, data, err)
	}
	r := reply{raw: msg.Data}
	if h := msg.Header.Get(streams.HeaderErrorCode); h != "" {
		r.status, _ = strconv.Atoi(h)
		var er streams.ErrorResponse
		if err := json.Unmarshal(msg.Data, &er); err != nil {
			c.t.Fatalf("error body %q: %v", msg.Data, err)
		}
		r.err = er.Error
		r.errCode = er.Error.Code
		if streams.StatusCode(r.errCode) != r.status {
			c.t.Fatalf("header code %d does not match body code %q", r.status, r.errCode)
		}
	}
	return r, nil
}

func (r reply) decode(t testing.TB, v any) {
	t.Helper()
	if r.errCode != "" {
		t.Fatalf("unexpected error %s: %s", r.errCode, r.err.Message)
	}
	if err := json.Unmarshal(r.raw, v); err != nil {
		t.Fatal(err)
	}
}

// ask sends op with body and decodes a success into a T; an error answer
// leaves the T zero and is in the reply.
func ask[T any](c caller, op string, body any) (T, reply) {
	c.t.Helper()
	r := c.send(op, body)
	var v T
	if r.errCode == "" {
		r.decode(c.t, &v)
	}
	return v, r
}

func (c caller) acquire(req streams.AcquireRequest) (streams.LeaseResponse, reply) {
	c.t.Helper()
	return ask[streams.LeaseResponse](c, streams.OpAcquire, req)
}

func (c caller) mustAcquire(resource, requestID string, ttlMs int64) streams.LeaseResponse {
	c.t.Helper()
	l, r := c.acquire(streams.AcquireRequest{Resource: resource, RequestID: requestID, TTLms: ttlMs})
	if r.errCode != "" {
		c.t.Fatalf("acquire %s/%s: %s %s", resource, requestID, r.errCode, r.err.Message)
	}
	return l
}

func (c caller) renew(resource, leaseID string, ttlMs int64) (streams.LeaseResponse, reply) {
	c.t.Helper()
	return ask[streams.LeaseResponse](c, streams.OpRenew, streams.RenewRequest{Resource: resource, LeaseID: leaseID, TTLms: ttlMs})
}

func (c caller) release(resource, leaseID string) (bool, reply) {
	c.t.Helper()
	rr, r := ask[streams.ReleaseResponse](c, streams.OpRelease, streams.ReleaseRequest{Resource: resource, LeaseID: leaseID})
	return rr.Released, r
}

func (c caller) status(resource string) streams.StatusResponse {
	c.t.Helper()
	var st streams.StatusResponse
	c.send(streams.OpStatus, streams.StatusRequest{Resource: resource}).decode(c.t, &st)
	return st
}

// cancel cancels the acquire of requestID on resource; owner, if given, is
// the owner the acquire named (a cancel of another owner's is not its).
func (c caller) cancel(resource, requestID string, owner ...string) bool {
	c.t.Helper()
	var cr streams.CancelResponse
	req := streams.CancelRequest{Resource: resource, RequestID: requestID}
	if len(owner) > 0 {
		req.Owner = owner[0]
	}
	c.send(streams.OpCancel, req).decode(c.t, &cr)
	return cr.Cancelled
}

func rid(i int) string { return fmt.Sprintf("req-%d", i) }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
