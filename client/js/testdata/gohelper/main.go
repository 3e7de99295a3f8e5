// Command gohelper is the Go side of the TypeScript client's interop
// tests: it holds locks and campaigns with the Go client, driven by lines
// on stdin ("ID OP ARGS...") and answering "ID RESULT..." on stdout, so
// that a test can interleave the two clients on one cluster.
//
//	ID acquire RESOURCE TTL_MS WAIT_MS OWNER   -> ID granted TOKEN | ID locked OWNER TOKEN | ID error TEXT
//	ID release RESOURCE                        -> ID released | ID error TEXT
//	ID campaign NAME VALUE                     -> ID elected TOKEN | ID error TEXT
//	ID resign NAME                             -> ID resigned | ID error TEXT
//
// Each command runs on its own, so a waiting acquire or campaign does not
// hold up the next one. It exits when stdin closes, releasing what it holds.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/client"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gohelper NATS_URLS")
		os.Exit(2)
	}
	nc, err := nats.Connect(os.Args[1], nats.MaxReconnects(-1))
	if err != nil {
		fmt.Fprintln(os.Stderr, "gohelper:", err)
		os.Exit(1)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gohelper:", err)
		os.Exit(1)
	}
	h := &helper{c: c, leases: map[string]*client.Lease{}, leaders: map[string]*client.Leadership{}}
	var wg sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) < 2 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.say(f[0], h.run(f[1], f[2:]))
		}()
	}
	wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, l := range h.leases {
		_ = l.Release(ctx)
	}
	for _, ld := range h.leaders {
		_ = ld.Resign(ctx)
	}
}

type helper struct {
	c       *client.Client
	out     sync.Mutex
	mu      sync.Mutex
	leases  map[string]*client.Lease
	leaders map[string]*client.Leadership
}

func (h *helper) say(id, text string) {
	h.out.Lock()
	defer h.out.Unlock()
	fmt.Printf("%s %s\n", id, text)
}

func (h *helper) run(op string, args []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	switch {
	case op == "acquire" && len(args) == 4:
		ttl, err1 := strconv.Atoi(args[1])
		wait, err2 := strconv.Atoi(args[2])
		if err1 != nil || err2 != nil {
			return "error bad numbers"
		}
		opts := []client.AcquireOption{client.TTL(time.Duration(ttl) * time.Millisecond), client.Owner(args[3])}
		var l *client.Lease
		var err error
		if wait > 0 {
			l, err = h.c.Acquire(ctx, args[0], append(opts, client.Wait(time.Duration(wait)*time.Millisecond))...)
		} else {
			l, err = h.c.TryAcquire(ctx, args[0], opts...)
		}
		var he *client.HeldError
		if errors.As(err, &he) {
			return fmt.Sprintf("locked %s %d", he.Owner, he.Token)
		}
		if err != nil {
			return "error " + err.Error()
		}
		h.mu.Lock()
		h.leases[args[0]] = l
		h.mu.Unlock()
		return fmt.Sprintf("granted %d", l.Token())
	case op == "release" && len(args) == 1:
		h.mu.Lock()
		l := h.leases[args[0]]
		delete(h.leases, args[0])
		h.mu.Unlock()
		if l == nil {
			return "error not held"
		}
		if err := l.Release(ctx); err != nil {
			return "error " + err.Error()
		}
		return "released"
	case op == "campaign" && len(args) == 2:
		e, err := h.c.NewElection(args[0], client.TTL(10*time.Second))
		if err != nil {
			return "error " + err.Error()
		}
		ld, err := e.Campaign(ctx, args[1])
		if err != nil {
			return "error " + err.Error()
		}
		h.mu.Lock()
		h.leaders[args[0]] = ld
		h.mu.Unlock()
		return fmt.Sprintf("elected %d", ld.Token())
	case op == "resign" && len(args) == 1:
		h.mu.Lock()
		ld := h.leaders[args[0]]
		delete(h.leaders, args[0])
		h.mu.Unlock()
		if ld == nil {
			return "error not leading"
		}
		if err := ld.Resign(ctx); err != nil {
			return "error " + err.Error()
		}
		return "resigned"
	}
	return "error unknown command " + op
}
