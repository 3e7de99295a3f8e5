package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client/fence"
)

func TestMemory(t *testing.T) {
	runGuardSuite(t, func(*testing.T) fence.Guard { return fence.NewMemory() },
		concurrency{goroutines: 32, ops: 300, maxToken: 32})
}

func TestMemoryDoSkipsFnWhenStale(t *testing.T) {
	ctx := context.Background()
	g := fence.NewMemory()
	ran := 0
	fn := func() error { ran++; return nil }
	if err := g.Do(ctx, "r", 3, fn); err != nil || ran != 1 {
		t.Fatalf("Do(3) = %v, ran %d; want nil, 1", err, ran)
	}
	if err := g.Do(ctx, "r", 2, fn); !errors.Is(err, fence.ErrStaleToken) || ran != 1 {
		t.Fatalf("Do(2) = %v, ran %d; want ErrStaleToken, fn not run", err, ran)
	}
	boom := errors.New("boom")
	if err := g.Do(ctx, "r", 4, func() error { return boom }); err != boom {
		t.Fatalf("Do with failing fn = %v, want fn's error unchanged", err)
	}
	// The token of a failed operation still fences older holders.
	if err := g.Check(ctx, "r", 3); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Check(3) after Do(4) failed = %v, want ErrStaleToken", err)
	}
}

// A Check waiting behind a running Do gives up when its context ends, and
// Highest does not wait.
func TestMemoryDoBlocksOthersUntilDone(t *testing.T) {
	g := fence.NewMemory()
	inside, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- g.Do(context.Background(), "r", 5, func() error {
			close(inside)
			<-release
			return nil
		})
	}()
	<-inside
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := g.Check(ctx, "r", 6); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Check during Do = %v, want context.DeadlineExceeded", err)
	}
	if h, _ := g.Highest(context.Background(), "r"); h != 5 {
		t.Fatalf("Highest during Do = %d, want 5", h)
	}
	if err := g.Check(context.Background(), "other", 1); err != nil {
		t.Fatalf("Check of another resource during Do = %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := g.Check(context.Background(), "r", 6); err != nil {
		t.Fatalf("Check after Do = %v", err)
	}
}

// Many goroutines write through Do; the log, appended inside the atomic
// step, is the order in which writes were applied.
func TestMemoryConcurrentOrderLog(t *testing.T) {
	g := fence.NewMemory()
	ctx := context.Background()
	var mu sync.Mutex
	log := map[string][]uint64{}
	resources := []string{"a", "b", "c"}
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 300 {
				res, tok := resources[rand.IntN(len(resources))], 1+uint64(j)+rand.Uint64N(32)
				err := g.Do(ctx, res, tok, func() error {
					mu.Lock()
					log[res] = append(log[res], tok)
					mu.Unlock()
					return nil
				})
				if err != nil && !errors.Is(err, fence.ErrStaleToken) {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, res := range resources {
		checkOrderLog(t, res, log[res])
	}
}

// TestMemoryDelayedOldWrite: a write prepared with t1 before t2 was
// accepted, but delivered after, is rejected and the newer data stays.
func TestMemoryDelayedOldWrite(t *testing.T) {
	ctx := context.Background()
	g := fence.NewMemory()
	data := map[string]string{}
	write := func(tok uint64, v string) func() error {
		return func() error {
			return g.Do(ctx, "lock:backup:user123", tok, func() error { data["user123"] = v; return nil })
		}
	}
	const t1, t2 = 10, 20
	if err := write(t1, "A first")(); err != nil {
		t.Fatal(err)
	}
	network := make(chan func() error, 1)
	network <- write(t1, "A late") // sent with t1, delayed in flight
	if err := write(t2, "B")(); err != nil {
		t.Fatalf("B's write with t2 = %v", err)
	}
	if err := (<-network)(); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("delayed write with t1 = %v, want ErrStaleToken", err)
	}
	if data["user123"] != "B" {
		t.Fatalf("data = %q, want B's write intact", data["user123"])
	}
}

func BenchmarkMemoryCheck(b *testing.B) {
	g := fence.NewMemory()
	ctx := context.Background()
	var n uint64
	for b.Loop() {
		n++
		if err := g.Check(ctx, fmt.Sprint("r", n%64), n); err != nil {
			b.Fatal(err)
		}
	}
}
