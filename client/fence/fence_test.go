package fence_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client/fence"
)

// runGuardSuite runs the backend-independent tests against guards made by
// newGuard; each call of newGuard must return a guard with empty state.
func runGuardSuite(t *testing.T, newGuard func(t *testing.T) fence.Guard, conc concurrency) {
	t.Run("Table", func(t *testing.T) { testTable(t, newGuard(t)) })
	t.Run("InvalidArguments", func(t *testing.T) { testInvalid(t, newGuard(t)) })
	t.Run("ConcurrentCheck", func(t *testing.T) { testConcurrentCheck(t, newGuard(t), conc) })
}

func testTable(t *testing.T, g fence.Guard) {
	ctx := context.Background()
	steps := []struct {
		name        string
		resource    string
		token       uint64
		wantStale   bool
		wantHighest uint64
	}{
		{"first token accepted", "orders/123", 5, false, 5},
		{"equal token accepted", "orders/123", 5, false, 5},
		{"higher token accepted", "orders/123", 9, false, 9},
		{"lower token rejected", "orders/123", 7, true, 9},
		{"much lower token rejected", "orders/123", 1, true, 9},
		{"equal token still accepted after a rejection", "orders/123", 9, false, 9},
		{"other resource is independent", "lock:backup:user123", 2, false, 2},
		{"first resource unchanged by the other", "orders/123", 8, true, 9},
		{"resource names differing only in escaped bytes are distinct", "lock=3Abackup=3Auser123", 1, false, 1},
	}
	stale := uint64(0)
	for _, s := range steps {
		err := g.Check(ctx, s.resource, s.token)
		if s.wantStale {
			stale++
			var se *fence.StaleTokenError
			if !errors.Is(err, fence.ErrStaleToken) || !errors.As(err, &se) {
				t.Fatalf("%s: Check(%q, %d) = %v, want a *StaleTokenError", s.name, s.resource, s.token, err)
			}
			if se.Resource != s.resource || se.Token != s.token || se.Highest != s.wantHighest {
				t.Fatalf("%s: got %+v, want resource %q token %d highest %d", s.name, *se, s.resource, s.token, s.wantHighest)
			}
		} else if err != nil {
			t.Fatalf("%s: Check(%q, %d) = %v, want accepted", s.name, s.resource, s.token, err)
		}
		h, err := g.Highest(ctx, s.resource)
		if err != nil || h != s.wantHighest {
			t.Fatalf("%s: Highest(%q) = %d, %v; want %d", s.name, s.resource, h, err, s.wantHighest)
		}
	}
	if got := g.Rejected(); got != stale {
		t.Fatalf("Rejected() = %d, want %d", got, stale)
	}
	if h, err := g.Highest(ctx, "never/seen"); err != nil || h != 0 {
		t.Fatalf("Highest of an unknown resource = %d, %v; want 0, nil", h, err)
	}
}

func testInvalid(t *testing.T, g fence.Guard) {
	ctx := context.Background()
	if err := g.Check(ctx, "r", 0); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("Check with token 0 = %v, want ErrInvalid", err)
	}
	if err := g.Check(ctx, "", 1); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("Check with empty resource = %v, want ErrInvalid", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := g.Check(cctx, "r", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Check with cancelled context = %v, want context.Canceled", err)
	}
	if h, err := g.Highest(ctx, "r"); err != nil || h != 0 {
		t.Errorf("after failed checks Highest = %d, %v; want 0, nil", h, err)
	}
	if g.Rejected() != 0 {
		t.Errorf("Rejected() = %d after invalid calls, want 0", g.Rejected())
	}
}

// concurrency sizes a randomized concurrent test.
type concurrency struct {
	goroutines int
	ops        int    // per goroutine
	maxToken   uint64 // width of the random token window
	// allowConflict tolerates fence.ErrConflict (KV: lost CAS races).
	allowConflict bool
}

type checkOp struct {
	resource   string
	token      uint64
	start, end time.Time
	err        error
}

// testConcurrentCheck calls Check from many goroutines with random tokens
// and checks the history against the fence contract in real time: once a
// Check(t) has returned success, no Check(t' < t) that starts afterwards
// may succeed, and every rejection names a token that was accepted by a
// Check that had started before the rejection ended.
func testConcurrentCheck(t *testing.T, g fence.Guard, c concurrency) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	resources := []string{"orders/1", "lock:backup:user123"}
	logs := make([][]checkOp, c.goroutines)
	var progress atomic.Uint64
	var wg sync.WaitGroup
	for i := range c.goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range c.ops {
				// Tokens drift upwards with the run's progress, with random
				// overlap, so that both outcomes stay common throughout.
				tok := 1 + progress.Add(1)/uint64(c.goroutines) + rand.Uint64N(c.maxToken)
				op := checkOp{resource: resources[rand.IntN(len(resources))], token: tok}
				op.start = time.Now()
				op.err = g.Check(ctx, op.resource, op.token)
				op.end = time.Now()
				logs[i] = append(logs[i], op)
			}
		}()
	}
	wg.Wait()

	var all []checkOp
	for _, l := range logs {
		all = append(all, l...)
	}
	accepted := map[string][]checkOp{}
	var nAcc, nRej, nConflict int
	for _, op := range all {
		switch {
		case op.err == nil:
			accepted[op.resource] = append(accepted[op.resource], op)
			nAcc++
		case errors.Is(op.err, fence.ErrStaleToken):
			nRej++
		case c.allowConflict && errors.Is(op.err, fence.ErrConflict):
			nConflict++
		default:
			t.Fatalf("Check(%q, %d): unexpected error %v", op.resource, op.token, op.err)
		}
	}
	t.Logf("%d checks: %d accepted, %d rejected, %d conflicts", len(all), nAcc, nRej, nConflict)
	if nAcc == 0 || nRej == 0 {
		t.Fatalf("test did not exercise both outcomes: %d accepted, %d rejected", nAcc, nRej)
	}
	if got := g.Rejected(); got != uint64(nRej) {
		t.Errorf("Rejected() = %d, want %d", got, nRej)
	}
	for res, acc := range accepted {
		sort.Slice(acc, func(i, j int) bool { return acc[i].end.Before(acc[j].end) })
		// prefixMax[i] is the largest token among acc[:i+1].
		prefixMax := make([]uint64, len(acc))
		for i, op := range acc {
			prefixMax[i] = op.token
			if i > 0 && prefixMax[i-1] > op.token {
				prefixMax[i] = prefixMax[i-1]
			}
		}
		maxTok := prefixMax[len(prefixMax)-1]
		for _, op := range acc {
			// Accepted checks that had returned before op started.
			n := sort.Search(len(acc), func(i int) bool { return !acc[i].end.Before(op.start) })
			if n > 0 && prefixMax[n-1] > op.token {
				t.Errorf("%s: token %d accepted after token %d had been accepted", res, op.token, prefixMax[n-1])
			}
		}
		if h, err := g.Highest(context.Background(), res); err != nil || h != maxTok {
			t.Errorf("%s: Highest = %d, %v; want the largest accepted token %d", res, h, err, maxTok)
		}
	}
	for _, op := range all {
		var se *fence.StaleTokenError
		if !errors.As(op.err, &se) {
			continue
		}
		if se.Highest <= op.token {
			t.Errorf("%s: token %d rejected with highest %d", op.resource, op.token, se.Highest)
		}
		justified := false
		for _, a := range accepted[op.resource] {
			if a.token == se.Highest && a.start.Before(op.end) {
				justified = true
				break
			}
		}
		if !justified {
			t.Errorf("%s: token %d rejected citing token %d, which no earlier check had accepted", op.resource, op.token, se.Highest)
		}
	}
}

// checkOrderLog checks a log of accepted fenced writes, in the order the
// store applied them: tokens never go down.
func checkOrderLog(t *testing.T, resource string, tokens []uint64) {
	t.Helper()
	if len(tokens) == 0 {
		t.Fatalf("%s: no write accepted", resource)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] < tokens[i-1] {
			t.Fatalf("%s: write with token %d applied after a write with token %d (position %d of %d)", resource, tokens[i], tokens[i-1], i, len(tokens))
		}
	}
}
