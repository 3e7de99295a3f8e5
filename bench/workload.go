package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// Operation names in reports.
const (
	opAcquire      = "acquire"
	opRenew        = "renew"
	opRelease      = "release"
	opAcquireRetry = "acquire_retry"
	opWaitAcquire  = "wait_acquire"
	opPollAcquire  = "poll_acquire"
	opWarmup       = "warmup_acquire"
	opCleanup      = "cleanup_release"
)

// rates are the open-loop target rates of one phase, per second.
type rates struct {
	acquire, renew, release float64
}

func (r rates) String() string {
	return fmt.Sprintf("acquire %.0f/s, renew %.0f/s, release %.0f/s", r.acquire, r.renew, r.release)
}

// workloadConfig shapes the lease workload.
type workloadConfig struct {
	resources     int           // lockable resources
	leases        int           // leases held at once (the warm-up target)
	ttl           time.Duration // lease TTL
	renewInterval time.Duration // each lease is renewed about this often
	renewJitter   float64       // ± fraction of renewInterval
	timeout       time.Duration // request timeout
	retries       int           // retries (same request_id) of an acquire whose outcome is unknown
	retryBackoff  time.Duration
	names         string // resource name prefix
}

// Slot states of a resource.
const (
	stFree uint8 = iota
	stAcquiring
	stHeld
	stRenewing
	stReleasing
	stQuarantined
	stDead // raw baseline: the key's revision is unknown; never used again
)

type slot struct {
	state uint8
	gen   uint32
	lease string
	token uint64
	rev   uint64 // raw: last revision of the key (the expected revision of the next write)
	g     *grant
}

// workload drives the lease workload against a backend: acquires of random
// free resources, renewals of held leases in order of their due time, and
// releases of random held leases, each at its own open-loop rate. It
// tracks what it holds from the answers and feeds the grant log. It is safe
// for concurrent use: replies arrive on the connections' goroutines.
type workload struct {
	cfg   workloadConfig
	be    backend
	rq    *requester
	log   *grantLog
	names []string

	mu         sync.Mutex
	slots      []slot
	free, held idSet
	renewQ     renewHeap
	quarantine []quarantined
	rng        *rand.Rand
	reqSeq     uint64
	runID      string

	pendingRetries atomic.Int64
}

func newWorkload(cfg workloadConfig, be backend, rq *requester, log *grantLog, runID string) *workload {
	w := &workload{cfg: cfg, be: be, rq: rq, log: log, runID: runID,
		names: make([]string, cfg.resources), slots: make([]slot, cfg.resources),
		free: newIDSet(cfg.resources), held: newIDSet(cfg.resources),
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))}
	for i := range w.names {
		w.names[i] = fmt.Sprintf("%sr%06d", cfg.names, i)
		w.free.add(int32(i))
	}
	return w
}

func (w *workload) raw() bool { return w.be.name() == "raw" }

// counts returns the numbers of held and free resources.
func (w *workload) counts() (held, free int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held.len(), w.free.len()
}

func (w *workload) renewDue(now time.Time) time.Time {
	j := 1 + w.cfg.renewJitter*(2*w.rng.Float64()-1)
	return now.Add(time.Duration(float64(w.cfg.renewInterval) * j))
}

// toQuarantine takes a resource out of use until any lease it may hold
// has expired. The caller holds w.mu.
func (w *workload) toQuarantine(id int32, now time.Time) {
	s := &w.slots[id]
	s.gen++
	if w.raw() {
		s.state = stDead // its revision is unknown: a write would conflict
		return
	}
	s.state = stQuarantined
	w.quarantine = append(w.quarantine, quarantined{until: now.Add(w.cfg.ttl + 5*time.Second), id: id})
}

// toFree makes a resource free. The caller holds w.mu.
func (w *workload) toFree(id int32) {
	s := &w.slots[id]
	s.gen++
	s.state, s.lease, s.token, s.g = stFree, "", 0, nil
	w.free.add(id)
}

// toHeld makes a resource held and schedules its renewal. The caller holds
// w.mu.
func (w *workload) toHeld(id int32, due time.Time) {
	s := &w.slots[id]
	s.gen++
	s.state = stHeld
	w.held.add(id)
	w.renewQ.push(renewItem{due: due, id: id, gen: s.gen})
}

// housekeeping frees quarantined resources whose time has come.
func (w *workload) housekeeping(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for n < len(w.quarantine) && !w.quarantine[n].until.After(now) {
		id := w.quarantine[n].id
		if w.slots[id].state == stQuarantined {
			w.toFree(id)
		}
		n++
	}
	w.quarantine = w.quarantine[n:]
}

// sendAcquire acquires a random free resource; the latency counts from
// intended.
func (w *workload) sendAcquire(rec *recorders, op string, rate float64, intended time.Time, grants *grantTimes) {
	w.mu.Lock()
	id, ok := w.free.pick(w.rng)
	if !ok {
		w.mu.Unlock()
		rec.get(op, rate).skip()
		return
	}
	s := &w.slots[id]
	s.state = stAcquiring
	s.gen++
	w.reqSeq++
	reqID := w.runID + "-" + strconv.FormatUint(w.reqSeq, 10)
	rev := s.rev
	w.mu.Unlock()
	w.doAcquire(rec, op, rate, id, reqID, rev, intended, intended, 0, grants)
}

func (w *workload) doAcquire(rec *recorders, op string, rate float64, id int32, reqID string, rev uint64,
	first, intended time.Time, attempt int, grants *grantTimes) {
	r := rec.get(op, rate)
	m := w.be.acquire(w.names[id], reqID, "", w.cfg.ttl, 0, rev)
	err := w.rq.send(m, w.cfg.timeout, func(reply *nats.Msg, err error, at time.Time) {
		res := w.be.parse(streams.OpAcquire, reply, err)
		r.record(at.Sub(intended), res.code)
		w.afterAcquire(rec, op, rate, id, reqID, rev, first, attempt, res, at, grants)
	})
	if err != nil {
		code := sendErrCode(err)
		r.fail(code)
		w.mu.Lock()
		if attempt == 0 && code == codeBacklog {
			w.toFree(id) // never sent
		} else {
			w.toQuarantine(id, time.Now())
		}
		w.mu.Unlock()
	}
}

func (w *workload) afterAcquire(rec *recorders, op string, rate float64, id int32, reqID string, rev uint64,
	first time.Time, attempt int, res result, at time.Time, grants *grantTimes) {
	name := w.names[id]
	if res.code == codeOK {
		g := w.log.granted(name, res.token, res.lease, first, at, w.cfg.ttl)
		grants.add(first, at)
		w.mu.Lock()
		s := &w.slots[id]
		s.lease, s.token, s.g = res.lease, res.token, g
		if w.raw() {
			s.rev = res.rev
		}
		w.toHeld(id, w.renewDue(at))
		w.mu.Unlock()
		return
	}
	if res.unknown && attempt < w.cfg.retries {
		// Outcome unknown: retry with the same request_id, which never
		// creates a second lease.
		w.pendingRetries.Add(1)
		time.AfterFunc(w.cfg.retryBackoff, func() {
			defer w.pendingRetries.Add(-1)
			w.doAcquire(rec, opAcquireRetry, 0, id, reqID, rev, first, time.Now(), attempt+1, grants)
		})
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case res.unknown, res.code == streams.CodeLocked, res.code == streams.CodeLeaseLost:
		// Possibly held (by an earlier attempt, or by someone else).
		w.toQuarantine(id, at)
	case res.code == codeConflict:
		w.slots[id].gen++
		w.slots[id].state = stDead
	default:
		w.toFree(id)
	}
}

// sendRenew renews the held lease whose renewal is due first.
func (w *workload) sendRenew(rec *recorders, rate float64, intended time.Time) {
	w.mu.Lock()
	var id int32
	found := false
	for {
		it, ok := w.renewQ.pop()
		if !ok {
			break
		}
		if s := &w.slots[it.id]; s.state == stHeld && s.gen == it.gen {
			id, found = it.id, true
			break
		}
	}
	if !found {
		w.mu.Unlock()
		rec.get(opRenew, rate).skip()
		return
	}
	s := &w.slots[id]
	w.held.remove(id)
	s.state = stRenewing
	lease, rev, g, token := s.lease, s.rev, s.g, s.token
	w.mu.Unlock()

	r := rec.get(opRenew, rate)
	sent := time.Now()
	m := w.be.renew(w.names[id], lease, w.cfg.ttl, rev)
	err := w.rq.send(m, w.cfg.timeout, func(reply *nats.Msg, err error, at time.Time) {
		res := w.be.parse(streams.OpRenew, reply, err)
		r.record(at.Sub(intended), res.code)
		w.mu.Lock()
		defer w.mu.Unlock()
		s := &w.slots[id]
		switch {
		case res.code == codeOK:
			if w.raw() {
				s.rev = res.rev
				res.token = token
			}
			w.log.renewedAt(w.names[id], g, res.token, sent)
			w.toHeld(id, w.renewDue(at))
		case res.code == streams.CodeLeaseLost:
			w.toFree(id) // the lease is gone: expired and deleted
		case res.code == codeConflict:
			s.gen++
			s.state = stDead
		default:
			// Unknown, or refused for a reason that leaves the lease as it
			// was: keep it, renew again soon.
			w.toHeld(id, at)
		}
	})
	if err != nil {
		r.fail(sendErrCode(err))
		w.mu.Lock()
		w.toHeld(id, time.Now())
		w.mu.Unlock()
	}
}

// sendRelease releases a random held lease.
func (w *workload) sendRelease(rec *recorders, op string, rate float64, intended time.Time) {
	w.mu.Lock()
	id, ok := w.held.pick(w.rng)
	if !ok {
		w.mu.Unlock()
		rec.get(op, rate).skip()
		return
	}
	s := &w.slots[id]
	s.state = stReleasing
	s.gen++
	lease, rev, g := s.lease, s.rev, s.g
	w.mu.Unlock()

	r := rec.get(op, rate)
	w.log.releasedAt(g, time.Now())
	m := w.be.release(w.names[id], lease, rev)
	err := w.rq.send(m, w.cfg.timeout, func(reply *nats.Msg, err error, at time.Time) {
		res := w.be.parse(streams.OpRelease, reply, err)
		code := res.code
		if code == codeOK && !res.released {
			code = codeReleasedFalse
		}
		r.record(at.Sub(intended), code)
		w.mu.Lock()
		defer w.mu.Unlock()
		switch {
		case res.code == codeOK:
			if w.raw() {
				w.slots[id].rev = res.rev
			}
			w.toFree(id)
		case res.code == codeConflict:
			w.slots[id].gen++
			w.slots[id].state = stDead
		default:
			w.toQuarantine(id, at)
		}
	})
	if err != nil {
		r.fail(sendErrCode(err))
		w.log.unrelease(g)
		w.mu.Lock()
		w.toHeld(id, time.Now())
		w.mu.Unlock()
	}
}

// run drives the workload at r for d, recording into ph, and returns when
// the last operation has been sent (replies may still be in flight).
func (w *workload) run(ctx context.Context, ph *phase, r rates, d time.Duration) {
	start := time.Now()
	var ps []paced
	if r.acquire > 0 {
		ps = append(ps, paced{newSchedule(start, r.acquire, d, 0), func(t time.Time) {
			w.sendAcquire(ph.rec, opAcquire, r.acquire, t, &ph.grants)
		}})
	}
	if r.renew > 0 {
		ps = append(ps, paced{newSchedule(start, r.renew, d, 0), func(t time.Time) { w.sendRenew(ph.rec, r.renew, t) }})
	}
	if r.release > 0 {
		ps = append(ps, paced{newSchedule(start, r.release, d, 0), func(t time.Time) {
			w.sendRelease(ph.rec, opRelease, r.release, t)
		}})
	}
	// Create the recorders up front so that tables list every operation.
	ph.rec.get(opAcquire, r.acquire)
	ph.rec.get(opRenew, r.renew)
	ph.rec.get(opRelease, r.release)
	pace(ctx, ps, w.housekeeping)
}

// warmupWindow bounds the requests in flight during warm-up and
// clean-up, which are not measured: they run as fast as the system allows
// (up to their rate) without queueing up work that would spill into the
// measured phase.
const warmupWindow = 256

// gated returns f wrapped to wait, before each send, until fewer than
// warmupWindow requests are in flight; it sends at the actual time.
func (w *workload) gated(ctx context.Context, f func(time.Time)) func(time.Time) {
	return func(time.Time) {
		for w.rq.inflight.Load() >= warmupWindow && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		f(time.Now())
	}
}

// warmup acquires leases (at most rate per second, at most warmupWindow
// in flight) until n are held, with no other operation, and waits for the
// answers.
func (w *workload) warmup(ctx context.Context, rec *recorders, n int, rate float64) {
	for round := 0; round < 3 && ctx.Err() == nil; round++ {
		held, _ := w.counts()
		need := n - held
		if need <= 0 {
			return
		}
		s := newSchedule(time.Now(), rate, 24*time.Hour, int64(need))
		send := w.gated(ctx, func(t time.Time) { w.sendAcquire(rec, opWarmup, rate, t, nil) })
		pace(ctx, []paced{{s, send}}, w.housekeeping)
		w.drain(ctx)
	}
}

// releaseAll releases every held lease (at most rate per second, at most
// warmupWindow in flight) and waits for the answers.
func (w *workload) releaseAll(ctx context.Context, rec *recorders, rate float64) {
	held, _ := w.counts()
	if held == 0 {
		return
	}
	s := newSchedule(time.Now(), rate, 24*time.Hour, int64(held))
	send := w.gated(ctx, func(t time.Time) { w.sendRelease(rec, opCleanup, rate, t) })
	pace(ctx, []paced{{s, send}}, w.housekeeping)
	w.drain(ctx)
}

// drain waits until no request or retry is in flight, at most the request
// timeout times the retries plus a margin.
func (w *workload) drain(ctx context.Context) {
	limit := w.cfg.timeout*time.Duration(w.cfg.retries+1) + time.Duration(w.cfg.retries)*w.cfg.retryBackoff + 2*time.Second
	dctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for w.rq.inflight.Load() > 0 || w.pendingRetries.Load() > 0 {
		select {
		case <-dctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// sendErrCode is the result code of a request that could not be sent.
func sendErrCode(err error) string {
	if err == errBacklog {
		return codeBacklog
	}
	return codePublish
}
