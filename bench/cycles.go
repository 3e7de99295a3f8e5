package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/streams"
)

// CyclesResult is the outcome of the cycles scenario: closed-loop
// workers, each acquiring and releasing one resource after another, the
// shape of etcd's concurrency.Mutex benchmark. Latencies count from each
// request's send (ops has every percentile).
type CyclesResult struct {
	Target     string  `json:"target"` // service, or raw (bare KV create + delete)
	Workers    int     `json:"workers"`
	Cycles     int64   `json:"cycles"`
	CyclesPerS float64 `json:"cycles_per_s"`
	Errors     int64   `json:"errors"`
	AcquireP50 float64 `json:"acquire_p50_ms"`
	AcquireP99 float64 `json:"acquire_p99_ms"`
	ReleaseP50 float64 `json:"release_p50_ms"`
	ReleaseP99 float64 `json:"release_p99_ms"`
	CycleP50   float64 `json:"cycle_p50_ms"`
	CycleP99   float64 `json:"cycle_p99_ms"`
}

// runCycles runs --workers closed-loop workers for --duration against the
// service (or, with --target raw, as bare KV create + delete).
func runCycles(ctx context.Context, e *env, sum *Summary) error {
	if e.cfg.target == "raw" {
		return e.withRawBucket(ctx, func(be load.Backend, rq *load.Requester) { e.cycles(ctx, sum, be, rq, nil) })
	}
	log := e.grantLog()
	e.cycles(ctx, sum, e.serviceBackend(), e.rq, log)
	return sum.check(log)
}

func (e *env) cycles(ctx context.Context, sum *Summary, be load.Backend, rq *load.Requester, log *load.GrantLog) {
	c := e.cfg
	ph := newPhase("cycles", be, rq.InFlight, c.duration)
	fmt.Fprintf(e.out, "cycles: %d workers acquire and release random resources of %d (%s) for %v\n", c.workers, c.resources, be.Name(), c.duration)
	e.measure(ctx, sum, ph, func() {
		end := time.Now().Add(c.duration)
		var wg sync.WaitGroup
		for w := range c.workers {
			cy := &cycler{e: e, be: be, rq: rq, log: log, rec: ph.rec, w: w, names: e.names("cycles"),
				revs: map[int]uint64{}, dead: map[int]bool{}, rng: rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))}
			wg.Go(func() { cy.run(ctx, end) })
		}
		wg.Wait()
	})
	sum.use(ph)
	acq, rel, cyc := ph.Ops[load.OpAcquire], ph.Ops[load.OpRelease], ph.Ops[load.OpCycle]
	sum.Cycles = &CyclesResult{Target: be.Name(), Workers: c.workers, Cycles: cyc.Count, CyclesPerS: cyc.Rate,
		Errors: acq.Errors + rel.Errors, AcquireP50: acq.P50, AcquireP99: acq.P99, ReleaseP50: rel.P50, ReleaseP99: rel.P99,
		CycleP50: cyc.P50, CycleP99: cyc.P99}
}

// cycler is one closed-loop worker. Worker w of W uses the resources
// w, w+W, w+2W, ...: random among its share, never contended, so that a
// raw worker knows each key's revision (as a lock holder would) and the
// service never makes it wait.
type cycler struct {
	e     *env
	be    load.Backend
	rq    *load.Requester
	log   *load.GrantLog
	rec   *load.Recorders
	w     int
	names string
	revs  map[int]uint64 // raw: the revision of each key it wrote
	dead  map[int]bool   // resources whose state is unknown after a failure
	rng   *rand.Rand
	seq   int
}

// run cycles until end.
func (cy *cycler) run(ctx context.Context, end time.Time) {
	workers := cy.e.cfg.workers
	share := (cy.e.cfg.resources - cy.w + workers - 1) / workers
	if n := cy.e.cfg.rawBatch; n > 1 {
		for time.Now().Before(end) && ctx.Err() == nil && len(cy.dead) <= share-n {
			ids := cy.pick(share, n)
			if !cy.cycleBatch(ctx, ids) {
				for _, id := range ids {
					cy.dead[id] = true
				}
			}
		}
		return
	}
	for time.Now().Before(end) && ctx.Err() == nil && len(cy.dead) < share {
		if id := cy.w + cy.rng.IntN(share)*workers; !cy.dead[id] && !cy.cycle(ctx, id) {
			cy.dead[id] = true
		}
	}
}

// cycle acquires and releases resource id, and reports whether both
// succeeded.
func (cy *cycler) cycle(ctx context.Context, id int) bool {
	c := cy.e.cfg
	ctx = context.WithoutCancel(ctx) // finish the cycle: each request is bounded by --timeout
	name := fmt.Sprintf("%sr%06d", cy.names, id)
	cy.seq++
	start := time.Now()
	m := cy.be.Acquire(name, fmt.Sprintf("%s-c%d-%d", cy.e.runID, cy.w, cy.seq), "", c.ttl, 0, cy.revs[id])
	res, at := cy.commit(ctx, streams.OpAcquire, m)
	cy.rec.Get(load.OpAcquire, 0).Record(at.Sub(start), res.Code)
	if res.Code != load.CodeOK {
		return false
	}
	g := cy.log.Granted(name, res.Token, res.Lease, start, at, c.ttl)
	sent := time.Now()
	cy.log.ReleasedAt(g, sent)
	rr, done := cy.commit(ctx, streams.OpRelease, cy.be.Release(name, res.Lease, res.Rev))
	code := rr.Code
	if code == load.CodeOK && !rr.Released {
		code = load.CodeReleasedFalse
	}
	cy.rec.Get(load.OpRelease, 0).Record(done.Sub(sent), code)
	if code != load.CodeOK {
		return false
	}
	cy.rec.Get(load.OpCycle, 0).Record(done.Sub(start), load.CodeOK)
	cy.revs[id] = rr.Rev
	return true
}

// pick returns n distinct resources of the worker's share (of size
// share) whose state it knows.
func (cy *cycler) pick(share, n int) []int {
	workers := cy.e.cfg.workers
	ids := make([]int, 0, n)
	for len(ids) < n {
		id := cy.w + cy.rng.IntN(share)*workers
		if !cy.dead[id] && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// inProcessResends bounds how often commit sends a write again that found
// an earlier write to its key still in process.
const inProcessResends = 5

// commit sends msgs (more than one as one atomic batch of a new id) and
// parses the reply as op. A bare KV write refused only because the
// worker's previous write to the key was still in process on the stream
// leader (see load.Result.InProcess) is sent again, as the service would
// decide it again: the worker is the key's only writer and knows its
// revision. The time returned is when the last reply came.
func (cy *cycler) commit(ctx context.Context, op string, msgs ...*nats.Msg) (load.Result, time.Time) {
	for n := 0; ; n++ {
		if len(msgs) > 1 {
			msgs = cy.be.(*load.Raw).Batch(msgs)
		}
		reply, at, err := cy.rq.DoBatch(ctx, msgs, cy.e.cfg.timeout)
		res := cy.be.Parse(op, reply, err)
		if !res.InProcess || n == inProcessResends {
			return res, at
		}
		time.Sleep(time.Millisecond)
	}
}

// codeNotBatched: the stream did not acknowledge a --raw-batch commit as
// one atomic batch of all its messages.
const codeNotBatched = "not_batched"

// cycleBatch creates ids' keys as bare KV writes in one atomic batch, then
// deletes them in another (--raw-batch), and reports whether both
// committed. Every key counts an acquire, a release and a cycle, with its
// batch's latencies, so that rates and CPU per operation compare with
// single writes.
func (cy *cycler) cycleBatch(ctx context.Context, ids []int) bool {
	c := cy.e.cfg
	raw := cy.be.(*load.Raw)
	ctx = context.WithoutCancel(ctx)
	names := make([]string, len(ids))
	msgs := make([]*nats.Msg, len(ids))
	for i, id := range ids {
		names[i] = fmt.Sprintf("%sr%06d", cy.names, id)
		cy.seq++
		msgs[i] = raw.Acquire(names[i], fmt.Sprintf("%s-c%d-%d", cy.e.runID, cy.w, cy.seq), "", c.ttl, 0, cy.revs[id])
	}
	start := time.Now()
	res, _ := cy.commitBatch(ctx, streams.OpAcquire, load.OpAcquire, msgs)
	if res.Code != load.CodeOK {
		return false
	}
	for i := range ids {
		msgs[i] = raw.Release(names[i], "", res.Rev-uint64(len(ids)-1-i))
	}
	rr, done := cy.commitBatch(ctx, streams.OpRelease, load.OpRelease, msgs)
	if rr.Code != load.CodeOK {
		return false
	}
	for i, id := range ids {
		cy.rec.Get(load.OpCycle, 0).Record(done.Sub(start), load.CodeOK)
		cy.revs[id] = rr.Rev - uint64(len(ids)-1-i)
	}
	return true
}

// commitBatch sends msgs as one atomic batch, the reply parsed as op, and
// records it as len(msgs) operations rec, each with the batch's latency.
// It returns the outcome and when it came.
func (cy *cycler) commitBatch(ctx context.Context, op, rec string, msgs []*nats.Msg) (load.Result, time.Time) {
	sent := time.Now()
	res, at := cy.commit(ctx, op, msgs...)
	if res.Code == load.CodeOK && res.Batch != len(msgs) {
		res.Code = codeNotBatched
	}
	for range msgs {
		cy.rec.Get(rec, 0).Record(at.Sub(sent), res.Code)
	}
	return res, at
}

func printCycles(w io.Writer, r *CyclesResult) {
	fmt.Fprintf(w, "\n== cycles: %d closed-loop workers, acquire + release (%s) ==\n", r.Workers, r.Target)
	fmt.Fprintf(w, "%d cycles, %.0f/s, %d errors; acquire p50 %s p99 %s, release p50 %s p99 %s, whole cycle p50 %s p99 %s\n",
		r.Cycles, r.CyclesPerS, r.Errors, fmtMs(r.AcquireP50), fmtMs(r.AcquireP99), fmtMs(r.ReleaseP50), fmtMs(r.ReleaseP99),
		fmtMs(r.CycleP50), fmtMs(r.CycleP99))
}
