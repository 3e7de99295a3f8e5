package main

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

// Client-side outcomes that carry no reply from the service.
var (
	errTimeout  = errors.New("timeout")
	errBacklog  = errors.New("backlog: too many requests in flight")
	errClosed   = errors.New("requester closed")
	errNoAnswer = errors.New("no responders")
)

// requester sends NATS requests asynchronously: any number in flight on a
// few connections, each answered through one wildcard inbox subscription
// per connection, so the load generator never waits for a reply before
// sending the next request. It is safe for concurrent use.
type requester struct {
	conns       []*nats.Conn
	inboxes     []string // "<inbox>." per connection
	subs        []*nats.Subscription
	maxInFlight int64

	mu      sync.Mutex
	pending map[uint64]*call
	seq     uint64
	closed  bool

	inflight atomic.Int64
	late     atomic.Int64 // replies that came after their timeout
}

// call is one request in flight.
type call struct {
	timer *time.Timer
	done  func(reply *nats.Msg, err error, at time.Time)
}

// connect opens n connections to url for load generation.
func connect(url string, n int, name string) ([]*nats.Conn, error) {
	var conns []*nats.Conn
	for i := 0; i < n; i++ {
		nc, err := nats.Connect(url,
			nats.Name(fmt.Sprintf("%s-%d", name, i)),
			nats.MaxReconnects(-1),
			nats.ReconnectWait(100*time.Millisecond),
			nats.ReconnectBufSize(64<<20),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				if errors.Is(err, nats.ErrSlowConsumer) {
					slowConsumer.Add(1)
				}
			}),
		)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, fmt.Errorf("connect %s: %w", url, err)
		}
		conns = append(conns, nc)
	}
	return conns, nil
}

// slowConsumer counts slow-consumer events on the load connections (a sign
// that the load generator, not the system, dropped replies).
var slowConsumer atomic.Int64

func newRequester(conns []*nats.Conn, maxInFlight int) (*requester, error) {
	r := &requester{conns: conns, maxInFlight: int64(maxInFlight), pending: make(map[uint64]*call)}
	for _, nc := range conns {
		inbox := nc.NewRespInbox()
		inbox = inbox[:strings.LastIndexByte(inbox, '.')+1]
		sub, err := nc.Subscribe(inbox+"*", r.onReply)
		if err != nil {
			r.close()
			return nil, err
		}
		if err := sub.SetPendingLimits(-1, -1); err != nil {
			r.close()
			return nil, err
		}
		r.inboxes = append(r.inboxes, inbox)
		r.subs = append(r.subs, sub)
	}
	return r, nil
}

// send publishes m as a request and calls done exactly once: with the reply,
// with errTimeout after timeout, or with errClosed. It returns errBacklog
// (and does not call done) when maxInFlight requests are already waiting,
// or the publish error.
func (r *requester) send(m *nats.Msg, timeout time.Duration, done func(reply *nats.Msg, err error, at time.Time)) error {
	if r.inflight.Load() >= r.maxInFlight {
		return errBacklog
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return errClosed
	}
	r.seq++
	id := r.seq
	i := int(id % uint64(len(r.conns)))
	c := &call{done: done}
	r.pending[id] = c
	c.timer = time.AfterFunc(timeout, func() { r.finish(id, nil, errTimeout) })
	r.mu.Unlock()
	r.inflight.Add(1)

	m.Reply = r.inboxes[i] + strconv.FormatUint(id, 10)
	if err := r.conns[i].PublishMsg(m); err != nil {
		r.mu.Lock()
		_, mine := r.pending[id]
		delete(r.pending, id)
		r.mu.Unlock()
		if mine {
			c.timer.Stop()
			r.inflight.Add(-1)
			return err
		}
		return nil // already finished (closed): done was called
	}
	return nil
}

// do sends m and waits for its reply, for closed-loop callers.
func (r *requester) do(ctx context.Context, m *nats.Msg, timeout time.Duration) (*nats.Msg, time.Time, error) {
	type result struct {
		m   *nats.Msg
		err error
		at  time.Time
	}
	ch := make(chan result, 1)
	if err := r.send(m, timeout, func(reply *nats.Msg, err error, at time.Time) { ch <- result{reply, err, at} }); err != nil {
		return nil, time.Now(), err
	}
	select {
	case res := <-ch:
		return res.m, res.at, res.err
	case <-ctx.Done():
		// The reply, if any, is dropped into the buffered channel.
		return nil, time.Now(), ctx.Err()
	}
}

func (r *requester) onReply(m *nats.Msg) {
	at := time.Now()
	dot := strings.LastIndexByte(m.Subject, '.')
	id, err := strconv.ParseUint(m.Subject[dot+1:], 10, 64)
	if err != nil {
		return
	}
	var rerr error
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		rerr = errNoAnswer
	}
	if !r.finishAt(id, m, rerr, at) {
		r.late.Add(1)
	}
}

func (r *requester) finish(id uint64, m *nats.Msg, err error) { r.finishAt(id, m, err, time.Now()) }

// finishAt completes call id once; it reports false if it was already
// complete.
func (r *requester) finishAt(id uint64, m *nats.Msg, err error, at time.Time) bool {
	r.mu.Lock()
	c := r.pending[id]
	delete(r.pending, id)
	r.mu.Unlock()
	if c == nil {
		return false
	}
	c.timer.Stop()
	r.inflight.Add(-1)
	c.done(m, err, at)
	return true
}

// waitIdle waits until no request is in flight or ctx ends.
func (r *requester) waitIdle(ctx context.Context) {
	for r.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// close fails every request in flight with errClosed and unsubscribes. It
// does not close the connections.
func (r *requester) close() {
	r.mu.Lock()
	r.closed = true
	pending := r.pending
	r.pending = map[uint64]*call{}
	r.mu.Unlock()
	for _, c := range pending {
		c.timer.Stop()
		r.inflight.Add(-1)
		c.done(nil, errClosed, time.Now())
	}
	for _, s := range r.subs {
		_ = s.Unsubscribe()
	}
}
