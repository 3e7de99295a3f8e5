// Package tcpproxy is a loopback TCP forwarder that tests can pause and
// cut: the dev cluster puts one on each direction of each route, and the
// fault suite one in front of every client and service connection.
package tcpproxy

import (
	"net"
	"sync"
)

// Proxy is a TCP forwarder on loopback in front of one NATS connection (a
// client's, a service instance's, or one direction of a route). It can be
//
//   - paused: bytes stop flowing both ways but connections stay open, as
//     when a process is frozen by a GC pause or a VM stop; on Resume the
//     held bytes are delivered late, in order (delayed requests, delayed
//     replies, delayed writes);
//   - cut: every connection is closed and new ones are refused until
//     Heal, as when the network between the process and NATS fails.
//
// A new connection goes to the first target (in order, starting from the
// preferred one) that accepts it, so a client behind the proxy fails over
// when its node stops. Its methods are safe for concurrent use.
type Proxy struct {
	ln      net.Listener
	targets func() []string

	mu     sync.Mutex
	gate   *sync.Cond
	paused bool
	cut    bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	closed bool
}

// New starts a proxy on a free loopback port to the addresses targets
// returns (host:port, tried in order on each new connection; none means
// the connection is refused). Close stops it.
func New(targets func() []string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, targets: targets, conns: map[net.Conn]struct{}{}}
	p.gate = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns the nats:// URL that leads through the proxy.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
		}
		var up net.Conn
		for _, addr := range p.targets() {
			if up, err = net.Dial("tcp", addr); err == nil {
				break
			}
		}
		if up == nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut || p.closed {
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies src to dst, holding each chunk while the proxy is paused.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.paused && !p.cut && !p.closed {
				p.gate.Wait()
			}
			dead := p.cut || p.closed
			p.mu.Unlock()
			if dead {
				break
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Pause holds every byte in both directions until Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

// Resume delivers what was held and lets traffic flow again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.paused = false
	p.gate.Broadcast()
	p.mu.Unlock()
}

// Cut closes every connection (bytes held by a pause are lost) and refuses
// new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	p.gate.Broadcast()
	p.mu.Unlock()
}

// Heal accepts connections again (and ends a pause).
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.paused = false
	p.gate.Broadcast()
	p.mu.Unlock()
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
