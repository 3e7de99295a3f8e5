package main

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// netLink is the network path of one worker, so that the example can
// freeze it. Given to nats.SetCustomDialer, it dials TCP as usual; Cut
// closes every connection it made and makes dials fail until Restore.
//
// A stop-the-world pause (a long GC, a frozen VM) stops a process's lease
// renewals along with everything else. A demo cannot freeze half of its
// own process, so it cuts the worker's network for as long as its code
// stands still: seen from the lock service, the effect is the same — no
// renewals arrive and the lease runs out.
type netLink struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

// Dial implements nats.CustomDialer.
func (l *netLink) Dial(network, address string) (net.Conn, error) {
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
func (l *netLink) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

// Restore lets dials through again.
func (l *netLink) Restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = false
}
