package service

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// A wake for a request of another instance travels as a message on its
// wake subject; a wake for a request of this instance is delivered in
// process, with no message at all. Either way a grant is never replaced
// by an empty wake sent after it.
func TestWakesOfThisInstanceStayInProcess(t *testing.T) {
	cl := startCluster(t)
	connect := func() *nats.Conn {
		nc, err := nats.Connect(cl.URLs(), cl.ConnectOptions(devcluster.Service)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	sentByA := 0
	instance := func(id string) *wakes {
		nc := connect()
		w := &wakes{nc: nc, prefix: "jetlock.wake." + id + ".", log: slog.Default(), sent: func() {},
			waiting: map[string]chan *streams.LeaseResponse{}}
		if _, err := nc.Subscribe(w.prefix+"*", w.onMsg); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return w
	}
	a, b := instance("a"), instance("b")
	a.sent = func() { sentByA++ } // called in the sending goroutine

	spy := connect()
	seen := make(chan string, 16)
	if _, err := spy.Subscribe("jetlock.wake.>", func(m *nats.Msg) { seen <- m.Subject }); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	receive := func(what string, ch chan *streams.LeaseResponse) *streams.LeaseResponse {
		t.Helper()
		select {
		case g := <-ch:
			return g
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no wake", what)
			return nil
		}
	}
	grant := func(token uint64) *streams.LeaseResponse {
		return &streams.LeaseResponse{Resource: "r", LeaseID: "l", Token: token, ExpiresAt: "2026-12-02T00:00:00Z"}
	}

	// Subscriptions reach the other nodes a moment later: probe until both
	// b and the spy hear a's messages.
	probe := b.register("probe")
	deadline := time.Now().Add(10 * time.Second)
	for bHeard, spyHeard := false, false; !bHeard || !spyHeard; {
		if time.Now().After(deadline) {
			t.Fatal("b and the spy never heard a's wake messages")
		}
		a.send(b.subject("probe"), nil)
		select {
		case <-probe:
			bHeard = true
		case <-time.After(50 * time.Millisecond):
		}
		select {
		case <-seen:
			spyHeard = true
		default:
		}
	}
	time.Sleep(100 * time.Millisecond)
	for len(seen) > 0 {
		<-seen
	}
	sentByA = 0

	// To another instance: a message, decoded there.
	remote := b.register("h1")
	a.send(b.subject("h1"), grant(7))
	if g := receive("remote grant", remote); g == nil || g.Token != 7 || g.LeaseID != "l" {
		t.Fatalf("remote grant arrived as %+v", g)
	}

	// To this instance: the grant itself, then an empty wake that must not
	// replace it.
	local := a.register("h2")
	g := grant(8)
	a.send(a.subject("h2"), g)
	a.send(a.subject("h2"), nil)
	if got := receive("local grant", local); got != g {
		t.Fatalf("local grant arrived as %+v, want the grant sent", got)
	}
	select {
	case extra := <-local:
		t.Fatalf("a second wake %+v after the grant", extra)
	default:
	}

	// The spy saw the remote wake and then a marker published after the
	// local ones, on the same connection: nothing between them.
	a.send(b.subject("marker"), nil)
	for _, want := range []string{b.subject("h1"), b.subject("marker")} {
		select {
		case got := <-seen:
			// Probes of the loop above, delivered late, are not wakes.
			for got == b.subject("probe") {
				select {
				case got = <-seen:
				case <-time.After(5 * time.Second):
					got = ""
				}
			}
			if got != want {
				t.Fatalf("a wake message on %s, want %s (local wakes must not be published)", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no wake message on %s", want)
		}
	}
	if sentByA != 4 {
		t.Fatalf("instance a counted %d wakes sent, want 4", sentByA)
	}
}
