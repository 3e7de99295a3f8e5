package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// floodRequests is the size of the hostile flood: requests with random
// resource names and ids, none of which any caller holds. A leak of a few
// hundred bytes a request would show in the live heap; what the tracker and
// the bucket keep is checked exactly.
const floodRequests = 100_000

// serveToCaller runs an instance with cfg on a fresh cluster and returns
// it with a caller's connection.
func serveToCaller(t *testing.T, cfg Config) (*Service, *nats.Conn) {
	t.Helper()
	s, conns := serveTo(t, cfg, devcluster.Caller)
	return s, conns[0]
}

// serveTo starts a cluster and a service instance on it, and connects once
// as each of roles, as serveToCaller does.
func serveTo(t *testing.T, cfg Config, roles ...devcluster.Role) (*Service, []*nats.Conn) {
	t.Helper()
	cl := startCluster(t)
	s, _ := startInstance(t, cl, cfg, 0)
	var conns []*nats.Conn
	for _, r := range roles {
		conns = append(conns, connectWhenServed(t, cl, r))
	}
	return s, conns
}

// connectWhenServed connects as role once the service answers there.
func connectWhenServed(t *testing.T, cl *devcluster.Cluster, role devcluster.Role) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(cl.URLs(), cl.ConnectOptions(role)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// The service's subscriptions reach the caller's node over the routes
	// a moment after it is ready: until then a request finds no responders.
	for try := 0; ; try++ {
		_, _, err := ask(nc, streams.OpStatus, streams.StatusRequest{Resource: "ready"})
		if err == nil {
			break
		}
		if !errors.Is(err, nats.ErrNoResponders) || try == 100 {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nc
}

// floodMix returns request i of a hostile flood: status, renew, release,
// cancel and acquire (each tenth; short TTLs, so the leases are swept
// again) of random names, with random ids.
func floodMix(rng *rand.Rand, i int) (string, any) {
	name := fmt.Sprintf("flood/%016x", rng.Uint64())
	id := fmt.Sprintf("%016x%016x", rng.Uint64(), rng.Uint64())
	switch i % 10 {
	case 0, 1, 2, 3:
		return streams.OpStatus, streams.StatusRequest{Resource: name}
	case 4, 5:
		return streams.OpRenew, streams.RenewRequest{Resource: name, LeaseID: id}
	case 6, 7:
		return streams.OpRelease, streams.ReleaseRequest{Resource: name, LeaseID: id}
	case 8:
		return streams.OpCancel, streams.CancelRequest{Resource: name, RequestID: id}
	}
	return streams.OpAcquire, streams.AcquireRequest{Resource: name, RequestID: id, Owner: "flood", TTLms: 1000}
}

// flood sends n requests made by mix from workers goroutines, each waiting
// for its answer (so at most workers are in flight), and returns how many
// got no answer. A request that timed out is sent again once, as any
// request-reply caller does (the ids make the retry the same request): on
// a machine shared with other work one answer in a flood can be late, and
// only a request that is never answered counts.
func flood(t *testing.T, nc *nats.Conn, n, workers int, mix func(*rand.Rand, int) (string, any)) int64 {
	t.Helper()
	var next, lost atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				op, body := mix(rng, i)
				data, _ := json.Marshal(body)
				subject := streams.Subject("jetlock", op)
				_, err := nc.Request(subject, data, 10*time.Second)
				if errors.Is(err, nats.ErrTimeout) {
					_, err = nc.Request(subject, data, 10*time.Second)
				}
				if err != nil {
					lost.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return lost.Load()
}

// ownHeap estimates the live heap that jetlock's own code allocated (the
// service, its connections, the test's callers), in bytes, from the
// runtime's sampled memory profile. The nodes run in this process too and
// keep caches of their own (blocks of the stream's files, of several MiB,
// kept a while after use), which a whole-heap figure would count as the
// flood's; an allocation counts here when its stack passes through a
// jetlock package.
func ownHeap() uint64 {
	// The profile is of the last completed collection; two make sure the
	// flood's garbage is gone from it.
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	for {
		n, ok := runtime.MemProfile(recs, false)
		if ok {
			recs = recs[:n]
			break
		}
		recs = make([]runtime.MemProfileRecord, n+64)
	}
	rate := float64(runtime.MemProfileRate)
	var total float64
	for _, r := range recs {
		objs, bytes := r.InUseObjects(), r.InUseBytes()
		if objs == 0 || !ownStack(r.Stack()) {
			continue
		}
		// Each sample stands for 1/(1-e^(-size/rate)) allocations of its
		// size, as pprof scales it.
		avg := float64(bytes) / float64(objs)
		total += float64(bytes) / (1 - math.Exp(-avg/rate))
	}
	return uint64(total)
}

// ownStack tells whether a stack passes through a jetlock package.
func ownStack(pcs []uintptr) bool {
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "github.com/jetlock/jetlock/") {
			return true
		}
		if !more {
			return false
		}
	}
}

// bucketMessages returns the number of messages in the bucket's stream.
func bucketMessages(t *testing.T, s *Service) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, streams.StreamName(streams.DefaultBucket))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// A flood of requests for random names and ids, none of them anyone's,
// costs an instance no memory that outlives the retry window and the
// bucket no message that outlives it: a read of a key never written is not
// kept, a renew or release of a lease that does not exist writes nothing
// that stays (its confirming write replaces one message), an acquire's
// short lease is swept and its marker leaves after the window, and a
// cancel of an unknown request writes its tombstone (which the contract
// needs: a delayed acquire of that request must not be granted later) and
// nothing else; tombstones leave after the window too.
func TestHostileFloodStaysBounded(t *testing.T) {
	cfg := DefaultConfig()
	const window = 3 * time.Second
	cfg.Bucket.RetryWindow = window
	s, nc := serveToCaller(t, cfg)

	heapBefore, msgsBefore := ownHeap(), bucketMessages(t, s)
	start := time.Now()
	if lost := flood(t, nc, floodRequests, 256, floodMix); lost > 0 {
		t.Errorf("%d of %d flood requests got no answer", lost, floodRequests)
	}
	took := time.Since(start)
	msgsAfter := bucketMessages(t, s)
	t.Logf("%d requests in %v; bucket messages %d before, %d after; tracker %v", floodRequests, took.Round(time.Millisecond),
		msgsBefore, msgsAfter, s.tracker)
	defer func() { t.Logf("at the end: bucket messages %d; tracker %v", bucketMessages(t, s), s.tracker) }()
	// During the flood the bucket holds at most one message per acquire
	// and per cancel (leases, markers and tombstones), and one for all
	// the confirming writes.
	if limit := msgsBefore + floodRequests/10*2 + 16; msgsAfter > limit {
		t.Errorf("bucket holds %d messages after the flood, more than %d", msgsAfter, limit)
	}
	// Once the short leases have expired and the retry window has passed,
	// what the flood left is gone from the tracker and the bucket.
	waitFor(t, 2*time.Minute, func() bool {
		return s.tracker.size() == 0 && bucketMessages(t, s) <= msgsBefore+16
	}, "the flood's leases, markers and tombstones gone after the retry window")
	if t.Failed() {
		return
	}
	heapAfter := ownHeap()
	t.Logf("jetlock's live heap %d KiB before, %d KiB after", heapBefore>>10, heapAfter>>10)
	// A leak of 160 bytes a request would pass this bound.
	if grown := int64(heapAfter) - int64(heapBefore); grown > 16<<20 {
		t.Errorf("jetlock's live heap grew by %d KiB over a flood that left nothing", grown>>10)
	}
}

// ask sends one request and returns the error code of its answer ("" on
// success) and its body.
func ask(nc *nats.Conn, op string, body any) (string, []byte, error) {
	data, _ := json.Marshal(body)
	m, err := nc.Request(streams.Subject("jetlock", op), data, 10*time.Second)
	if err != nil {
		return "", nil, err
	}
	if m.Header.Get(streams.HeaderErrorCode) == "" {
		return "", m.Data, nil
	}
	var er streams.ErrorResponse
	if err := json.Unmarshal(m.Data, &er); err != nil {
		return "", nil, err
	}
	return er.Error.Code, m.Data, nil
}

// One key flooded with acquires (it is held, so each is answered locked)
// by more callers than MaxPerKey lets queue for it: the overflow is
// answered unavailable at once instead of holding in-flight places, and
// another key is acquired and released meanwhile without an error, and
// another tenant's lease renewed without one: the flood's busy count is its
// key's own. (How its latency compares with a quiet service is measured by
// BenchmarkSecondKeyUnderHotKeyFlood.)
func TestHotKeyFloodLeavesOtherKeysServed(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPerKey = 4
	cfg.MaxInFlight = 64
	_, conns := serveTo(t, cfg, devcluster.Caller, devcluster.App)
	nc, app := conns[0], conns[1]
	code, body, err := ask(app, streams.OpAcquire, streams.AcquireRequest{Resource: "other-tenant", RequestID: "o", TTLms: 60000})
	if err != nil || code != "" {
		t.Fatalf("acquire other-tenant: %q %s %v", code, body, err)
	}
	var theirs streams.LeaseResponse
	json.Unmarshal(body, &theirs)
	cold := "cold"
	if code, body, err := ask(nc, streams.OpAcquire, streams.AcquireRequest{Resource: "hot", RequestID: "holder", TTLms: 60000}); err != nil || code != "" {
		t.Fatalf("acquire hot: %q %s %v", code, body, err)
	}

	stop := make(chan struct{})
	var hot sync.WaitGroup
	var locked, shed, other atomic.Int64
	for w := range 128 {
		hot.Add(1)
		go func() {
			defer hot.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				code, _, err := ask(nc, streams.OpAcquire, streams.AcquireRequest{Resource: "hot", RequestID: fmt.Sprintf("h%d-%d", w, i)})
				switch {
				case err == nil && code == streams.CodeLocked:
					locked.Add(1)
				case err == nil && code == streams.CodeUnavailable:
					shed.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	for i := range 50 {
		code, body, err := ask(nc, streams.OpAcquire, streams.AcquireRequest{Resource: cold, RequestID: fmt.Sprintf("c%d", i), TTLms: 10000})
		if err != nil || code != "" {
			t.Errorf("acquire %s #%d under the hot-key flood: %q %s %v", cold, i, code, body, err)
			break
		}
		var l streams.LeaseResponse
		json.Unmarshal(body, &l)
		code, body, err = ask(nc, streams.OpRelease, streams.ReleaseRequest{Resource: cold, LeaseID: l.LeaseID})
		if err != nil || code != "" {
			t.Errorf("release %s #%d under the hot-key flood: %q %s %v", cold, i, code, body, err)
			break
		}
		code, body, err = ask(app, streams.OpRenew, streams.RenewRequest{Resource: "other-tenant", LeaseID: theirs.LeaseID, TTLms: 60000})
		if err != nil || code != "" {
			t.Errorf("another tenant's renewal #%d under the hot-key flood: %q %s %v", i, code, body, err)
			break
		}
	}
	close(stop)
	hot.Wait()
	t.Logf("hot key: %d locked, %d shed, %d other", locked.Load(), shed.Load(), other.Load())
	if locked.Load() == 0 || other.Load() != 0 {
		t.Fatalf("hot key answers: %d locked, %d other; want locked answers and nothing but unavailable besides", locked.Load(), other.Load())
	}
}

// size counts what the tracker keeps: observed keys, ended request ids,
// queue departure times and waiters.
func (t *tracker) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.keys) + len(t.deleted) + t.retry.ids.len() + len(t.left) + t.nWaiters
}

func (t *tracker) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fmt.Sprintf("keys %d deleted %d ended %d left %d waiters %d gone %d marks %d due %d", len(t.keys), len(t.deleted), t.retry.ids.len(), len(t.left), t.nWaiters, len(t.gone), len(t.marks), len(t.due))
}

// BenchmarkSecondKeyUnderHotKeyFlood compares the acquire latency of one
// key while another (held) key is flooded with 2,000 acquires a second —
// the design load's whole acquire rate, on one key — against the same
// key's latency on a quiet service, in the same run (the cluster, the
// service and both callers in this process):
//
//	go test ./service -run '^$' -bench SecondKeyUnderHotKeyFlood -benchtime 400x
//
// It reports the quiet and flooded acquire p99 (ms) and their ratio.
func BenchmarkSecondKeyUnderHotKeyFlood(b *testing.B) {
	cl, err := devcluster.Start(devcluster.Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Shutdown)
	nc, storeNC, err := cl.ConnectService()
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(nc, storeNC, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done; nc.Close(); storeNC.Close() })
	<-s.Ready()
	// The probe and the flood are different callers, on connections of
	// their own.
	cnc, err := nats.Connect(cl.URLs(), cl.ConnectOptions(devcluster.Caller)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cnc.Close)
	fnc, err := nats.Connect(cl.URLs(), cl.ConnectOptions(devcluster.Caller)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(fnc.Close)
	cold := "cold"
	seq := 0
	cycle := func() time.Duration {
		seq++
		start := time.Now()
		code, body, err := ask(cnc, streams.OpAcquire, streams.AcquireRequest{Resource: cold, RequestID: fmt.Sprintf("c%d", seq), TTLms: 10000})
		took := time.Since(start)
		if err != nil || code != "" {
			b.Fatalf("acquire %s: %q %s %v", cold, code, body, err)
		}
		var l streams.LeaseResponse
		json.Unmarshal(body, &l)
		if code, body, err := ask(cnc, streams.OpRelease, streams.ReleaseRequest{Resource: cold, LeaseID: l.LeaseID}); err != nil || code != "" {
			b.Fatalf("release %s: %q %s %v", cold, code, body, err)
		}
		return took
	}
	quiet := make([]time.Duration, 0, 400)
	for range 400 {
		quiet = append(quiet, cycle())
	}
	if code, body, err := ask(fnc, streams.OpAcquire, streams.AcquireRequest{Resource: "hot", RequestID: "holder", TTLms: 600000}); err != nil || code != "" {
		b.Fatalf("acquire hot: %q %s %v", code, body, err)
	}
	// The flood: hotRate acquires a second of the held key, open loop (as
	// many callers as it takes), at most 1024 in flight.
	const hotRate = 2000
	stop := make(chan struct{})
	var hot sync.WaitGroup
	hot.Add(1)
	go func() {
		defer hot.Done()
		slots := make(chan struct{}, 1024)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		start, sent := time.Now(), 0
		for {
			select {
			case <-stop:
				for range cap(slots) {
					slots <- struct{}{} // wait for the requests in flight
				}
				return
			case <-tick.C:
			}
			for due := int(time.Since(start).Seconds() * hotRate); sent < due; sent++ {
				select {
				case slots <- struct{}{}:
				default:
					continue // 1024 in flight: skip, do not queue
				}
				go func(i int) {
					defer func() { <-slots }()
					ask(fnc, streams.OpAcquire, streams.AcquireRequest{Resource: "hot", RequestID: fmt.Sprintf("h%d", i)})
				}(sent)
			}
		}
	}()
	time.Sleep(time.Second) // the flood under way
	flooded := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		flooded = append(flooded, cycle())
	}
	b.StopTimer()
	close(stop)
	hot.Wait()
	q, f := p99(quiet), p99(flooded)
	b.ReportMetric(float64(q.Microseconds())/1000, "quiet-p99-ms")
	b.ReportMetric(float64(f.Microseconds())/1000, "flood-p99-ms")
	b.ReportMetric(float64(f)/float64(q), "p99-ratio")
}

func p99(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)*99)/100]
}
