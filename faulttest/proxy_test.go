package faulttest

import (
	"testing"

	"github.com/jetlock/jetlock/internal/tcpproxy"
)

// Proxy is a pausable, cuttable loopback proxy in front of one NATS
// connection (a client's or a service instance's); see tcpproxy.Proxy.
type Proxy = tcpproxy.Proxy

// NewProxy starts a proxy to the addresses targets returns (host:port,
// tried in order on each new connection), so that a client behind it fails
// over when its node stops. It is closed at cleanup.
func NewProxy(t testing.TB, targets func() []string) *Proxy {
	t.Helper()
	p, err := tcpproxy.New(targets)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
