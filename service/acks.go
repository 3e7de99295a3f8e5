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
