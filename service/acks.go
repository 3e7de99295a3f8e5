package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// acks receives the acknowledgements of the store's writes: one
// subscription of the store connection (its inbox prefix, .*), each write
// a reply subject of its own under it. It is nats.go's request, except that
// a write may be answered more than once and every answer reaches the
// writer. That happens right after a partition heals: the node that led
// the stream before it, until it hears of its successor, still takes the
// stream's writes and answers a compare-and-set from its old state,
// "wrong last sequence", at once, while the current leader commits the same
// write and answers after the commit. Taken alone, the first answer would
// report a write that committed as one that lost: a close that closed its
// session answered closed:false (see store.request).
type acks struct {
	nc     *nats.Conn
	once   sync.Once
	err    error
	prefix string // the subscription's subject less its last token
	sub    *nats.Subscription

	mu    sync.Mutex
	next  uint64
	waits map[uint64]chan *nats.Msg
}

// start subscribes, once.
func (a *acks) start() error {
	a.once.Do(func() {
		inbox := a.nc.NewInbox()
		a.prefix = inbox + "."
		a.waits = map[uint64]chan *nats.Msg{}
		sub, err := a.nc.Subscribe(inbox+".*", a.route)
		if err != nil {
			a.err = fmt.Errorf("subscribe to the write acknowledgements: %w", err)
		}
		a.mu.Lock()
		a.sub = sub
		a.mu.Unlock()
	})
	return a.err
}

// stop ends the subscription (the connection is its owner's): writes after
// it fail.
func (a *acks) stop() {
	a.once.Do(func() { a.err = errors.New("the store is stopped") })
	a.mu.Lock()
	sub := a.sub
	a.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
}

// open returns a reply subject for one write, the channel its answers
// arrive on, and the function that ends the wait (answers after it are
// dropped).
func (a *acks) open() (string, <-chan *nats.Msg, func(), error) {
	if err := a.start(); err != nil {
		return "", nil, nil, err
	}
	ch := make(chan *nats.Msg, 2)
	a.mu.Lock()
	a.next++
	id := a.next
	a.waits[id] = ch
	a.mu.Unlock()
	done := func() {
		a.mu.Lock()
		delete(a.waits, id)
		a.mu.Unlock()
	}
	return a.prefix + strconv.FormatUint(id, 10), ch, done, nil
}

// route hands an answer to its write's wait, if it is still open; a third
// answer to one write, which no node sends, is dropped.
func (a *acks) route(m *nats.Msg) {
	id, err := strconv.ParseUint(strings.TrimPrefix(m.Subject, a.prefix), 10, 64)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if ch := a.waits[id]; ch != nil {
		select {
		case ch <- m:
		default:
		}
	}
}

// await returns the next answer on ch, or the error of ctx.
func await(ctx context.Context, ch <-chan *nats.Msg) (*nats.Msg, error) {
	select {
	case m := <-ch:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// isNoResponders reports whether m is the server's status message for a
// request nobody subscribed to (no stream leader listening).
func isNoResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// wrongLastPrefix starts the description of a "wrong last sequence"
// answer, which goes on with the sequence the answering node holds.
const wrongLastPrefix = "wrong last sequence: "

// answerWait says whether data, the answer to a compare-and-set on
// revision expect, is a refusal that may have come from a node that does
// not lead the stream any longer, while the current leader commits the
// write (see ambiguity), and how long to wait for another answer then.
func (s *store) answerWait(data []byte, expect uint64) (wait time.Duration, behind, ambiguous bool) {
	if !bytes.Contains(data, []byte(`"error"`)) {
		return 0, false, false
	}
	var ack pubAck
	if jsonv2.Unmarshal(data, &ack) != nil || ack.Error == nil {
		return 0, false, false
	}
	return s.ambiguity(ack.Error, expect)
}

// ambiguity says whether e, the refusal of a compare-and-set on revision
// expect, may have come from a node that does not lead the stream any
// longer, and how long to wait for the current leader's answer then:
//   - "wrong last sequence" from a node that holds an older revision than
//     expect, one this instance has seen committed: that node is behind
//     the stream (or the key's last write has since expired, as a delete
//     marker does after the retry window). The current leader answers
//     after its commit: four mean commits, at least minSecondAnswer.
//   - a write to the key (or of the same message id) in flight: the
//     current leader's own answer, or that of a node with proposals stuck
//     from before a partition healed. A write sent again (store.del) is
//     answered by the current leader at once, as a duplicate: a mean
//     commit, within 2–20 ms.
//
// behind reports the first case.
func (s *store) ambiguity(e *jetstream.APIError, expect uint64) (wait time.Duration, behind, ambiguous bool) {
	switch e.ErrorCode {
	case codeWrongLastSeq:
		n, found := strings.CutPrefix(e.Description, wrongLastPrefix)
		held, err := strconv.ParseUint(n, 10, 64)
		if found && err == nil && held < expect {
			return max(4*s.commitMean(), minSecondAnswer), true, true
		}
	case codeWrongLastSeqInFlight, codeDuplicateInProcess:
		return min(max(s.commitMean(), 2*time.Millisecond), 20*time.Millisecond), false, true
	}
	return 0, false, false
}

const minSecondAnswer = 100 * time.Millisecond

// A write's round trip: the store publishes a write on a reply subject of
// its own (acks), waits for its answer, and reads the acknowledgement.

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
