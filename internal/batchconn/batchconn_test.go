package batchconn_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/batchconn"
)

// pair returns a Conn dialled through a Dialer and the accepted end.
func pair(t *testing.T, d *batchconn.Dialer) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); peer.Close() })
	return c, peer
}

// Writes from many goroutines arrive whole and, for each goroutine, in
// order.
func TestWritesArriveWholeAndInOrder(t *testing.T) {
	c, peer := pair(t, &batchconn.Dialer{})
	const writers, each = 8, 2000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := fmt.Fprintf(c, "w%d %d %s\n", w, i, strings.Repeat("x", i%300)); err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		})
	}
	next := make([]int, writers)
	sc := bufio.NewScanner(peer)
	for n := 0; n < writers*each && sc.Scan(); n++ {
		f := append(strings.Fields(sc.Text()), "")
		w, err1 := strconv.Atoi(strings.TrimPrefix(f[0], "w"))
		i, err2 := strconv.Atoi(f[1])
		pad := f[2]
		if err1 != nil || err2 != nil || w < 0 || w >= writers {
			t.Fatalf("torn line %q", sc.Text())
		}
		if i != next[w] || len(pad) != i%300 {
			t.Fatalf("writer %d: got message %d with %d bytes of padding, want message %d with %d", w, i, len(pad), next[w], next[w]%300)
		}
		next[w]++
	}
	wg.Wait()
	for w, n := range next {
		if n != each {
			t.Fatalf("writer %d: %d of %d messages arrived", w, n, each)
		}
	}
}

// Close sends what is still pending before it closes.
func TestCloseSendsPending(t *testing.T) {
	c, peer := pair(t, &batchconn.Dialer{})
	want := strings.Repeat("0123456789", 50000)
	if _, err := io.WriteString(c, want); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(peer)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("peer read %d bytes, want %d", len(got), len(want))
	}
	if _, err := c.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v, want net.ErrClosed", err)
	}
}

// A peer that stops reading makes the socket write time out: that error
// comes back from Write, and the connection is closed, so that its reader
// fails too.
func TestStuckPeerFailsWrites(t *testing.T) {
	c, peer := pair(t, &batchconn.Dialer{WriteTimeout: 200 * time.Millisecond})
	_ = peer // never read
	chunk := make([]byte, 64<<10)
	deadline := time.Now().Add(20 * time.Second)
	var err error
	for err == nil && time.Now().Before(deadline) {
		_, err = c.Write(chunk)
	}
	if err == nil {
		t.Fatal("writes to a peer that never reads still succeed after 20s")
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("write error %v, want a timeout", err)
	}
	if _, rerr := c.Read(make([]byte, 1)); rerr == nil {
		t.Fatal("read on the failed connection succeeded")
	}
}

// nats.go works through it: request and reply, flush, and a reconnect
// after the server restarts.
func TestNATSThroughBatchConn(t *testing.T) {
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	url := srv.ClientURL()
	port := srv.Addr().(*net.TCPAddr).Port
	defer func() { srv.Shutdown() }()

	connect := func(name string) *nats.Conn {
		nc, err := nats.Connect(url, nats.Name(name), nats.SetCustomDialer(&batchconn.Dialer{}),
			nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	responder, requester := connect("responder"), connect("requester")
	if _, err := responder.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := responder.Flush(); err != nil {
		t.Fatal(err)
	}
	ask := func(n int) {
		t.Helper()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				want := fmt.Sprint(i)
				reply, err := requester.Request("echo", []byte(want), 5*time.Second)
				if err != nil || string(reply.Data) != want {
					t.Errorf("request %d: reply %v, %v", i, reply, err)
				}
			})
		}
		wg.Wait()
	}
	ask(500)

	srv.Shutdown()
	srv.WaitForShutdown()
	opts.Port = port
	if srv, err = server.NewServer(opts); err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("restarted server not ready")
	}
	for _, nc := range []*nats.Conn{responder, requester} {
		// Until the client has noticed the restart, a flush can go to the
		// old connection and fail with it.
		deadline := time.Now().Add(10 * time.Second)
		for (nc.Stats().Reconnects == 0 || !nc.IsConnected()) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if err := nc.Flush(); err != nil {
			t.Fatalf("%s after the restart: %v", nc.Opts.Name, err)
		}
	}
	ask(100)
}
