// Package netlink is a cuttable network path for one NATS connection, for
// tests and demos that must freeze a process's traffic without touching
// the code above the connection.
package netlink

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// Link is given to nats.SetCustomDialer: it dials TCP as usual; Cut closes
// every connection it made and makes dials fail until Restore. The NATS
// client sees a dead network and reconnects in a loop, keeping what it
// publishes meanwhile in its reconnect buffer, which it sends once the link
// is restored: a real delayed delivery. A Link is safe for concurrent use;
// the zero value is an open link.
type Link struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

// Dial implements nats.CustomDialer.
func (l *Link) Dial(network, address string) (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		return nil, fmt.Errorf("dial %s: network link is cut", address)
	}
	c, err := net.DialTimeout(network, address, 2*time.Second)
	if err != nil {
		return nil, err
	}
	l.conns = append(l.conns, c)
	return c, nil
}

// Cut closes the link's connections and refuses new ones.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

// Restore lets dials through again.
func (l *Link) Restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = false
}
