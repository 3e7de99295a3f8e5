package service

import (
	"cmp"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// churnNames is the number of names the churn test takes and ends once:
// a third locks, a third permits of semaphores, a third sessions.
const churnNames = 48_000

// Memory follows what is held: after 48,000 distinct names (locks,
// permits, sessions) were each taken and ended once, and the retry window
// has passed, the live heap of jetlock's own code is back within 2 MiB of
// where it started. Maps and queues that grew with the churn shrink with
// it.
func TestMemoryFollowsWhatIsHeld(t *testing.T) {
	// Sample the heap finely: the bound is tight, and the default rate
	// (one sample per 512 KiB) leaves ownHeap's estimate loose by about as
	// much.
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 16 << 10
	cfg := DefaultConfig()
	const window = 3 * time.Second
	cfg.Bucket.RetryWindow = window
	s, nc := serveToCaller(t, cfg)
	// Warm up what every instance keeps whatever its load (connections'
	// buffers, pools), so that the baseline holds it too.
	churn(t, nc, 0, 3*256)
	waitFor(t, 2*time.Minute, func() bool { return s.tracker.size() == 0 }, "the warm-up forgotten")
	heapBefore := ownHeap()
	churn(t, nc, 1, churnNames)
	waitFor(t, 2*time.Minute, func() bool { return s.tracker.size() == 0 }, "the churn forgotten after the retry window")
	// A few sweeps more: what shrinks does so on the sweep.
	time.Sleep(10 * cfg.SweepInterval)
	heapAfter := ownHeap()
	t.Logf("jetlock's live heap %d KiB before, %d KiB after %d names; tracker %v", heapBefore>>10, heapAfter>>10, churnNames, s.tracker)
	if grown := int64(heapAfter) - int64(heapBefore); grown > 2<<20 {
		t.Errorf("jetlock's live heap grew by %d KiB over a churn of %d names that left nothing held", grown>>10, churnNames)
		for _, site := range topOwnSites(10) {
			t.Logf("%8d KiB  %s", site.bytes>>10, site.where)
		}
	}
}

// churn takes and ends n names, a third of each kind, round r's own,
// from 256 callers at once.
func churn(t *testing.T, nc *nats.Conn, r, n int) {
	t.Helper()
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := takeAndEnd(nc, r, i); err != nil {
					if failed.Add(1) == 1 {
						t.Errorf("name %d: %v", i, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d names failed", f, n)
	}
}

// takeAndEnd takes name i of round r and ends it: a lock, a permit of a
// semaphore of two, or a session, by i's remainder of three.
func takeAndEnd(nc *nats.Conn, r, i int) error {
	name := fmt.Sprintf("churn/%d/%d", r, i)
	switch i % 3 {
	case 0, 1:
		limit := 0
		if i%3 == 1 {
			limit = 2
		}
		code, data, err := ask(nc, streams.OpAcquire, streams.AcquireRequest{Resource: name, RequestID: "r", TTLms: 30000, Limit: limit})
		if err != nil || code != "" {
			return fmt.Errorf("acquire: %q %v", code, err)
		}
		var l streams.LeaseResponse
		if err := json.Unmarshal(data, &l); err != nil {
			return err
		}
		code, _, err = ask(nc, streams.OpRelease, streams.ReleaseRequest{Resource: name, Permit: l.Permit, LeaseID: l.LeaseID})
		if err != nil || code != "" {
			return fmt.Errorf("release: %q %v", code, err)
		}
	default:
		code, data, err := ask(nc, streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: name, TTLms: 30000})
		if err != nil || code != "" {
			return fmt.Errorf("session.open: %q %v", code, err)
		}
		var sr streams.SessionResponse
		if err := json.Unmarshal(data, &sr); err != nil {
			return err
		}
		code, _, err = ask(nc, streams.OpSessionClose, streams.SessionCloseRequest{SessionID: sr.SessionID})
		if err != nil || code != "" {
			return fmt.Errorf("session.close: %q %v", code, err)
		}
	}
	return nil
}

// ownSite is where jetlock's code allocated live memory: its innermost
// jetlock frame.
type ownSite struct {
	where string
	bytes uint64
}

// topOwnSites returns the n sites that hold the most of jetlock's live
// heap, as ownHeap counts it (unscaled), most first.
func topOwnSites(n int) []ownSite {
	var recs []runtime.MemProfileRecord
	for {
		k, ok := runtime.MemProfile(recs, false)
		if ok {
			recs = recs[:k]
			break
		}
		recs = make([]runtime.MemProfileRecord, k+64)
	}
	by := map[string]uint64{}
	for _, r := range recs {
		if r.InUseBytes() == 0 {
			continue
		}
		frames := runtime.CallersFrames(r.Stack())
		for {
			f, more := frames.Next()
			if strings.HasPrefix(f.Function, "github.com/jetlock/jetlock/") {
				by[fmt.Sprintf("%s:%d", f.Function, f.Line)] += uint64(r.InUseBytes())
				break
			}
			if !more {
				break
			}
		}
	}
	var out []ownSite
	for w, b := range by {
		out = append(out, ownSite{w, b})
	}
	slices.SortFunc(out, func(a, b ownSite) int { return cmp.Compare(b.bytes, a.bytes) })
	return out[:min(n, len(out))]
}
