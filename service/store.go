package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/streams"
)

// Store errors. Every write is a compare-and-set; errConflict means the
// revision it was based on is no longer the key's last one (or a write to
// the key is in flight): re-read and decide again.
var (
	errConflict    = errors.New("revision conflict")
	errUnavailable = errors.New("state store unavailable")
)

// entry is one observation of a lease key: the revision of its last write
// and, unless that write deleted it, the record.
type entry struct {
	rev uint64
	rec *streams.Record  // nil when the key is absent or deleted
	end *streams.EndMark // what a delete marker says it ended, if anything
}

func (e entry) held() bool { return e.rec != nil }

// store performs jetlock's reads and compare-and-set writes on the bucket.
// Reads go to the stream leader (never a possibly lagging direct-get
// follower), writes carry the revision they are based on.
type store struct {
	nc        *nats.Conn
	bucket    string
	subjPfx   string // "$KV.<bucket>."
	stream    string // "KV_<bucket>"
	getSubj   string // "$JS.API.STREAM.MSG.GET.KV_<bucket>"
	ackPrefix []byte // `{"stream":"KV_<bucket>","seq":`, how nats-server starts an ack
	ttlHeader string // Nats-TTL of cancel tombstones
}

func newStore(nc *nats.Conn, bucket string, retryWindow time.Duration) *store {
	return &store{
		nc:        nc,
		bucket:    bucket,
		subjPfx:   streams.SubjectPrefix(bucket),
		stream:    streams.StreamName(bucket),
		getSubj:   "$JS.API.STREAM.MSG.GET." + streams.StreamName(bucket),
		ackPrefix: []byte(`{"stream":"` + streams.StreamName(bucket) + `","seq":`),
		ttlHeader: strconv.FormatInt(int64((retryWindow+time.Second-1)/time.Second), 10) + "s",
	}
}

type msgGetResponse struct {
	Type    string `json:"type"`
	Message *struct {
		Subject string `json:"subject"`
		Seq     uint64 `json:"seq"`
		Hdrs    []byte `json:"hdrs"`
		Data    []byte `json:"data"`
	} `json:"message"`
	Error *jetstream.APIError `json:"error"`
}

// read returns the key's last entry as the stream leader has it. A key
// never written is entry{rev: 0}.
func (s *store) read(ctx context.Context, key string) (entry, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": s.subjPfx + key})
	msg, err := s.nc.RequestWithContext(ctx, s.getSubj, req)
	if err != nil {
		return entry{}, classify(err)
	}
	var resp msgGetResponse
	if err := jsonv2.Unmarshal(msg.Data, &resp); err != nil {
		return entry{}, fmt.Errorf("%w: bad stream msg get reply: %v", errUnavailable, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return entry{}, nil
		}
		return entry{}, classify(resp.Error)
	}
	if resp.Message == nil {
		return entry{}, fmt.Errorf("%w: empty stream msg get reply", errUnavailable)
	}
	e := entry{rev: resp.Message.Seq}
	if isDeleteOp(resp.Message.Hdrs) {
		e.end = streams.DecodeEndMark(resp.Message.Data)
		return e, nil
	}
	if e.rec, err = streams.DecodeRecord(resp.Message.Data); err != nil {
		return entry{}, fmt.Errorf("corrupt record at %s revision %d: %w", key, e.rev, err)
	}
	return e, nil
}

// isDeleteOp reports whether raw message headers mark a KV delete or purge.
func isDeleteOp(hdrs []byte) bool {
	for _, line := range strings.Split(string(hdrs), "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), "KV-Operation") {
			v = strings.TrimSpace(v)
			return v == "DEL" || v == "PURGE"
		}
	}
	return false
}

// put writes rec to key if the key's last revision is still expect (0 for
// a key never written). A non-empty msgID makes the write idempotent within
// the stream's duplicate window: a repeat answers dup=true and the sequence
// of the original write, without writing.
func (s *store) put(ctx context.Context, key string, rec *streams.Record, expect uint64, msgID string) (seq uint64, dup bool, err error) {
	buf := encode(rec)
	defer buf.free()
	m := nats.NewMsg(s.subjPfx + key)
	m.Data = buf.b
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	return s.publish(ctx, m)
}

// del writes a delete marker on key if its last revision is still expect.
// A non-nil end becomes the marker's body.
func (s *store) del(ctx context.Context, key string, expect uint64, end *streams.EndMark) (uint64, error) {
	m := nats.NewMsg(s.subjPfx + key)
	if end != nil {
		buf := encode(end)
		defer buf.free()
		m.Data = buf.b
	}
	m.Header.Set("KV-Operation", "DEL")
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	seq, _, err := s.publish(ctx, m)
	return seq, err
}

// confirm proves that key's last revision is still rev, by a write that
// commits only if it is: a small record on the "confirm" key carrying
// rev as the expected last sequence of key. A read may come from a stream
// leader that has just lost its place (after a partition heals it can
// answer from old state); this write commits only through a current leader
// with a quorum. It returns errConflict when key has moved on.
func (s *store) confirm(ctx context.Context, key string, rev uint64) error {
	m := nats.NewMsg(s.subjPfx + "confirm")
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	m.Header.Set("Nats-Expected-Last-Subject-Sequence-Subject", s.subjPfx+key)
	_, _, err := s.publish(ctx, m)
	return err
}

// tombstone writes a short-lived marker carrying msgID, so that a grant
// with the same message id arriving later within the duplicate window is
// answered as a duplicate and never written. When a write with msgID
// already exists, it answers dup=true and that write's sequence.
func (s *store) tombstone(ctx context.Context, key, msgID string) (seq uint64, dup bool, err error) {
	m := nats.NewMsg(s.subjPfx + key)
	m.Data = []byte(`{"cancelled":true}`)
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	m.Header.Set("Nats-TTL", s.ttlHeader)
	return s.publish(ctx, m)
}

// appender is a body with a hand-written encoder (see streams/encode.go).
type appender interface{ AppendJSON([]byte) []byte }

// encoded is a body encoded into a pooled buffer. The writes and replies
// built on every request encode into these: nats.go copies a message into
// its write buffer before PublishMsg or RequestMsg returns, so the buffer
// is free again once the message has been sent.
type encoded struct{ b []byte }

var encodedPool = sync.Pool{New: func() any { return &encoded{b: make([]byte, 0, 512)} }}

// encode encodes v into a pooled buffer; free returns the buffer.
func encode(v appender) *encoded {
	e := encodedPool.Get().(*encoded)
	e.b = v.AppendJSON(e.b[:0])
	return e
}

func (e *encoded) free() {
	if cap(e.b) <= 64<<10 {
		encodedPool.Put(e)
	}
}

// marshal encodes a body that has no hand-written encoder (the bodies
// written on every request have theirs, about four times faster than
// json/v2: streams.BenchmarkEncodeRecord; see encode) with the
// encoding/json/v2 prototype, which took about a quarter less time than
// encoding/json on a lease record. A value json/v2 refuses (a string that
// is not valid UTF-8, which validation keeps out of records and replies)
// goes through encoding/json, which replaces the bad bytes.
func marshal(v any) ([]byte, error) {
	if b, err := jsonv2.Marshal(v); err == nil {
		return b, nil
	}
	return json.Marshal(v)
}

// pubAck is JetStream's answer to a publish.
type pubAck struct {
	Error     *jetstream.APIError `json:"error"`
	Stream    string              `json:"stream"`
	Seq       uint64              `json:"seq"`
	Duplicate bool                `json:"duplicate"`
}

// noResponderRetries and noResponderWait bound the retries of a publish
// that found no stream leader listening, as during a leader change.
const (
	noResponderRetries = 10
	noResponderWait    = 100 * time.Millisecond
)

// publish sends m to the stream and waits for its acknowledgement. It is
// the request jetstream.PublishMsg makes, with a faster decoder for the
// acknowledgement, which every write pays. Only a publish that reached no
// stream leader ("no responders": certainly not written) is retried; any
// other failure goes back to the caller, which decides again on fresh
// state.
func (s *store) publish(ctx context.Context, m *nats.Msg) (uint64, bool, error) {
	msg, err := s.nc.RequestMsgWithContext(ctx, m)
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < noResponderRetries; r++ {
		select {
		case <-ctx.Done():
			return 0, false, classify(err)
		case <-time.After(noResponderWait):
		}
		msg, err = s.nc.RequestMsgWithContext(ctx, m)
	}
	if err != nil {
		return 0, false, classify(err)
	}
	if seq, dup, ok := s.quickAck(msg.Data); ok {
		return seq, dup, nil
	}
	var ack pubAck
	if err := jsonv2.Unmarshal(msg.Data, &ack); err != nil {
		return 0, false, fmt.Errorf("%w: bad publish acknowledgement: %v", errUnavailable, err)
	}
	if ack.Error != nil {
		return 0, false, classify(ack.Error)
	}
	if ack.Stream != s.stream || ack.Seq == 0 {
		return 0, false, fmt.Errorf("%w: publish acknowledged by stream %q at %d, want %q", errUnavailable, ack.Stream, ack.Seq, s.stream)
	}
	return ack.Seq, ack.Duplicate, nil
}

// quickAck reads the two acknowledgements that nats-server writes on every
// write to the bucket's stream without a JSON decoder:
// {"stream":"KV_b","seq":N} and {"stream":"KV_b","seq":N,"duplicate": true}.
// Anything else (an error, a domain) is left to the decoder.
func (s *store) quickAck(b []byte) (seq uint64, dup, ok bool) {
	rest, found := bytes.CutPrefix(b, s.ackPrefix)
	if !found {
		return 0, false, false
	}
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	seq, err := strconv.ParseUint(string(rest[:i]), 10, 64)
	if err != nil || seq == 0 {
		return 0, false, false
	}
	switch string(rest[i:]) {
	case "}":
		return seq, false, true
	case `,"duplicate": true}`, `,"duplicate":true}`:
		return seq, true, true
	}
	return 0, false, false
}

// classify maps a NATS or JetStream error to errConflict, errUnavailable
// (outcome unknown or no quorum) or a plain error.
func classify(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant, 10158:
			return fmt.Errorf("%w: %v", errConflict, apiErr)
		}
		if apiErr.Code == 503 || apiErr.Code == 408 || apiErr.Code == 500 {
			return fmt.Errorf("%w: %v", errUnavailable, apiErr)
		}
		return fmt.Errorf("jetstream: %w", apiErr)
	}
	return fmt.Errorf("%w: %v", errUnavailable, err)
}
