package main

import (
	"cmp"
	"encoding/json"
	"strconv"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/streams"
)

// Outcome codes the load generator adds to the contract's error codes.
const (
	codeTimeout       = "timeout"        // no reply within the request timeout
	codeBacklog       = "backlog"        // not sent: too many requests in flight
	codeNoResponders  = "no_responders"  // nobody listens on the subject
	codeReleasedFalse = "released_false" // release of a lease the bench held found it gone
	codeConflict      = "cas_conflict"   // raw: compare-and-set lost
	codePublish       = "publish_error"  // the connection refused the publish
)

// result is what a reply (or its absence) means to the workload.
type result struct {
	code     string // codeOK or an error code
	lease    string // service: lease_id
	token    uint64 // service: fencing token; raw: revision of the write
	rev      uint64 // raw: revision of the key after the write
	released bool   // release: whether a lease was removed
	unknown  bool   // the outcome is unknown: the write may or may not have happened
}

// backend turns the workload's operations into NATS messages and replies
// into results. Two exist: the jetlock service, and bare compare-and-set
// writes on a KV bucket (the "raw" baseline).
type backend interface {
	name() string
	// stream is the stream whose last sequence counts commits.
	stream() string
	// acquire builds an acquire; owner "" means the backend's owner.
	acquire(res, reqID, owner string, ttl time.Duration, wait time.Duration, rev uint64) *nats.Msg
	renew(res, lease string, ttl time.Duration, rev uint64) *nats.Msg
	release(res, lease string, rev uint64) *nats.Msg
	parse(op string, reply *nats.Msg, err error) result
}

// clientResult maps a requester error (no reply) to a result.
func clientResult(err error) result {
	switch err {
	case errTimeout, errClosed:
		return result{code: codeTimeout, unknown: true}
	case errNoAnswer:
		return result{code: codeNoResponders, unknown: true}
	}
	return result{code: codePublish, unknown: true}
}

// serviceBackend talks to the jetlock service over its wire contract.
type serviceBackend struct {
	prefix string
	bucket string
	owner  string
}

func (b *serviceBackend) name() string   { return "service" }
func (b *serviceBackend) stream() string { return streams.StreamName(b.bucket) }

func (b *serviceBackend) msg(op string, v any) *nats.Msg {
	data, _ := json.Marshal(v)
	return &nats.Msg{Subject: streams.Subject(b.prefix, op), Data: data}
}

func (b *serviceBackend) acquire(res, reqID, owner string, ttl, wait time.Duration, _ uint64) *nats.Msg {
	return b.msg(streams.OpAcquire, &streams.AcquireRequest{Resource: res, RequestID: reqID, Owner: cmp.Or(owner, b.owner),
		TTLms: ttl.Milliseconds(), WaitMs: wait.Milliseconds()})
}

func (b *serviceBackend) renew(res, lease string, ttl time.Duration, _ uint64) *nats.Msg {
	return b.msg(streams.OpRenew, &streams.RenewRequest{Resource: res, LeaseID: lease, TTLms: ttl.Milliseconds()})
}

func (b *serviceBackend) release(res, lease string, _ uint64) *nats.Msg {
	return b.msg(streams.OpRelease, &streams.ReleaseRequest{Resource: res, LeaseID: lease})
}

// serviceError returns the contract error code of a reply, or "" for a
// success. The body's code is preferred; the header's number is the
// fallback for a body that cannot be parsed.
func serviceError(m *nats.Msg) string {
	h := m.Header.Get(streams.HeaderErrorCode)
	if h == "" {
		return ""
	}
	var er streams.ErrorResponse
	if jsonv2.Unmarshal(m.Data, &er) == nil && er.Error.Code != "" {
		return er.Error.Code
	}
	n, _ := strconv.Atoi(h)
	return streams.CodeForStatus(n)
}

func (b *serviceBackend) parse(op string, m *nats.Msg, err error) result {
	if err != nil {
		return clientResult(err)
	}
	if code := serviceError(m); code != "" {
		return result{code: code, unknown: code == streams.CodeUnavailable || code == streams.CodeInternal}
	}
	switch op {
	case streams.OpRelease:
		var r streams.ReleaseResponse
		if err := jsonv2.Unmarshal(m.Data, &r); err != nil {
			return result{code: streams.CodeInternal, unknown: true}
		}
		return result{code: codeOK, released: r.Released}
	default:
		var r streams.LeaseResponse
		if err := jsonv2.Unmarshal(m.Data, &r); err != nil || r.LeaseID == "" {
			return result{code: streams.CodeInternal, unknown: true}
		}
		return result{code: codeOK, lease: r.LeaseID, token: r.Token}
	}
}

// rawBackend writes the same records the service would, as bare
// compare-and-set publishes to a KV bucket's stream, with the headers the
// service's writes carry (expected last subject sequence; a message id on
// grants), so that the server does the same work and the difference is the
// service's own cost.
type rawBackend struct {
	bucket string
	owner  string
	pfx    string
}

func newRawBackend(bucket, owner string) *rawBackend {
	return &rawBackend{bucket: bucket, owner: owner, pfx: streams.SubjectPrefix(bucket)}
}

func (b *rawBackend) name() string   { return "raw" }
func (b *rawBackend) stream() string { return streams.StreamName(b.bucket) }

func (b *rawBackend) write(res string, rec *streams.Record, rev uint64, msgID string) *nats.Msg {
	m := nats.NewMsg(b.pfx + streams.LeaseKey(res))
	if rec != nil {
		m.Data, _ = json.Marshal(rec)
	} else {
		m.Header.Set("KV-Operation", "DEL")
	}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	return m
}

func (b *rawBackend) record(reqID string, ttl time.Duration, token uint64) *streams.Record {
	now := time.Now()
	return &streams.Record{LeaseID: "0123456789abcdef0123456789abcdef", Owner: b.owner, RequestID: reqID,
		TTLms: ttl.Milliseconds(), Token: token, GrantedAt: streams.FormatTime(now),
		RenewedAt: streams.FormatTime(now), ExpiresAt: streams.FormatTime(now.Add(ttl))}
}

func (b *rawBackend) acquire(res, reqID, _ string, ttl, _ time.Duration, rev uint64) *nats.Msg {
	return b.write(res, b.record(reqID, ttl, 0), rev, "acq-"+reqID)
}

func (b *rawBackend) renew(res, lease string, ttl time.Duration, rev uint64) *nats.Msg {
	return b.write(res, b.record(lease, ttl, rev), rev, "")
}

func (b *rawBackend) release(res, _ string, rev uint64) *nats.Msg {
	return b.write(res, nil, rev, "")
}

type pubAck struct {
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
	Error     *struct {
		Code    int    `json:"code"`
		ErrCode int    `json:"err_code"`
		Desc    string `json:"description"`
	} `json:"error"`
}

func (b *rawBackend) parse(op string, m *nats.Msg, err error) result {
	if err != nil {
		return clientResult(err)
	}
	var ack pubAck
	if err := jsonv2.Unmarshal(m.Data, &ack); err != nil {
		return result{code: streams.CodeInternal, unknown: true}
	}
	if ack.Error != nil {
		switch {
		case ack.Error.ErrCode == int(jetstream.JSErrCodeStreamWrongLastSequence) || ack.Error.ErrCode == 10164:
			return result{code: codeConflict}
		case ack.Error.Code == 503 || ack.Error.Code == 408:
			return result{code: streams.CodeUnavailable, unknown: true}
		}
		return result{code: "js_" + strconv.Itoa(ack.Error.ErrCode), unknown: true}
	}
	return result{code: codeOK, lease: "raw", token: ack.Seq, rev: ack.Seq, released: op == streams.OpRelease}
}
