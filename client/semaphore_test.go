package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/client/fence"
	"github.com/jetlock/jetlock/internal/testenv"
	"github.com/jetlock/jetlock/streams"
)

func newSemaphore(t *testing.T, c *client.Client, name string, limit int) *client.Semaphore {
	t.Helper()
	m, err := c.NewSemaphore(name, limit)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// 20 clients contend for a semaphore of 3 permits: never more than 3
// hold one at once, each permit's work is fenced by its own tokens (no
// holder is ever refused as stale), and every waiter is served.
func TestSemaphoreNeverMoreThanLimit(t *testing.T) {
	env, _, _ := setup(t)
	ctx := ctxT(t, 120*time.Second)
	const name, limit, clients, rounds = "sem/contended", 3, 20, 3
	guard := fence.NewMemory()
	var inside, most atomic.Int32
	var served [clients]atomic.Int32
	var mu sync.Mutex
	permitsSeen := map[int]bool{}
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		m := newSemaphore(t, newCaller(t, env), name, limit)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := m.Acquire(ctx, client.TTL(5*time.Second), client.Owner(fmt.Sprint("client-", i)))
				if err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				n := inside.Add(1)
				for {
					old := most.Load()
					if n <= old || most.CompareAndSwap(old, n) {
						break
					}
				}
				if n > limit {
					errs <- fmt.Errorf("client %d: %d holders at once", i, n)
				}
				if p := l.Permit(); p < 1 || p > limit || l.FenceKey() != streams.PermitResource(name, p) || l.Resource() != name {
					errs <- fmt.Errorf("client %d: permit %d, fence key %q, resource %q", i, p, l.FenceKey(), l.Resource())
				}
				mu.Lock()
				permitsSeen[l.Permit()] = true
				mu.Unlock()
				err = guard.Do(ctx, l.FenceKey(), l.Token(), func() error {
					time.Sleep(20 * time.Millisecond)
					return nil
				})
				if err != nil {
					errs <- fmt.Errorf("client %d: fenced write with permit %d token %d: %w", i, l.Permit(), l.Token(), err)
				}
				select {
				case <-l.Lost():
					errs <- fmt.Errorf("client %d: permit lost while held: %v", i, context.Cause(l.Context()))
				default:
				}
				inside.Add(-1)
				if err := l.Release(ctx); err != nil {
					errs <- fmt.Errorf("client %d: release: %w", i, err)
				}
				served[i].Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range served {
		if n := served[i].Load(); n != rounds {
			t.Errorf("client %d served %d times, want %d", i, n, rounds)
		}
	}
	if m := most.Load(); m < 2 {
		t.Errorf("at most %d held at once: the permits were not shared", m)
	}
	if len(permitsSeen) != limit {
		t.Errorf("permits used: %v, want 1..%d", permitsSeen, limit)
	}
	st, err := newSemaphore(t, newCaller(t, env), name, limit).Status(ctx)
	if err != nil || st.Held != 0 || st.Waiters != 0 || len(st.Permits) != 0 || st.Limit != limit {
		t.Fatalf("status after everyone released: %+v %v", st, err)
	}
}

// Try, status, renewal and release of permits; another limit for the same
// semaphore is refused while it has holders.
func TestSemaphoreTryAcquireStatusAndRenewal(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	const name = "sem/try"
	m := newSemaphore(t, c, name, 2)
	if m.Name() != name || m.Limit() != 2 {
		t.Fatalf("semaphore %q limit %d", m.Name(), m.Limit())
	}
	a, err := m.TryAcquire(ctx, client.TTL(3*time.Second), client.Owner("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.TryAcquire(ctx, client.TTL(3*time.Second), client.Owner("b"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Permit() == b.Permit() || a.Permit()+b.Permit() != 3 {
		t.Fatalf("permits %d and %d, want 1 and 2", a.Permit(), b.Permit())
	}
	var he *client.HeldError
	if _, err := m.TryAcquire(ctx); !errors.Is(err, client.ErrLocked) || !errors.As(err, &he) || he.Limit != 2 || he.Resource != name ||
		err.Error() != "jetlock: semaphore sem/try has no free permit (limit 2)" {
		t.Fatalf("a third permit of 2: %v, want ErrLocked saying so", err)
	}
	// Renewals name their permit: both outlive their TTL.
	renewedThrice(t, "permit a", a.Renewed, a.Lost(), a.Context())
	renewedThrice(t, "permit b", b.Renewed, b.Lost(), b.Context())
	notLost(t, "permit a", a.Lost(), a.Context())
	notLost(t, "permit b", b.Lost(), b.Context())
	st, err := m.Status(ctx)
	if err != nil || st.Held != 2 || st.Limit != 2 || len(st.Permits) != 2 {
		t.Fatalf("status %+v %v", st, err)
	}
	for _, p := range st.Permits {
		l := map[int]*client.Lease{a.Permit(): a, b.Permit(): b}[p.Permit]
		if l == nil || p.Token != l.Token() || p.ExpiresAt.IsZero() {
			t.Fatalf("status shows permit %+v", p)
		}
	}
	other := newSemaphore(t, newCaller(t, env), name, 3)
	if _, err := other.TryAcquire(ctx); !errors.Is(err, client.ErrInvalidRequest) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("another limit: %v, want ErrInvalidRequest naming the limit", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c2, err := m.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c2.Permit() != a.Permit() || c2.Token() <= a.Token() {
		t.Fatalf("after a's release: permit %d token %d, want permit %d with a token above %d", c2.Permit(), c2.Token(), a.Permit(), a.Token())
	}
	for _, l := range []*client.Lease{b, c2} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A holder that crashes (its connection cut, nothing released) keeps its
// permit until the lease expires; then a waiter gets that permit, with a
// larger token.
func TestSemaphoreCrashedHolderPermitReturnsAtExpiry(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	const name = "sem/crash"
	const ttl = 2 * time.Second
	p, crashing := viaProxy(t, env, 2)
	gone, err := newSemaphore(t, crashing, name, 2).TryAcquire(ctx, client.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	m := newSemaphore(t, c, name, 2)
	kept, err := m.TryAcquire(ctx, client.TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	p.Cut()
	l, err := m.Acquire(ctx, client.TTL(30*time.Second), client.Wait(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(cut)
	isLost(t, "the crashed holder's permit", gone.Lost())
	if took < ttl-500*time.Millisecond || took > 10*time.Second {
		t.Fatalf("the waiter got a permit %v after the holder crashed, want about its TTL (%v) plus the grace", took, ttl)
	}
	if l.Permit() != gone.Permit() || l.Token() <= gone.Token() {
		t.Fatalf("the waiter got permit %d token %d; the crashed holder had permit %d token %d", l.Permit(), l.Token(), gone.Permit(), gone.Token())
	}
	notLost(t, "the other permit", kept.Lost(), kept.Context())
	for _, x := range []*client.Lease{l, kept} {
		if err := x.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A session's permits end with it, and a waiter gets one at once.
func TestSessionSemaphore(t *testing.T) {
	env, _, c := setup(t)
	ctx := ctxT(t, 60*time.Second)
	const name = "sem/session"
	s, err := c.NewSession(ctx, client.SessionTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	sm, err := s.NewSemaphore(name, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sm.Acquire(ctx, client.TTL(time.Second)); !errors.Is(err, client.ErrInvalidOption) {
		t.Fatalf("TTL with a session: %v", err)
	}
	held, err := sm.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if held.Permit() != 1 {
		t.Fatalf("permit %d", held.Permit())
	}
	m := newSemaphore(t, newCaller(t, env), name, 1)
	got := make(chan *client.Lease, 1)
	go func() {
		l, err := m.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	testenv.Eventually(t, 10*time.Second, func() bool {
		st, err := m.Status(ctx)
		return err == nil && st.Waiters == 1
	}, "the waiter never queued")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	isLost(t, "the closed session's permit", held.Lost())
	select {
	case l := <-got:
		if l == nil || l.Token() <= held.Token() {
			t.Fatalf("the waiter's permit %+v after %d", l, held.Token())
		}
		_ = l.Release(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter got no permit after the session closed")
	}
}

// Bad limits and names are refused before anything is sent, with errors
// that say what is wrong; the service refuses them too.
func TestSemaphoreValidation(t *testing.T) {
	_, nc, c := setup(t)
	for _, tc := range []struct {
		name  string
		limit int
		says  string
	}{
		{"sem/v", 0, "limit 0 outside [1, 1000]"},
		{"sem/v", 1001, "limit 1001 outside [1, 1000]"},
		{"sem/v", -1, "limit -1 outside [1, 1000]"},
		{"sem#1", 3, "sem#1"},
		{"", 3, "resource is required"},
	} {
		m, err := c.NewSemaphore(tc.name, tc.limit)
		if m != nil || !errors.Is(err, client.ErrInvalidOption) || !errors.Is(err, client.ErrInvalidRequest) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("NewSemaphore(%q, %d): %v, want an error saying %q", tc.name, tc.limit, err, tc.says)
		}
	}
	for _, body := range []string{
		`{"resource":"sem/v","request_id":"r1","limit":1001}`,
		`{"resources":["sem/v","sem/w"],"request_id":"r2","limit":2}`,
	} {
		msg, err := nc.Request(streams.Subject(streams.DefaultPrefix, streams.OpAcquire), []byte(body), 5*time.Second)
		if err != nil || msg.Header.Get(streams.HeaderErrorCode) != "400" {
			t.Errorf("the service's answer to %s: %v %q", body, err, msgText(msg))
		}
	}
}
