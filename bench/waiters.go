package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/streams"
)

// WaitersResult is the outcome of the waiters scenario: what idle waiters
// on held locks cost the cluster, and the callers beside them.
type WaitersResult struct {
	Resources          int `json:"resources"`
	WaitersPerResource int `json:"waiters_per_resource"`
	Waiters            int `json:"waiters"`
	// Queued is how many waiters the queues held once every waiting
	// acquire was queued or answered, and QueueS how long that took from
	// the first one sent (as status counts them); Answered counts the
	// waiting acquires answered before the bench cancelled them at the
	// end, by code (too_many_waiters beyond a cap, ...).
	Queued   int              `json:"queued"`
	QueueS   float64          `json:"queue_s"`
	Answered map[string]int64 `json:"answered,omitempty"`
	// IdleWrites counts the stream's messages over IdleS with the waiters
	// queued and nothing else sent, and IdleWritesPerS their rate.
	IdleS          float64 `json:"idle_s"`
	IdleWrites     int64   `json:"idle_writes"`
	IdleWritesPerS float64 `json:"idle_writes_per_s"`
	// Alone and Beside are the unrelated callers' figures before the
	// waiters queued and beside them; TryHot is the try-acquire of a held
	// name that has waiters (answered locked), beside them.
	Alone  WaitersFigures `json:"alone"`
	Beside WaitersFigures `json:"beside"`
	TryHot load.OpSummary `json:"try_hot"`
	// AcquireP99Ratio is Beside's acquire p99 over Alone's.
	AcquireP99Ratio float64 `json:"acquire_p99_ratio"`
	// Met: fewer than 10 idle writes a second, every waiter queued within
	// 10s, and the acquire p99 beside the waiters within 1.2 times alone.
	Met bool `json:"met"`
}

// WaitersFigures are the unrelated callers' figures of one phase.
type WaitersFigures struct {
	Cycles     int64   `json:"cycles"`
	AcquireP50 float64 `json:"acquire_p50_ms"`
	AcquireP99 float64 `json:"acquire_p99_ms"`
	ReleaseP50 float64 `json:"release_p50_ms"`
	ReleaseP99 float64 `json:"release_p99_ms"`
	Errors     int64   `json:"errors"`
}

// runWaiters holds --hot-resources locks, and measures: --workers
// closed-loop callers acquiring and releasing names of their own for
// --duration (alone); then --waiters waiting acquires on each held lock
// (wait_ms --wait), how long they take to queue, and the stream's writes
// over --duration with nothing else sent (idle); then the callers again
// for --duration beside the waiters, each also trying a held name now and
// then (beside). It cancels the waits and releases the locks at the end.
func runWaiters(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	be := e.serviceBackend()
	r := &WaitersResult{Resources: c.hotResources, WaitersPerResource: c.waiters, Waiters: c.hotResources * c.waiters,
		Answered: map[string]int64{}}
	sum.Waiters = r
	names := e.names("waiters")
	hot := make([]string, c.hotResources)
	holders := make([]string, c.hotResources)
	for i := range hot {
		hot[i] = fmt.Sprintf("%shot%04d", names, i)
		m, err := e.conns[0].RequestMsg(be.Msg(streams.OpAcquire, &streams.AcquireRequest{Resource: hot[i], RequestID: "holder",
			TTLms: waitersHold.Milliseconds()}), c.timeout)
		if err != nil {
			return fmt.Errorf("waiters: hold %s: %w", hot[i], err)
		}
		var l streams.LeaseResponse
		if code := load.ServiceError(m); code != "" || json.Unmarshal(m.Data, &l) != nil {
			return fmt.Errorf("waiters: hold %s: %s", hot[i], code)
		}
		holders[i] = l.LeaseID
	}
	defer func() {
		for i, id := range holders {
			_, _ = e.conns[0].RequestMsg(be.Msg(streams.OpRelease, &streams.ReleaseRequest{Resource: hot[i], LeaseID: id}), c.timeout)
		}
	}()

	fmt.Fprintf(e.out, "waiters: %d callers acquiring and releasing names of their own for %v, alone\n", c.workers, c.duration)
	alone := newPhase("alone", be, e.rq.InFlight, c.duration)
	e.measure(ctx, sum, alone, func() { waitersCycles(ctx, e, alone, names+"alone/", nil, c.duration) })
	r.Alone = waitersFigures(alone)

	fmt.Fprintf(e.out, "waiters: %d waiting acquires on each of %d held locks (wait_ms %d)\n", c.waiters, c.hotResources, c.wait.Milliseconds())
	var answered sync.Map // code -> *atomic.Int64
	var nAnswered atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range r.Waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := hot[i%c.hotResources]
			m, err := e.conns[i%len(e.conns)].RequestMsg(be.Msg(streams.OpAcquire, &streams.AcquireRequest{Resource: res,
				RequestID: fmt.Sprintf("w%d", i), TTLms: c.ttl.Milliseconds(), WaitMs: c.wait.Milliseconds()}), c.wait+c.timeout)
			code := load.CodeOK
			switch {
			case err != nil:
				code = load.CodeTimeout
			case load.ServiceError(m) != "":
				code = load.ServiceError(m)
			}
			n, _ := answered.LoadOrStore(code, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			nAnswered.Add(1)
		}()
	}
	queued := func() int {
		n := 0
		for _, res := range hot {
			m, err := e.conns[0].RequestMsg(be.Msg(streams.OpStatus, &streams.StatusRequest{Resource: res}), c.timeout)
			var st streams.StatusResponse
			if err == nil && json.Unmarshal(m.Data, &st) == nil {
				n += st.Waiters
			}
		}
		return n
	}
	r.QueueS = -1
	for deadline := time.Now().Add(max(time.Minute, c.duration)); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		if r.Queued = queued(); r.Queued+int(nAnswered.Load()) >= r.Waiters {
			r.QueueS = round2(time.Since(start).Seconds())
			break
		}
	}
	fmt.Fprintf(e.out, "waiters: %d queued (%d answered) in %.2fs; idle for %v\n", r.Queued, nAnswered.Load(), r.QueueS, c.duration)

	stream := be.Stream()
	before := e.lastSeq(ctx, stream)
	select {
	case <-ctx.Done():
	case <-time.After(c.duration):
	}
	after := e.lastSeq(ctx, stream)
	if before.seq != 0 && after.seq != 0 {
		r.IdleS = round2(after.at.Sub(before.at).Seconds())
		r.IdleWrites = int64(after.seq - before.seq)
		r.IdleWritesPerS = round2(float64(r.IdleWrites) / after.at.Sub(before.at).Seconds())
	}

	fmt.Fprintf(e.out, "waiters: the callers again for %v, beside the waiters\n", c.duration)
	beside := newPhase("beside", be, e.rq.InFlight, c.duration)
	e.measure(ctx, sum, beside, func() { waitersCycles(ctx, e, beside, names+"beside/", hot, c.duration) })
	r.Beside, r.TryHot = waitersFigures(beside), beside.Ops["try_hot"]
	sum.use(beside)

	answered.Range(func(k, v any) bool {
		r.Answered[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	for i := range r.Waiters {
		_, _ = e.conns[i%len(e.conns)].RequestMsg(be.Msg(streams.OpCancel, &streams.CancelRequest{Resource: hot[i%c.hotResources],
			RequestID: fmt.Sprintf("w%d", i)}), c.timeout)
	}
	wg.Wait()
	r.AcquireP99Ratio = ratio(r.Beside.AcquireP99, r.Alone.AcquireP99)
	r.Met = r.IdleWritesPerS < 10 && r.QueueS >= 0 && r.QueueS <= 10 && r.Queued == r.Waiters && r.AcquireP99Ratio <= 1.2
	return nil
}

// waitersHold is the TTL of the locks the waiters wait for: longer than
// any run of the scenario (the service's longest TTL by default).
const waitersHold = 10 * time.Minute

// waitersCycles runs --workers closed-loop callers for d, each acquiring
// and releasing names under prefix one after another, recorded in ph as
// acquire and release; with hot, every tenth cycle also tries a held name
// of hot without waiting (try_hot).
func waitersCycles(ctx context.Context, e *env, ph *phase, prefix string, hot []string, d time.Duration) {
	c := e.cfg
	be := e.serviceBackend()
	acq, rel, try := ph.rec.Get(load.OpAcquire, 0), ph.rec.Get(load.OpRelease, 0), ph.rec.Get("try_hot", 0)
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range c.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc := e.conns[w%len(e.conns)]
			send := func(rec *load.Recorder, m *nats.Msg) *nats.Msg {
				t0 := time.Now()
				reply, err := nc.RequestMsg(m, c.timeout)
				switch {
				case err != nil:
					rec.Fail(load.CodeTimeout)
					return nil
				default:
					rec.Record(time.Since(t0), cmp.Or(load.ServiceError(reply), load.CodeOK))
				}
				return reply
			}
			for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
				res := fmt.Sprintf("%s%d/%d", prefix, w, i)
				m := send(acq, be.Msg(streams.OpAcquire, &streams.AcquireRequest{Resource: res, RequestID: "r", TTLms: c.ttl.Milliseconds()}))
				var l streams.LeaseResponse
				if m != nil && load.ServiceError(m) == "" && json.Unmarshal(m.Data, &l) == nil {
					send(rel, be.Msg(streams.OpRelease, &streams.ReleaseRequest{Resource: res, LeaseID: l.LeaseID}))
				}
				if len(hot) > 0 && i%10 == 0 {
					// Answered locked: the name is held (counted as that code).
					send(try, be.Msg(streams.OpAcquire, &streams.AcquireRequest{Resource: hot[(w+i)%len(hot)], RequestID: res}))
				}
			}
		}()
	}
	wg.Wait()
}

func waitersFigures(ph *phase) WaitersFigures {
	acq, rel := ph.Ops[load.OpAcquire], ph.Ops[load.OpRelease]
	return WaitersFigures{Cycles: acq.Count, AcquireP50: acq.P50, AcquireP99: acq.P99, ReleaseP50: rel.P50, ReleaseP99: rel.P99,
		Errors: acq.Errors + rel.Errors}
}

func printWaiters(w io.Writer, r *WaitersResult) {
	verdict := "met"
	if !r.Met {
		verdict = "missed"
	}
	fmt.Fprintf(w, "\n== waiters: %d idle waiters on each of %d held locks ==\n", r.WaitersPerResource, r.Resources)
	fmt.Fprintf(w, "queued %d of %d in %.2fs; answered before the end: %s\n", r.Queued, r.Waiters, r.QueueS, countsText(r.Answered))
	fmt.Fprintf(w, "idle: %d stream writes in %.1fs (%.2f/s)\n", r.IdleWrites, r.IdleS, r.IdleWritesPerS)
	for _, p := range []struct {
		name string
		f    WaitersFigures
	}{{"alone", r.Alone}, {"beside", r.Beside}} {
		fmt.Fprintf(w, "%-6s acquire p50 %s p99 %s, release p50 %s p99 %s (%d cycles, %d errors)\n", p.name,
			fmtMs(p.f.AcquireP50), fmtMs(p.f.AcquireP99), fmtMs(p.f.ReleaseP50), fmtMs(p.f.ReleaseP99), p.f.Cycles, p.f.Errors)
	}
	fmt.Fprintf(w, "try-acquire of a held name with waiters: p50 %s p99 %s (%d)\n", fmtMs(r.TryHot.P50), fmtMs(r.TryHot.P99), r.TryHot.Count)
	fmt.Fprintf(w, "beside/alone acquire p99 %.2fx (idle writes under 10/s, all queued within 10s, p99 within 1.2x: %s)\n", r.AcquireP99Ratio, verdict)
}
