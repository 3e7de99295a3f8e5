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
	"sync/atomic"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/jetlock/jetlock/streams"
)

// Store errors. Every write is a compare-and-set; errConflict means the
// revision it was based on is no longer the key's last one: re-read and
// decide again. (A write that meets another to its key still in flight is
// sent again until that one is decided; only past inFlightWait does it
// come back as a conflict, errInFlight.)
var (
	errConflict    = errors.New("revision conflict")
	errUnavailable = errors.New("state store unavailable")
	// errDuplicate: a hand-over's grant carries a message id JetStream has
	// seen within the duplicate window (the waiter's request was cancelled,
	// or granted before).
	errDuplicate = errors.New("grant already written or cancelled")
)

// JetStream error codes the store tells apart.
const (
	// codeNoMessage: the key has never been written (or its last write
	// expired).
	codeNoMessage = jetstream.JSErrCodeMessageNotFound // 10037
	// codeWrongLastSeq: compare-and-set lost, the key moved on (10071 on
	// R1 streams and in some R3 paths).
	codeWrongLastSeq = jetstream.JSErrCodeStreamWrongLastSequence // 10071
	// codeWrongLastSeqInFlight: compare-and-set lost on R3, or another
	// write to the key is still being proposed.
	codeWrongLastSeqInFlight = jetstream.JSErrCodeStreamWrongLastSequenceConstant // 10164
	// codeDuplicateInProcess: a write with the same message id is still
	// being proposed (JSStreamDuplicateMessageConflict): decide again.
	codeDuplicateInProcess jetstream.ErrorCode = 10158
	// codeBatchDuplicate: an atomic batch carries a message id already
	// stored within the duplicate window.
	codeBatchDuplicate jetstream.ErrorCode = 10201
	// codeBatchInflight: the stream already assembles as many atomic
	// batches as it allows at once (50 by default); the batch was refused
	// whole on its first message, and its commit then answers
	// codeBatchIncomplete. Nothing of it was written: send it again.
	codeBatchInflight   jetstream.ErrorCode = 10210
	codeBatchIncomplete jetstream.ErrorCode = 10176
)

// errBatchRefused: an atomic batch was refused before any of it was
// proposed (see codeBatchInflight); it may be sent again as it is.
var errBatchRefused = errors.New("atomic batch refused: too many in flight")

// errInFlight: a compare-and-set met another write to its key that is
// still being proposed (codeWrongLastSeqInFlight), or a message id whose
// first write is (codeDuplicateInProcess). Nothing was written, and
// whether the key moves on is not yet known. It wraps errConflict.
var errInFlight = errors.New("another write to the key is in flight")

// batchRetries bounds the resends of a refused batch.
const batchRetries = 20

// Header names nats.go does not export: the KV operation of a delete
// marker, and those of an atomic batch publish (nats-server 2.12 and
// later).
const (
	kvOperationHeader = "KV-Operation"
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// store performs jetlock's reads and compare-and-set writes on the bucket.
// Reads go to the stream leader (never a possibly lagging direct-get
// follower), writes carry the revision they are based on.
type store struct {
	nc        *nats.Conn
	subjPfx   string // "$KV.<bucket>."
	stream    string // "KV_<bucket>"
	getSubj   string // "$JS.API.STREAM.MSG.GET.KV_<bucket>"
	ackPrefix []byte // `{"stream":"KV_<bucket>","seq":`, how nats-server starts an ack
	ttlHeader string // Nats-TTL of delete markers and cancel tombstones: the retry window

	decode func(key string, rev uint64, deleted bool, data []byte) entry
	commit func(op string, d time.Duration) // observes each write's round trip

	// floor is the token high-water mark last recorded: every write made
	// from now on must commit above it. A write acknowledged at or below
	// the floor it was sent under means the stream was recreated or
	// restored behind the service's back; regressed is then called, and a
	// grant so written is not handed out.
	floor     atomic.Uint64
	regressed func(seq, floor uint64)

	// mean is a moving mean of the writes' round trips, in nanoseconds.
	mean atomic.Int64

	acks acks // the writes' acknowledgements
}

// commitMean returns the recent mean round trip of a write.
func (s *store) commitMean() time.Duration { return time.Duration(s.mean.Load()) }

func newStore(nc *nats.Conn, bucket string, retryWindow time.Duration) *store {
	stream := streams.StreamName(bucket)
	return &store{
		nc:        nc,
		acks:      acks{nc: nc},
		subjPfx:   streams.SubjectPrefix(bucket),
		stream:    stream,
		getSubj:   "$JS.API.STREAM.MSG.GET." + stream,
		ackPrefix: []byte(`{"stream":"` + stream + `","seq":`),
		ttlHeader: strconv.FormatInt(int64((retryWindow+time.Second-1)/time.Second), 10) + "s",
		decode: func(key string, rev uint64, deleted bool, data []byte) entry {
			return decodeEntry(key, rev, deleted, data, "", nil)
		},
		commit:    func(string, time.Duration) {},
		regressed: func(uint64, uint64) {},
	}
}

type msgGetResponse struct {
	Type    string              `json:"type"`
	Message *storedMsg          `json:"message"`
	Error   *jetstream.APIError `json:"error"`
}

// read returns the key's last entry as the stream leader has it. A key
// never written is entry{rev: 0}.
func (s *store) read(ctx context.Context, key string) (entry, error) {
	m, err := s.get(ctx, s.lastOf(key))
	if err != nil || m == nil {
		return entry{}, err
	}
	return s.decode(key, m.Seq, isDeleteOp(m.Hdrs), m.Data), nil
}

// exists reports whether key holds a value that was not deleted (a cancel
// tombstone), as the stream leader has it.
func (s *store) exists(ctx context.Context, key string) (bool, error) {
	m, err := s.get(ctx, s.lastOf(key))
	return m != nil && !isDeleteOp(m.Hdrs), err
}

// keyAt returns the key of the write at revision seq, or "" when the
// stream holds it no longer (a later write to its key replaced it).
func (s *store) keyAt(ctx context.Context, seq uint64) (string, error) {
	m, err := s.get(ctx, []byte(`{"seq":`+strconv.FormatUint(seq, 10)+`}`))
	if err != nil || m == nil {
		return "", err
	}
	return strings.TrimPrefix(m.Subject, s.subjPfx), nil
}

// lastOf is the request for key's last message.
func (s *store) lastOf(key string) []byte {
	req, _ := json.Marshal(map[string]string{"last_by_subj": s.subjPfx + key})
	return req
}

// storedMsg is a message as the stream leader returns it.
type storedMsg struct {
	Subject string `json:"subject"`
	Seq     uint64 `json:"seq"`
	Hdrs    []byte `json:"hdrs"`
	Data    []byte `json:"data"`
}

// get asks the stream leader for the message req names; nil when there is
// none.
func (s *store) get(ctx context.Context, req []byte) (*storedMsg, error) {
	msg, err := s.nc.RequestWithContext(ctx, s.getSubj, req)
	if err != nil {
		return nil, classify(err)
	}
	var resp msgGetResponse
	if err := jsonv2.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("%w: bad stream msg get reply: %w", errUnavailable, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == codeNoMessage {
			return nil, nil
		}
		return nil, classify(resp.Error)
	}
	if resp.Message == nil || resp.Message.Seq == 0 {
		return nil, fmt.Errorf("%w: empty stream msg get reply", errUnavailable)
	}
	return resp.Message, nil
}

// isDeleteOp reports whether raw message headers mark a KV delete or purge.
func isDeleteOp(hdrs []byte) bool {
	for _, line := range strings.Split(string(hdrs), "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), kvOperationHeader) {
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
//
// rec is a lease record, or a waiter held as a Record (it names a wake
// subject), which is written in the waiter's own form (streams.Waiter).
func (s *store) put(ctx context.Context, key string, rec *streams.Record, expect uint64, msgID string) (seq uint64, dup bool, err error) {
	buf := encode(recordForm(key, rec))
	defer buf.free()
	m := newWrite(s.subjPfx + key)
	defer freeWrite(m)
	m.Data = buf.b
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	return s.publish(ctx, "put", m)
}

// recordForm is rec as it is written at key: a waiter in the waiter's own
// form (it names a wake subject), a session's record in the session's,
// else the lease record.
func recordForm(key string, rec *streams.Record) appender {
	switch {
	case rec.Wake != "":
		return streams.WaiterOf(rec)
	case strings.HasPrefix(key, streams.SessionKeyPrefix):
		return streams.SessionOf(rec)
	}
	return rec
}

// deleteMsg builds the delete marker of key: expected last revision
// expect, body end (if any). The marker lives for the retry window only
// (Nats-TTL), so that markers of ended leases never pile up in the bucket;
// after it a key reads as never written, and its next grant still gets a
// larger revision.
func (s *store) deleteMsg(key string, expect uint64, end []byte) *batchMsg {
	return &batchMsg{Msg: s.deleteWrite(nats.NewMsg(s.subjPfx+key), expect, end)}
}

// deleteWrite makes m the delete marker deleteMsg describes.
func (s *store) deleteWrite(m *nats.Msg, expect uint64, end []byte) *nats.Msg {
	m.Data = end
	m.Header.Set(kvOperationHeader, "DEL")
	m.Header.Set(jetstream.MsgTTLHeader, s.ttlHeader)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	return m
}

// del writes a delete marker on key if its last revision is still expect.
// A non-nil end becomes the marker's body.
//
// An end (a release, a close) is answered to its caller, and a refusal
// that came from a node that no longer leads the stream, while the
// current leader committed the end, would answer it wrongly ("released:
// false"; see acks). So an end carries a message id of its own, and one
// refused in a way that may hide a commit (answerWait) is sent again, a
// few times: if the first committed after all, the stream answers the
// resend as its duplicate, with the first's revision.
func (s *store) del(ctx context.Context, key string, expect uint64, end *streams.EndMark) (uint64, error) {
	var body []byte
	if end != nil {
		buf := encode(end)
		defer buf.free()
		body = buf.b
	}
	m := s.deleteWrite(newWrite(s.subjPfx+key), expect, body)
	defer freeWrite(m)
	if end == nil {
		seq, _, err := s.publish(ctx, "delete", m)
		return seq, err
	}
	m.Header.Set(jetstream.MsgIDHeader, "end-"+nuid.Next())
	for try := 0; ; try++ {
		seq, _, err := s.publish(ctx, "delete", m)
		if try == endResends || !s.mayHaveCommitted(err, expect) {
			return seq, err
		}
		select {
		case <-ctx.Done():
			return 0, classify(ctx.Err())
		case <-time.After(time.Duration(1<<try) * time.Millisecond):
		}
	}
}

// endResends bounds the resends of an end (del).
const endResends = 6

// mayHaveCommitted reports whether err, a write's refusal, may have come
// from a node that no longer leads the stream while the write committed
// (see answerWait).
func (s *store) mayHaveCommitted(err error, expect uint64) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	_, _, ambiguous := s.ambiguity(apiErr, expect)
	return ambiguous
}

// confirm proves that key's last revision is still rev, by a write that
// commits only if it is: a small record on the "confirm" key carrying
// rev as the expected last sequence of key. A read may come from a stream
// leader that has just lost its place (after a partition heals it can
// answer from old state); this write commits only through a current leader
// with a quorum. It returns errConflict when key has moved on. The
// "confirm" key holds one message however often it is written.
func (s *store) confirm(ctx context.Context, key string, rev uint64) error {
	_, _, err := s.publish(ctx, "confirm", s.checkMsg(key, rev))
	return err
}

// tombstone writes the cancel tombstone of a request (key cancelKey(hash),
// living for the retry window) carrying its grant's message id, so that a
// grant of the request arriving later within the duplicate window is
// answered as a duplicate and never written. It commits only if the
// request's lease key is still at leaseRev, which proves the read the
// cancel decided on. When a write with msgID already exists it answers
// dup=true and that write's sequence.
func (s *store) tombstone(ctx context.Context, hash, leaseKey string, leaseRev uint64) (seq uint64, dup bool, err error) {
	m := nats.NewMsg(s.subjPfx + cancelKey(hash))
	m.Data = []byte(`{"cancelled":true}`)
	m.Header.Set(jetstream.MsgIDHeader, grantMsgID(hash))
	m.Header.Set(jetstream.MsgTTLHeader, s.ttlHeader)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(leaseRev, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, s.subjPfx+leaseKey)
	return s.publish(ctx, "tombstone", m)
}

// cancelMark writes the cancel tombstone of request hash without the
// grant's message id: the proof of a cancel, for a waiting acquire of that
// hash whose grant message id another owner's grant of the same request
// id has taken (so the tombstone proper was refused as its duplicate).
func (s *store) cancelMark(ctx context.Context, hash string) error {
	m := nats.NewMsg(s.subjPfx + cancelKey(hash))
	m.Data = []byte(`{"cancelled":true}`)
	m.Header.Set(jetstream.MsgTTLHeader, s.ttlHeader)
	_, _, err := s.publish(ctx, "tombstone", m)
	return err
}

// handOver writes, in one atomic batch (one commit), the grant rec of a
// waiter at leaseKey over the lease revision leaseRev, and the removal of
// the waiter's record at waitKey, revision waitRev. The grant carries
// msgID, the waiter's grant message id, so a cancelled waiter is never
// granted (errDuplicate). A grant to a waiter of a session also checks
// the session (see leaseWrites). It returns the grant's revision, its
// token, and the revision of the waiter record's removal.
func (s *store) handOver(ctx context.Context, leaseKey string, rec *streams.Record, leaseRev uint64, msgID, waitKey string, waitRev uint64, session check) (token, removed uint64, err error) {
	ws := append(leaseWrites(leaseKey, rec, leaseRev, msgID, session), write{key: waitKey, expect: waitRev})
	revs, dup, err := s.commitWrites(ctx, "handover", ws)
	switch {
	case dup:
		return 0, 0, errDuplicate
	case err != nil:
		return 0, 0, err
	}
	return revs[0], revs[len(revs)-1], nil
}

// commitWrites writes ws, a decision's writes (engine.go), as one atomic
// batch, or a lone write without a check as one compare-and-set put, and
// returns each write's revision (a check's is the batch's). dup reports
// that a message id was seen: an earlier write of the request.
func (s *store) commitWrites(ctx context.Context, op string, ws []write) (revs []uint64, dup bool, err error) {
	if len(ws) == 1 && !ws[0].check && ws[0].e.rec != nil {
		w := ws[0]
		seq, dup, err := s.put(ctx, w.key, w.e.rec, w.expect, w.msgID)
		return []uint64{seq}, dup, err
	}
	msgs := make([]*batchMsg, len(ws))
	for i, w := range ws {
		msgs[i] = s.msgOf(w)
	}
	if _, err := s.batch(ctx, op, msgs); err != nil {
		if errors.Is(err, errDuplicate) {
			return nil, true, nil
		}
		return nil, false, err
	}
	revs = make([]uint64, len(ws))
	for i, m := range msgs {
		revs[i] = m.seq
	}
	return revs, false, nil
}

// msgOf is the message of the write w, for an atomic batch.
func (s *store) msgOf(w write) *batchMsg {
	var m *batchMsg
	switch {
	case w.check:
		return &batchMsg{Msg: s.checkMsg(w.key, w.expect)}
	case w.e.sem != 0:
		m = s.putMsg(w.key, streams.AppendNameRecord(nil, w.e.sem), w.expect, "")
	case w.e.rec != nil:
		m = s.putMsg(w.key, recordForm(w.key, w.e.rec).AppendJSON(nil), w.expect, "")
	default:
		var end []byte
		if w.e.end != nil {
			end = w.e.end.AppendJSON(nil)
		}
		m = s.deleteMsg(w.key, w.expect, end)
	}
	if w.msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, w.msgID)
	}
	return m
}

// check names a key whose last revision a write must find unchanged: the
// session record a session's grant depends on. The zero check checks
// nothing.
type check struct {
	key string
	rev uint64
}

// putMsg is the write of body at key if its last revision is still expect,
// with message id msgID if not empty, for an atomic batch.
func (s *store) putMsg(key string, body []byte, expect uint64, msgID string) *batchMsg {
	m := nats.NewMsg(s.subjPfx + key)
	m.Data = body
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(expect, 10))
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	return &batchMsg{Msg: m}
}

// checkMsg is a write that commits only if key's last revision is rev: a
// small record on the "confirm" key carrying rev as the expected last
// sequence of key. The "confirm" key holds one message however often it
// is written.
func (s *store) checkMsg(key string, rev uint64) *nats.Msg {
	m := nats.NewMsg(s.subjPfx + "confirm")
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, s.subjPfx+key)
	return m
}

// batchMsg is one message of an atomic batch and, once committed, its
// revision.
type batchMsg struct {
	*nats.Msg
	seq uint64
}

// batch writes msgs as one atomic batch: one replicated commit, all or
// nothing. Every message goes out on one connection, in order; only the
// commit is answered, for the whole batch, and the batch's messages commit
// at consecutive revisions, which batch sets in each. A compare-and-set
// of any message that fails fails the batch (errConflict); a message id
// already seen fails it as errDuplicate.
func (s *store) batch(ctx context.Context, op string, msgs []*batchMsg) (uint64, error) {
	seq, _, err := s.resend(ctx, func() (uint64, bool, error) {
		seq, err := s.batchOnce(ctx, op, msgs)
		return seq, false, err
	})
	return seq, err
}

// inFlightWait bounds how long a write that met another write to its key
// in flight (errInFlight) is sent again: longer than a commit takes on a
// loaded cluster. Past it, the caller sees the conflict and decides again
// on a fresh read.
const inFlightWait = 2 * time.Second

// resend calls send, and calls it again while its write is refused for a
// reason that sending it again as it is mends: a batch refused whole
// (errBatchRefused), or a write that met another in flight (errInFlight),
// which is sent again once that one has had about a commit to decide, so
// that the caller learns whether its key moved on. Without it, a caller
// that re-read the key while the other write was in flight read it
// unchanged, wrote again, met the same write, and spent its attempts.
func (s *store) resend(ctx context.Context, send func() (uint64, bool, error)) (uint64, bool, error) {
	start := time.Now()
	for try := 0; ; try++ {
		seq, dup, err := send()
		var pause time.Duration
		switch {
		case errors.Is(err, errBatchRefused) && try < batchRetries:
			pause = time.Duration(1+rand.IntN(2<<min(try, 4))) * time.Millisecond
		case errors.Is(err, errInFlight) && time.Since(start) < inFlightWait:
			pause = min(max(s.commitMean()/2, time.Millisecond)<<min(try, 6), 100*time.Millisecond)
		default:
			return seq, dup, err
		}
		select {
		case <-ctx.Done():
			return 0, false, classify(ctx.Err())
		case <-time.After(pause):
		}
	}
}

// batchOnce sends msgs as one batch of a new id.
func (s *store) batchOnce(ctx context.Context, op string, msgs []*batchMsg) (uint64, error) {
	id := nuid.Next()
	last := len(msgs) - 1
	var expect uint64
	for i, m := range msgs {
		expect = max(expect, expectedRev(m.Msg))
		m.Header.Set(batchIDHeader, id)
		m.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
		if i == last {
			m.Header.Set(batchCommitHeader, "1")
			break
		}
		m.Reply = ""
		if err := s.nc.PublishMsg(m.Msg); err != nil {
			return 0, classify(err)
		}
	}
	seq, _, err := s.write(ctx, op, msgs[last].Msg, expect)
	if err != nil {
		return 0, err
	}
	for i, m := range msgs {
		m.seq = seq - uint64(last-i)
	}
	return seq, nil
}

// writePool holds the messages of the writes made on every request:
// nats.go has copied a message into its write buffer once its request or
// publish call returns, so the message and its header map serve the next
// write.
var writePool = sync.Pool{New: func() any { return &nats.Msg{Header: nats.Header{}} }}

// newWrite returns a pooled message for subject with no headers.
func newWrite(subject string) *nats.Msg {
	m := writePool.Get().(*nats.Msg)
	m.Subject = subject
	return m
}

// freeWrite empties m and returns it to the pool; m must not be used
// after.
func freeWrite(m *nats.Msg) {
	clear(m.Header)
	m.Subject, m.Reply, m.Data = "", "", nil
	writePool.Put(m)
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

// pubAck is JetStream's answer to a publish.
type pubAck struct {
	Error     *jetstream.APIError `json:"error"`
	Stream    string              `json:"stream"`
	Seq       uint64              `json:"seq"`
	Duplicate bool                `json:"duplicate"`
	Batch     string              `json:"batch"`
	Count     int                 `json:"count"`
}

// noResponderRetries and noResponderWait bound the retries of a publish
// that found no stream leader listening, as during a leader change.
const (
	noResponderRetries = 10
	noResponderWait    = 100 * time.Millisecond
)

// publish sends m to the stream and waits for its acknowledgement (see
// write).
func (s *store) publish(ctx context.Context, op string, m *nats.Msg) (uint64, bool, error) {
	return s.resend(ctx, func() (uint64, bool, error) { return s.write(ctx, op, m, expectedRev(m)) })
}

// expectedRev is the revision m's compare-and-set is based on (0: none).
func expectedRev(m *nats.Msg) uint64 {
	n, _ := strconv.ParseUint(m.Header.Get(jetstream.ExpectedLastSubjSeqHeader), 10, 64)
	return n
}

// write sends m to the stream and waits for its acknowledgement: the
// request jetstream.PublishMsg makes, with a faster decoder for the
// acknowledgement, which every write pays. expect is the highest revision
// the write's compare-and-sets are based on. Only a publish that reached
// no stream leader ("no responders": certainly not written) is retried;
// any other failure goes back to the caller, which decides again on fresh
// state.
func (s *store) write(ctx context.Context, op string, m *nats.Msg, expect uint64) (uint64, bool, error) {
	floor, start := s.floor.Load(), time.Now()
	msg, err := s.request(ctx, m, expect)
	if err != nil {
		return 0, false, classify(err)
	}
	d := time.Since(start)
	s.commit(op, d)
	// Racy by design: a lost update of a moving mean costs nothing.
	mean := s.mean.Load()
	s.mean.Store(mean - mean/8 + int64(d)/8)
	seq, dup, err := s.parseAck(msg.Data)
	if err == nil && !dup && seq <= floor {
		s.regressed(seq, floor)
		if op == "handover" || op == "grant" || m.Header.Get(jetstream.MsgIDHeader) != "" {
			// A grant whose token went backwards is never handed out.
			return 0, false, fmt.Errorf("%w: the stream committed at %d, at or below the token high-water mark %d: it was recreated or restored", errUnavailable, seq, floor)
		}
	}
	return seq, dup, err
}

// request publishes m on a reply subject of its own (see acks) and returns
// its answer: the first, unless that is a refusal that may have come from
// a node that no longer leads the stream (answerWait): then the next
// answer that is not from behind, if one comes within the wait.
func (s *store) request(ctx context.Context, m *nats.Msg, expect uint64) (*nats.Msg, error) {
	reply, ch, done, err := s.acks.open()
	if err != nil {
		return nil, err
	}
	defer done()
	m.Reply = reply
	var msg *nats.Msg
	for r := 0; ; r++ {
		if err := s.nc.PublishMsg(m); err != nil {
			return nil, err
		}
		if msg, err = await(ctx, ch); err != nil {
			return nil, err
		}
		if !isNoResponders(msg) {
			break
		}
		if r == noResponderRetries {
			return nil, nats.ErrNoResponders
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(noResponderWait):
		}
	}
	wait, _, ambiguous := s.answerWait(msg.Data, expect)
	if !ambiguous {
		return msg, nil
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		next, err := await(wctx, ch)
		if err != nil {
			// The only answer: the key's last write expired, or the
			// current leader's answer is late. The caller decides again
			// on a fresh read; an end is sent again (del).
			return msg, nil
		}
		if _, alsoBehind, _ := s.answerWait(next.Data, expect); !alsoBehind && !isNoResponders(next) {
			return next, nil
		}
	}
}

// parseAck decodes an acknowledgement.
func (s *store) parseAck(b []byte) (uint64, bool, error) {
	if seq, dup, ok := s.quickAck(b); ok {
		return seq, dup, nil
	}
	var ack pubAck
	if err := jsonv2.Unmarshal(b, &ack); err != nil {
		return 0, false, fmt.Errorf("%w: bad publish acknowledgement: %w", errUnavailable, err)
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
// Anything else (an error, a domain, a batch) is left to the decoder.
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

// classify maps a NATS or JetStream error to errConflict, errDuplicate,
// errUnavailable (outcome unknown or no quorum) or a plain error, keeping
// the cause: errors.As(err, **jetstream.APIError) and errors.Is(err,
// context.DeadlineExceeded) see through it.
func classify(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case codeWrongLastSeq:
			return fmt.Errorf("%w: %w", errConflict, err)
		case codeWrongLastSeqInFlight, codeDuplicateInProcess:
			return fmt.Errorf("%w: %w: %w", errConflict, errInFlight, err)
		case codeBatchDuplicate:
			return fmt.Errorf("%w: %w", errDuplicate, err)
		case codeBatchInflight, codeBatchIncomplete:
			return fmt.Errorf("%w: %w: %w", errUnavailable, errBatchRefused, err)
		}
		if apiErr.Code == 503 || apiErr.Code == 408 || apiErr.Code == 500 || apiErr.Code == 429 {
			return fmt.Errorf("%w: %w", errUnavailable, err)
		}
		return fmt.Errorf("jetstream: %w", err)
	}
	return fmt.Errorf("%w: %w", errUnavailable, err)
}
