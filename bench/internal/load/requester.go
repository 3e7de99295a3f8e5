package load

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Client-side outcomes that carry no reply.
var (
	ErrTimeout  = errors.New("timeout")
	ErrBacklog  = errors.New("backlog: too many requests in flight")
	ErrClosed   = errors.New("requester closed")
	ErrNoAnswer = errors.New("no responders")
)

// Requester sends NATS requests asynchronously: any number in flight on a
// few connections, each answered through one wildcard inbox subscription
// per connection, so the load generator never waits for a reply before
// sending the next request. It is safe for concurrent use.
type Requester struct {
	conns       []*nats.Conn
	inboxes     []string // "<inbox>." per connection
	subs        []*nats.Subscription
	maxInFlight int64
	inflight    atomic.Int64

	mu      sync.Mutex
	pending map[uint64]*call
	seq     uint64
	closed  bool
}

// call is one request in flight.
type call struct {
	timer *time.Timer
	done  func(reply *nats.Msg, at time.Time, err error)
}

// NewRequester subscribes to an inbox on each of conns, which it uses but
// does not own.
func NewRequester(conns []*nats.Conn, maxInFlight int) (*Requester, error) {
	r := &Requester{conns: conns, maxInFlight: int64(maxInFlight), pending: map[uint64]*call{}}
	for _, nc := range conns {
		inbox := nc.NewRespInbox()
		inbox = inbox[:strings.LastIndexByte(inbox, '.')+1]
		sub, err := nc.Subscribe(inbox+"*", r.onReply)
		if err == nil {
			err = sub.SetPendingLimits(-1, -1)
		}
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("reply subscription: %w", err)
		}
		r.inboxes = append(r.inboxes, inbox)
		r.subs = append(r.subs, sub)
	}
	return r, nil
}

// InFlight returns the number of requests waiting for their reply.
func (r *Requester) InFlight() int64 { return r.inflight.Load() }

// Send publishes m as a request and calls done exactly once: with the
// reply and when it arrived, with ErrTimeout after timeout, or with
// ErrClosed. It returns ErrBacklog (and does not call done) when
// maxInFlight requests are already waiting, or the publish error.
func (r *Requester) Send(m *nats.Msg, timeout time.Duration, done func(reply *nats.Msg, at time.Time, err error)) error {
	return r.SendBatch([]*nats.Msg{m}, timeout, done)
}

// SendBatch publishes msgs in order on one connection, the last as the
// request (an atomic batch's commit), and answers as Send does for that
// one. A publish error leaves the messages before it sent.
func (r *Requester) SendBatch(msgs []*nats.Msg, timeout time.Duration, done func(reply *nats.Msg, at time.Time, err error)) error {
	if r.inflight.Load() >= r.maxInFlight {
		return ErrBacklog
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	r.seq++
	id := r.seq
	i := int(id % uint64(len(r.conns)))
	c := &call{done: done}
	r.pending[id] = c
	c.timer = time.AfterFunc(timeout, func() { r.finish(id, nil, time.Now(), ErrTimeout) })
	r.mu.Unlock()
	r.inflight.Add(1)

	last := msgs[len(msgs)-1]
	last.Reply = r.inboxes[i] + strconv.FormatUint(id, 10)
	var err error
	for _, m := range msgs {
		if err = r.conns[i].PublishMsg(m); err != nil {
			break
		}
	}
	if err != nil {
		r.mu.Lock()
		_, mine := r.pending[id]
		delete(r.pending, id)
		r.mu.Unlock()
		if mine {
			c.timer.Stop()
			r.inflight.Add(-1)
			return err
		}
	}
	return nil
}

// Do sends m and waits for its reply, for closed-loop callers. The time
// returned is when the reply (or the error) came.
func (r *Requester) Do(ctx context.Context, m *nats.Msg, timeout time.Duration) (*nats.Msg, time.Time, error) {
	return r.DoBatch(ctx, []*nats.Msg{m}, timeout)
}

// DoBatch sends msgs as SendBatch does and waits for the reply to the
// last.
func (r *Requester) DoBatch(ctx context.Context, msgs []*nats.Msg, timeout time.Duration) (*nats.Msg, time.Time, error) {
	type answer struct {
		m   *nats.Msg
		at  time.Time
		err error
	}
	ch := make(chan answer, 1)
	if err := r.SendBatch(msgs, timeout, func(reply *nats.Msg, at time.Time, err error) { ch <- answer{reply, at, err} }); err != nil {
		return nil, time.Now(), err
	}
	select {
	case a := <-ch:
		return a.m, a.at, a.err
	case <-ctx.Done():
		return nil, time.Now(), ctx.Err() // the reply, if any, goes into the buffered channel
	}
}

func (r *Requester) onReply(m *nats.Msg) {
	at := time.Now()
	id, err := strconv.ParseUint(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:], 10, 64)
	if err != nil {
		return
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		r.finish(id, nil, at, ErrNoAnswer)
		return
	}
	r.finish(id, m, at, nil)
}

// finish completes call id once: a late reply finds it gone.
func (r *Requester) finish(id uint64, m *nats.Msg, at time.Time, err error) {
	r.mu.Lock()
	c := r.pending[id]
	delete(r.pending, id)
	r.mu.Unlock()
	if c != nil {
		c.timer.Stop()
		// In flight until its callback is done: a caller that waits for
		// InFlight to reach 0 (Drain) must find what the callback records
		// (a lease held, a retry pending) already recorded.
		c.done(m, at, err)
		r.inflight.Add(-1)
	}
}

// Close fails every request in flight with ErrClosed and unsubscribes. It
// does not close the connections.
func (r *Requester) Close() {
	r.mu.Lock()
	r.closed = true
	pending := r.pending
	r.pending = map[uint64]*call{}
	r.mu.Unlock()
	for _, c := range pending {
		c.timer.Stop()
		c.done(nil, time.Now(), ErrClosed)
		r.inflight.Add(-1)
	}
	for _, s := range r.subs {
		_ = s.Unsubscribe()
	}
}
