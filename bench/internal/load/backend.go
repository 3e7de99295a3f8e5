package load

import (
	"cmp"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/jetlock/jetlock/streams"
)

// Outcome codes besides the contract's error codes.
const (
	CodeOK            = "ok"
	CodeTimeout       = "timeout"        // no reply within the request timeout
	CodeBacklog       = "backlog"        // not sent: too many requests in flight
	CodeNoResponders  = "no_responders"  // nobody listens on the subject
	CodeReleasedFalse = "released_false" // release of a lease the bench held found it gone
	CodeConflict      = "cas_conflict"   // raw: compare-and-set lost
	CodePublish       = "publish_error"  // the connection refused the publish
)

// Result is what a reply (or its absence) means to the load.
type Result struct {
	Code     string // CodeOK or an error code
	Lease    string // service: lease_id
	Token    uint64 // service: fencing token; raw: revision of the write
	Rev      uint64 // raw: revision of the key after the write
	Released bool   // release: whether a lease was removed
	Unknown  bool   // the outcome is unknown: the write may or may not have happened
	// RetryAfter is the retry_after_ms of an "unavailable" answer: the
	// service shed the request (overload, renewals first) or its caller is
	// over its fair-use rate. Zero when the answer carries none.
	RetryAfter time.Duration
	// Session is the session_id of a session.open's answer.
	Session string
	// Leases is, for a session.close, the number of leases it released.
	Leases int
	// Batch is, for a raw atomic batch's commit, how many messages the
	// stream committed in it.
	Batch int
	// InProcess: a raw write (Code CodeConflict) was refused because
	// another write to its key was still in process on the stream leader,
	// not because the key had moved on. The leader answers a write before
	// it clears that mark, so a caller's next write to the key can find
	// it: the service decides such a write again, and a raw caller that
	// knows the key's revision may send it again as it is.
	InProcess bool
}

// Backend turns operations into NATS messages and replies into results.
// Two exist: the jetlock service (Service), and bare compare-and-set writes
// on a KV bucket (Raw, the baseline).
type Backend interface {
	Name() string
	// Stream is the stream whose last sequence counts commits.
	Stream() string
	// Acquire builds an acquire; owner "" means the backend's owner. Raw
	// writes expect the key's revision rev.
	Acquire(res, reqID, owner string, ttl, wait time.Duration, rev uint64) *nats.Msg
	Renew(res, lease string, ttl time.Duration, rev uint64) *nats.Msg
	Release(res, lease string, rev uint64) *nats.Msg
	Parse(op string, reply *nats.Msg, err error) Result
}

// clientResult maps a requester error (no reply) to a result.
func clientResult(err error) Result {
	switch {
	case errors.Is(err, ErrTimeout), errors.Is(err, ErrClosed):
		return Result{Code: CodeTimeout, Unknown: true}
	case errors.Is(err, ErrNoAnswer):
		return Result{Code: CodeNoResponders, Unknown: true}
	}
	return Result{Code: CodePublish, Unknown: true}
}

// SendCode is the result code of a request that could not be sent.
func SendCode(err error) string {
	if errors.Is(err, ErrBacklog) {
		return CodeBacklog
	}
	return CodePublish
}

// Service talks to the jetlock service over its wire contract.
type Service struct {
	Prefix, Bucket, Owner string
}

func (b *Service) Name() string   { return "service" }
func (b *Service) Stream() string { return streams.StreamName(b.Bucket) }

// Msg returns a request of op with body v.
func (b *Service) Msg(op string, v any) *nats.Msg {
	data, _ := json.Marshal(v)
	return &nats.Msg{Subject: streams.Subject(b.Prefix, op), Data: data}
}

func (b *Service) Acquire(res, reqID, owner string, ttl, wait time.Duration, _ uint64) *nats.Msg {
	return b.Msg(streams.OpAcquire, &streams.AcquireRequest{Resource: res, RequestID: reqID, Owner: cmp.Or(owner, b.Owner),
		TTLms: ttl.Milliseconds(), WaitMs: wait.Milliseconds()})
}

func (b *Service) Renew(res, lease string, ttl time.Duration, _ uint64) *nats.Msg {
	return b.Msg(streams.OpRenew, &streams.RenewRequest{Resource: res, LeaseID: lease, TTLms: ttl.Milliseconds()})
}

func (b *Service) Release(res, lease string, _ uint64) *nats.Msg {
	return b.Msg(streams.OpRelease, &streams.ReleaseRequest{Resource: res, LeaseID: lease})
}

// Sessions: a lease bound to a session lives as long as the session, which
// one keepalive keeps alive however many leases it holds.

// AcquireInSession builds an acquire of res bound to session (no TTL of
// its own).
func (b *Service) AcquireInSession(res, reqID, session string) *nats.Msg {
	return b.Msg(streams.OpAcquire, &streams.AcquireRequest{Resource: res, RequestID: reqID, Owner: b.Owner, SessionID: session})
}

// SessionOpen builds a session.open of request id reqID with TTL ttl.
func (b *Service) SessionOpen(reqID string, ttl time.Duration) *nats.Msg {
	return b.Msg(streams.OpSessionOpen, &streams.SessionOpenRequest{RequestID: reqID, Owner: b.Owner, TTLms: ttl.Milliseconds()})
}

// SessionKeepalive builds a keepalive of session id.
func (b *Service) SessionKeepalive(id string) *nats.Msg {
	return b.Msg(streams.OpSessionKeepalive, &streams.SessionKeepaliveRequest{SessionID: id})
}

// SessionClose builds a close of session id.
func (b *Service) SessionClose(id string) *nats.Msg {
	return b.Msg(streams.OpSessionClose, &streams.SessionCloseRequest{SessionID: id})
}

// ParseSession turns the answer to a session operation op (or its
// absence) into a result: Session is the open's session_id; for a close,
// Released says whether it ended the session and Leases how many leases
// ended with it.
func (b *Service) ParseSession(op string, m *nats.Msg, err error) Result {
	if err != nil {
		return clientResult(err)
	}
	if code, after := ServiceErrorDetail(m); code != "" {
		return Result{Code: code, Unknown: code == streams.CodeUnavailable || code == streams.CodeInternal, RetryAfter: after}
	}
	bad := Result{Code: streams.CodeInternal, Unknown: true}
	switch op {
	case streams.OpSessionOpen:
		var r streams.SessionResponse
		if err := jsonv2.Unmarshal(m.Data, &r); err != nil || r.SessionID == "" {
			return bad
		}
		return Result{Code: CodeOK, Session: r.SessionID}
	case streams.OpSessionKeepalive:
		var r streams.KeepaliveResponse
		if err := jsonv2.Unmarshal(m.Data, &r); err != nil || r.SessionID == "" {
			return bad
		}
		return Result{Code: CodeOK, Session: r.SessionID, Leases: r.Leases}
	case streams.OpSessionClose:
		var r streams.SessionCloseResponse
		if err := jsonv2.Unmarshal(m.Data, &r); err != nil {
			return bad
		}
		return Result{Code: CodeOK, Released: r.Closed, Leases: r.Released}
	}
	return bad
}

// ServiceError returns the contract error code of a reply, or "" for a
// success. The body's code is preferred; the header's number is the
// fallback for a body that cannot be parsed.
func ServiceError(m *nats.Msg) string {
	code, _ := ServiceErrorDetail(m)
	return code
}

// ServiceErrorDetail returns the contract error code of a reply ("" for a
// success), as ServiceError does, and the answer's retry_after_ms.
func ServiceErrorDetail(m *nats.Msg) (code string, retryAfter time.Duration) {
	h := m.Header.Get(streams.HeaderErrorCode)
	if h == "" {
		return "", 0
	}
	var er streams.ErrorResponse
	if jsonv2.Unmarshal(m.Data, &er) == nil && er.Error.Code != "" {
		if er.Error.Code == streams.CodeUnavailable || er.Error.Code == streams.CodeInternal {
			noteError(er.Error.Code, er.Error.Message)
		}
		return er.Error.Code, time.Duration(er.Error.RetryAfterMs) * time.Millisecond
	}
	n, _ := strconv.Atoi(h)
	return streams.CodeForStatus(n), 0
}

func (b *Service) Parse(op string, m *nats.Msg, err error) Result {
	if err != nil {
		return clientResult(err)
	}
	if code, after := ServiceErrorDetail(m); code != "" {
		return Result{Code: code, Unknown: code == streams.CodeUnavailable || code == streams.CodeInternal, RetryAfter: after}
	}
	if op == streams.OpRelease {
		var r streams.ReleaseResponse
		if err := jsonv2.Unmarshal(m.Data, &r); err != nil {
			return Result{Code: streams.CodeInternal, Unknown: true}
		}
		return Result{Code: CodeOK, Released: r.Released}
	}
	var r streams.LeaseResponse
	if err := jsonv2.Unmarshal(m.Data, &r); err != nil || r.LeaseID == "" {
		return Result{Code: streams.CodeInternal, Unknown: true}
	}
	return Result{Code: CodeOK, Lease: r.LeaseID, Token: r.Token}
}

// Raw writes the records the service would write, as bare compare-and-set
// publishes to a KV bucket's stream, with the headers the service's writes
// carry (expected last subject sequence; a message id on grants), so that
// the server does the same work and the difference is the service's own
// cost.
type Raw struct {
	bucket, owner, pfx string
}

// NewRaw returns the raw baseline on bucket.
func NewRaw(bucket, owner string) *Raw {
	return &Raw{bucket: bucket, owner: owner, pfx: streams.SubjectPrefix(bucket)}
}

func (b *Raw) Name() string   { return "raw" }
func (b *Raw) Stream() string { return streams.StreamName(b.bucket) }

func (b *Raw) write(res string, rec *streams.Record, rev uint64, msgID string) *nats.Msg {
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

func (b *Raw) record(reqID string, ttl time.Duration, token uint64) *streams.Record {
	now := time.Now()
	return &streams.Record{LeaseID: "0123456789abcdef0123456789abcdef", Owner: b.owner, RequestID: reqID,
		TTLms: ttl.Milliseconds(), Token: token, GrantedAt: streams.FormatTime(now),
		RenewedAt: streams.FormatTime(now), ExpiresAt: streams.FormatTime(now.Add(ttl))}
}

func (b *Raw) Acquire(res, reqID, _ string, ttl, _ time.Duration, rev uint64) *nats.Msg {
	return b.write(res, b.record(reqID, ttl, 0), rev, "acq-"+reqID)
}

func (b *Raw) Renew(res, lease string, ttl time.Duration, rev uint64) *nats.Msg {
	return b.write(res, b.record(lease, ttl, rev), rev, "")
}

func (b *Raw) Release(res, _ string, rev uint64) *nats.Msg { return b.write(res, nil, rev, "") }

// Batch makes msgs one atomic batch of a new id: one commit, all or
// nothing, answered once, for the last message. The stream must allow
// atomic publish.
func (b *Raw) Batch(msgs []*nats.Msg) []*nats.Msg {
	id := nuid.Next()
	for i, m := range msgs {
		m.Header.Set("Nats-Batch-Id", id)
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
	}
	msgs[len(msgs)-1].Header.Set("Nats-Batch-Commit", "1")
	return msgs
}

func (b *Raw) Parse(op string, m *nats.Msg, err error) Result {
	if err != nil {
		return clientResult(err)
	}
	var ack struct {
		Seq   uint64 `json:"seq"`
		Count int    `json:"count"`
		Error *struct {
			Code    int `json:"code"`
			ErrCode int `json:"err_code"`
		} `json:"error"`
	}
	if err := jsonv2.Unmarshal(m.Data, &ack); err != nil {
		return Result{Code: streams.CodeInternal, Unknown: true}
	}
	switch e := ack.Error; {
	case e == nil:
		return Result{Code: CodeOK, Lease: "raw", Token: ack.Seq, Rev: ack.Seq, Released: op == streams.OpRelease, Batch: ack.Count}
	case e.ErrCode == int(jetstream.JSErrCodeStreamWrongLastSequence): // the CAS lost
		return Result{Code: CodeConflict}
	case e.ErrCode == int(jetstream.JSErrCodeStreamWrongLastSequenceConstant): // a write to the key in process (R3)
		return Result{Code: CodeConflict, InProcess: true}
	case e.Code == 503 || e.Code == 408:
		return Result{Code: streams.CodeUnavailable, Unknown: true}
	default:
		return Result{Code: "js_" + strconv.Itoa(e.ErrCode), Unknown: true}
	}
}
