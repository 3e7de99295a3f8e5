package service

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
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
// tombstone), as the stream leader has it. Only a positive answer proves
// anything: a leader cut off by a partition that has just healed answers
// from old state, so a decision that rests on a negative one is made by a
// commit that checks it (cancelCheck).
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
// answered as a duplicate and never written. It commits, in one atomic
// batch, only if the request's lease key and its waiter key are still at
// the revisions read (lease, waiter), which proves the reads the cancel
// decided on: a stale read of either is a conflict, read again. When a
// write with that message id exists already (the request was granted
// before, perhaps to another owner of the tenant, or cancelled before), it
// answers dup=true and that write's sequence (the same tombstone sent
// alone, which the stream refuses as a duplicate, names it; 0 if the id
// left the window meanwhile), and writes the mark instead: the tombstone
// without the message id, on the same conditions. No grant of the request
// can commit then; the mark proves the reads as the tombstone would, keeps
// the request out of every queue for the retry window (cancelCheck), and
// tells a waiter that finds its record gone that it was cancelled.
func (s *store) tombstone(ctx context.Context, hash string, lease, waiter check) (seq uint64, dup bool, err error) {
	msgs := func(msgID string) []*batchMsg {
		return []*batchMsg{{Msg: s.cancelMsg(hash, lease, msgID)}, {Msg: s.checkMsg(waiter.key, waiter.rev)}}
	}
	first := msgs(grantMsgID(hash))
	if _, err = s.batch(ctx, "tombstone", first); !errors.Is(err, errDuplicate) {
		return first[0].seq, false, err
	}
	seq, dup, err = s.publish(ctx, "tombstone", s.cancelMsg(hash, lease, grantMsgID(hash)))
	if err != nil {
		return 0, false, err
	}
	if !dup {
		seq = 0
	}
	_, err = s.batch(ctx, "tombstone", msgs(""))
	return seq, true, err
}

// cancelMsg is the tombstone of request hash, with message id msgID
// unless empty, written only if the lease key is still at its revision.
func (s *store) cancelMsg(hash string, lease check, msgID string) *nats.Msg {
	m := nats.NewMsg(s.subjPfx + cancelKey(hash))
	m.Data = []byte(`{"cancelled":true}`)
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	m.Header.Set(jetstream.MsgTTLHeader, s.ttlHeader)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(lease.rev, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, s.subjPfx+lease.key)
	return m
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

// The records: what the store reads and writes at each key of the bucket
// (an entry), how a record's key and ids are made, and the lease record
// every primitive grants.

// entry is one observation of a key of the bucket: the revision of its
// last write and, unless that write deleted it, the record.
type entry struct {
	rev uint64
	rec *streams.Record  // nil when the key is absent, deleted or foreign
	end *streams.EndMark // what a delete marker says it ended, if anything
	// foreign is set when the value is not a jetlock record. It is nobody's
	// lease or waiter; a lease key holding one is taken over once it has
	// stood for the maximum TTL (see tracker.expired).
	foreign bool
	// sem is the limit of the semaphore whose name record the key holds
	// (streams.AppendNameRecord), 0 for any other value: nobody's lease,
	// never foreign, replaced only under the name rule (engine.go).
	sem int
}

func (e entry) held() bool { return e.rec != nil }

// decodeEntry turns the last write of key (its revision, whether it
// deleted the key, and its value) into an entry. A value that is not a
// complete jetlock record is reported through foreign and becomes a
// foreign entry, never an error: no value anybody writes can wedge a key.
func decodeEntry(key string, rev uint64, deleted bool, data []byte, wakeRoot string, foreign func(key string, rev uint64, err error)) entry {
	e := entry{rev: rev}
	if rev == 0 {
		return e
	}
	if deleted {
		e.end = streams.DecodeEndMark(data)
		return e
	}
	var err error
	switch {
	case strings.HasPrefix(key, streams.LeaseKeyPrefix):
		if n, ok := streams.ParseNameRecord(data); ok {
			e.sem = n
			return e
		}
		e.rec, err = streams.ParseLease(data, rev)
	case strings.HasPrefix(key, streams.WaitKeyPrefix):
		e.rec, err = streams.ParseWaiter(data, rev, wakeRoot)
	case strings.HasPrefix(key, streams.SessionKeyPrefix):
		e.rec, err = streams.ParseSession(data, rev)
	default:
		err = fmt.Errorf("%w: key outside the lease and wait prefixes", streams.ErrForeign)
	}
	if err != nil {
		e.rec, e.foreign = nil, true
		if foreign != nil {
			foreign(key, rev, err)
		}
	}
	return e
}

func newLeaseID() string {
	var b [16]byte // 128 random bits
	if _, err := crand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// requestHash names one logical acquire: the message id of its granting
// write, the key of its cancel tombstone and its waiter key derive from it.
// The tenant is part of it, so two tenants' requests of the same id are two
// requests; a request of no tenant hashes as it did before tenants.
func requestHash(resource, requestID, tenant string) string {
	s := resource + "\x00" + requestID
	if tenant != "" {
		s += "\x00" + tenant
	}
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:20])
}

func grantMsgID(hash string) string { return "acq-" + hash }

func cancelKey(hash string) string { return "cancel." + hash }

func sameLease(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// resourceOf returns the encoded resource of a lease or waiter key.
func resourceOf(key string) string {
	if rest, ok := strings.CutPrefix(key, streams.LeaseKeyPrefix); ok {
		return rest
	}
	enc, _, _ := strings.Cut(strings.TrimPrefix(key, streams.WaitKeyPrefix), ".")
	return enc
}

// decodedResource returns the resource name of an encoded one, or the
// encoded form when it does not decode (a foreign key).
func decodedResource(enc string) string {
	if !strings.Contains(enc, "=") {
		return enc // nothing escaped: the same string, no copy
	}
	if r, err := streams.DecodeResource(enc); err == nil {
		return r
	}
	return enc
}

// newLease builds the record of a lease granted now to requestID of owner
// and tenant for ttl, held at most until holdUntil (zero: no cap).
func newLease(now time.Time, requestID, owner, tenant string, ttl time.Duration, holdUntil time.Time) *streams.Record {
	rec := &streams.Record{
		LeaseID:   newLeaseID(),
		Owner:     owner,
		Tenant:    tenant,
		RequestID: requestID,
		GrantedAt: streams.FormatTime(now),
	}
	setExpiry(rec, now, ttl, holdUntil)
	return rec
}

// setExpiry sets rec's TTL and times for a write at now: ttl, shortened so
// that the lease never outlasts holdUntil.
func setExpiry(rec *streams.Record, now time.Time, ttl time.Duration, holdUntil time.Time) {
	if !holdUntil.IsZero() {
		ttl = min(ttl, holdUntil.Sub(now))
		rec.HoldUntil = streams.FormatTime(holdUntil)
	}
	rec.TTLms = ttl.Milliseconds()
	rec.RenewedAt = streams.FormatTime(now)
	rec.ExpiresAt = streams.FormatTime(now.Add(ttl))
}

// holdUntil returns the hold limit a lease record carries, or the zero
// time.
func holdUntil(rec *streams.Record) time.Time {
	if rec.HoldUntil == "" {
		return time.Time{}
	}
	t, err := streams.ParseTime(rec.HoldUntil)
	if err != nil {
		return time.Time{}
	}
	return t
}

// errHoldOver is returned when a lease has been held for its max hold.
var errHoldOver = errors.New("lease held for its max hold")

// leaseResponse is the answer that hands out the lease rec, whose token is
// token.
func leaseResponse(resource string, token uint64, rec *streams.Record) *streams.LeaseResponse {
	return &streams.LeaseResponse{Resource: resource, LeaseID: rec.LeaseID, Token: token, TTLms: rec.TTLms,
		ExpiresAt: rec.ExpiresAt, HoldUntil: rec.HoldUntil}
}

// The name rule's writes (engine.go): a semaphore's name record, and the
// proof that its permits are free before the record is retired.

// maxChecks bounds the messages of one atomic batch of checks: well under
// JetStream's largest atomic batch (1,000 messages by default).
const maxChecks = 500

// nameMsg is the write of the name record of semaphore name of limit, by
// compare-and-set on expect, for the atomic batch of a permit's grant.
func (s *store) nameMsg(name string, limit int, expect uint64) *batchMsg {
	return s.putMsg(streams.LeaseKey(name), streams.AppendNameRecord(nil, limit), expect, "")
}

// prove proves that each of keys is still at its revision in revs, by
// atomic batches of checks that commit only if it is (checkMsg), and
// writes then, if not nil, in the last of them; so then commits only if
// every key is still at its revision. It returns the last batch's
// revision. Each batch commits after every read it proves: a key proven
// at its revision by an earlier batch was there when that batch
// committed.
func (s *store) prove(ctx context.Context, keys []string, revs []uint64, then *batchMsg) (uint64, error) {
	var seq uint64
	for len(keys) > 0 || then != nil {
		n := min(len(keys), maxChecks)
		msgs := make([]*batchMsg, n, n+1)
		for i := range n {
			msgs[i] = &batchMsg{Msg: s.checkMsg(keys[i], revs[i])}
		}
		keys, revs = keys[n:], revs[n:]
		if len(keys) == 0 && then != nil {
			msgs, then = append(msgs, then), nil
		}
		var err error
		if seq, err = s.batch(ctx, "confirm", msgs); err != nil {
			return 0, err
		}
	}
	return seq, nil
}
