// Package batchconn gathers the writes of a NATS connection into fewer
// system calls.
//
// nats.go writes whatever it has buffered as soon as its flusher goroutine
// is woken, which under a request-reply load is after every message: one
// write(2) per message, and on loopback or a fast network each such call
// carries the cost of the whole TCP send path. A service that answers many
// requests at once has, a moment later, several more messages ready to go.
// A Conn lets those goroutines run first (its writer yields once before it
// writes) and sends everything pending in one call, the way nats-server
// flushes a client's outbound data once per pass of its read loop rather
// than once per message. Latency grows by one goroutine hand-off.
package batchconn

import (
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Option makes a NATS connection dial through a Dialer with its defaults.
// An option that sets another dialer after it (a test's cuttable link)
// takes precedence.
func Option() nats.Option { return nats.SetCustomDialer(&Dialer{}) }

// Dialer dials TCP like nats.go's default dialer and wraps each connection
// in a Conn. It is a nats.CustomDialer: nats.SetCustomDialer(&Dialer{}).
type Dialer struct {
	// Timeout bounds a dial (default 2s, nats.go's default connect
	// timeout; a CustomDialer replaces nats.Timeout's effect on dials).
	Timeout time.Duration
	// WriteTimeout bounds one write to the socket (default one minute,
	// nats.go's default flusher timeout). A write that times out closes
	// the connection, and the NATS client reconnects.
	WriteTimeout time.Duration
}

// Dial implements nats.CustomDialer.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	c, err := (&net.Dialer{Timeout: timeout}).Dial(network, address)
	if err != nil {
		return nil, err
	}
	return New(c, d.WriteTimeout), nil
}

// maxPending bounds the bytes a Conn holds unsent; a Write beyond it waits
// for the socket, as a write to a full socket buffer would.
const maxPending = 1 << 20

// closeWait bounds how long Close waits for what is pending to be sent.
const closeWait = 2 * time.Second

// Conn is a net.Conn whose Write copies into a buffer that one writer
// goroutine sends. A write error is returned by every later Write and
// closes the connection, so that the NATS client's reader sees it too.
// SetWriteDeadline is ignored: nats.go sets it around each Write, which
// here only copies; the writer bounds each socket write by the Conn's
// own timeout instead.
type Conn struct {
	net.Conn
	writeTimeout time.Duration

	mu      sync.Mutex
	drained sync.Cond // pending was taken by the writer, or the Conn failed
	pending []byte
	err     error
	closed  bool

	kick chan struct{} // capacity 1: there is something to send
	done chan struct{} // the writer has exited
}

// New wraps c. writeTimeout bounds each socket write (0: one minute).
func New(c net.Conn, writeTimeout time.Duration) *Conn {
	if writeTimeout <= 0 {
		writeTimeout = time.Minute
	}
	bc := &Conn{Conn: c, writeTimeout: writeTimeout, kick: make(chan struct{}, 1), done: make(chan struct{})}
	bc.drained.L = &bc.mu
	go bc.writer()
	return bc
}

// Write queues b for the writer.
func (c *Conn) Write(b []byte) (int, error) {
	c.mu.Lock()
	for c.err == nil && !c.closed && len(c.pending) >= maxPending {
		c.drained.Wait()
	}
	switch {
	case c.err != nil:
		err := c.err
		c.mu.Unlock()
		return 0, err
	case c.closed:
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	c.pending = append(c.pending, b...)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return len(b), nil
}

// SetWriteDeadline is ignored (see Conn).
func (c *Conn) SetWriteDeadline(time.Time) error { return nil }

// SetDeadline sets the read deadline only (see Conn).
func (c *Conn) SetDeadline(t time.Time) error { return c.Conn.SetReadDeadline(t) }

// Close sends what is pending (waiting at most a couple of seconds), then
// closes the connection.
func (c *Conn) Close() error {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	c.drained.Broadcast()
	c.mu.Unlock()
	if !already {
		select {
		case c.kick <- struct{}{}:
		default:
		}
		select {
		case <-c.done:
		case <-time.After(closeWait):
		}
	}
	return c.Conn.Close()
}

// writer sends what Write queued. After a kick it yields once, so that
// goroutines made runnable by the same event (answers to requests that
// arrived together) queue their messages first, then sends everything in
// one write.
func (c *Conn) writer() {
	defer close(c.done)
	var out []byte
	for range c.kick {
		runtime.Gosched()
		c.mu.Lock()
		out, c.pending = c.pending, out[:0]
		closed := c.closed
		c.drained.Broadcast()
		c.mu.Unlock()
		if len(out) > 0 {
			_ = c.Conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
			if _, err := c.Conn.Write(out); err != nil {
				c.mu.Lock()
				c.err = err
				c.drained.Broadcast()
				c.mu.Unlock()
				c.Conn.Close()
				return
			}
		}
		if cap(out) > maxPending {
			out = nil // do not keep a burst's buffer for ever
		}
		if closed {
			return
		}
	}
}
