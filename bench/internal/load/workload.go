package load

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// Rates are the open-loop target rates of one phase, per second.
// Keepalive is the rate of session keepalives (session mode, where leases
// are not renewed one by one).
type Rates struct {
	Acquire, Renew, Release, Keepalive float64
}

func (r Rates) String() string {
	if r.Keepalive > 0 {
		return fmt.Sprintf("acquire %.0f/s, renew %.0f/s, release %.0f/s, keepalive %.0f/s", r.Acquire, r.Renew, r.Release, r.Keepalive)
	}
	return fmt.Sprintf("acquire %.0f/s, renew %.0f/s, release %.0f/s", r.Acquire, r.Renew, r.Release)
}

// Map returns the rates by operation name.
func (r Rates) Map() map[string]float64 {
	m := map[string]float64{OpAcquire: r.Acquire, OpRenew: r.Renew, OpRelease: r.Release}
	if r.Keepalive > 0 {
		m[OpKeepalive] = r.Keepalive
	}
	return m
}

// Config shapes the lease workload.
type Config struct {
	Resources     int           // lockable resources
	Leases        int           // leases held at once (the warm-up target)
	TTL           time.Duration // lease TTL
	RenewInterval time.Duration // each lease is renewed about this often
	RenewJitter   float64       // ± fraction of RenewInterval
	Timeout       time.Duration // request timeout
	Retries       int           // retries (same request_id) of an acquire whose outcome is unknown
	RetryBackoff  time.Duration
	Names         string // resource name prefix
	RunID         string // request id prefix
	// Sessions, when above zero, puts the workload in session mode (the
	// service backend only): the leases are acquired in Sessions sessions
	// (OpenSessions), each lease in one picked at random, and instead of
	// renewing each lease the workload keeps each session alive every
	// TTL/3 (± RenewJitter). Close them with CloseSessions.
	Sessions int
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
	g     *Grant
	okAt  time.Time // when the last successful write of the lease (grant or renewal) was sent
	lost  bool      // the lease was counted lost (see Losses)
	sess  int32     // session mode: the session the lease is (or may be) in; -1 none
}

// Workload drives the lease workload against a backend: acquires of random
// free resources, renewals of held leases in order of their due time, and
// releases of random held leases, each at its own open-loop rate. It
// tracks what it holds from the answers and feeds the grant log. It is safe
// for concurrent use: replies arrive on the connections' goroutines.
type Workload struct {
	cfg   Config
	be    Backend
	rq    *Requester
	log   *GrantLog
	names []string

	mu         sync.Mutex
	slots      []slot
	free, held idSet
	renewQ     renewHeap
	quarantine []quarantined
	rng        *rand.Rand
	reqSeq     uint64

	pendingRetries atomic.Int64
	lost           losses

	// Session mode (see Config.Sessions).
	sb       *Service
	sessions []session
	usable   idSet     // sessions open, to acquire in
	keepQ    renewHeap // sessions by keepalive due time
	released atomic.Int64
}

// NewWorkload returns a workload on be through rq; log may be nil.
func NewWorkload(cfg Config, be Backend, rq *Requester, log *GrantLog) *Workload {
	w := &Workload{cfg: cfg, be: be, rq: rq, log: log,
		names: make([]string, cfg.Resources), slots: make([]slot, cfg.Resources),
		free: newIDSet(cfg.Resources), held: newIDSet(cfg.Resources),
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))}
	for i := range w.names {
		w.names[i] = fmt.Sprintf("%sr%06d", cfg.Names, i)
		w.free.add(int32(i))
		w.slots[i].sess = -1
	}
	if cfg.Sessions > 0 {
		w.sb = be.(*Service) // sessions are the service's
		w.sessions = make([]session, cfg.Sessions)
		w.usable = newIDSet(cfg.Sessions)
	}
	return w
}

// Backend returns the workload's backend.
func (w *Workload) Backend() Backend { return w.be }

// InFlight returns the number of the workload's requests waiting for
// their reply.
func (w *Workload) InFlight() int64 { return w.rq.InFlight() }

// Config returns the workload's shape.
func (w *Workload) Config() Config { return w.cfg }

func (w *Workload) raw() bool { return w.be.Name() == "raw" }

// Held returns the number of held leases.
func (w *Workload) Held() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held.len()
}

func (w *Workload) renewDue(now time.Time) time.Time {
	j := 1 + w.cfg.RenewJitter*(2*w.rng.Float64()-1)
	return now.Add(time.Duration(float64(w.cfg.RenewInterval) * j))
}

// toQuarantine takes a resource out of use until any lease it may hold
// has expired. The caller holds w.mu.
func (w *Workload) toQuarantine(id int32, now time.Time) {
	if w.raw() {
		w.toDead(id) // its revision is unknown: a write would conflict
		return
	}
	until := now.Add(w.cfg.TTL + 5*time.Second)
	if w.slots[id].sess >= 0 {
		// A lease of a session lives as long as the session: the
		// session's close (or loss) frees the resource.
		until = now.Add(24 * time.Hour)
	}
	w.toQuarantineUntil(id, until)
}

// toQuarantineUntil takes a resource out of use until then. The caller
// holds w.mu.
func (w *Workload) toQuarantineUntil(id int32, until time.Time) {
	w.slots[id].gen++
	w.slots[id].state = stQuarantined
	w.quarantine = append(w.quarantine, quarantined{until: until, id: id})
}

// toFree makes a resource free. The caller holds w.mu.
func (w *Workload) toFree(id int32) {
	s := &w.slots[id]
	s.gen++
	s.state, s.lease, s.token, s.g = stFree, "", 0, nil
	s.okAt, s.lost = time.Time{}, false
	if s.sess >= 0 {
		delete(w.sessions[s.sess].members, id)
		s.sess = -1
	}
	w.free.add(id)
}

// toHeld makes a resource held and schedules its renewal. The caller holds
// w.mu.
func (w *Workload) toHeld(id int32, due time.Time) {
	s := &w.slots[id]
	s.gen++
	s.state = stHeld
	w.held.add(id)
	if w.sb == nil { // a session's lease is kept by its session's keepalives
		heap.Push(&w.renewQ, renewItem{due: due, id: id, gen: s.gen})
	}
}

// toDead retires a raw key whose revision is unknown. The caller holds
// w.mu.
func (w *Workload) toDead(id int32) {
	w.slots[id].gen++
	w.slots[id].state = stDead
}

// housekeeping frees quarantined resources whose time has come.
func (w *Workload) housekeeping(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for ; n < len(w.quarantine) && !w.quarantine[n].until.After(now); n++ {
		if id := w.quarantine[n].id; w.slots[id].state == stQuarantined {
			w.toFree(id)
		}
	}
	w.quarantine = w.quarantine[n:]
}

// attempt is one try of one logical acquire.
type attempt struct {
	rec, retry *Recorder
	id         int32
	reqID      string
	rev        uint64
	first      time.Time // the logical acquire's intended time
	n          int       // 0 for the first try
	grants     *GrantTimes
	session    string // session mode: the session_id acquired in
}

// sendAcquire acquires a random free resource; the latency counts from
// intended.
func (w *Workload) sendAcquire(rec *Recorders, op string, rate float64, intended time.Time, grants *GrantTimes) {
	w.mu.Lock()
	id, ok := w.free.pick(w.rng)
	if !ok {
		w.mu.Unlock()
		rec.Get(op, rate).Skip()
		return
	}
	s := &w.slots[id]
	s.state = stAcquiring
	s.gen++
	w.reqSeq++
	a := attempt{rec: rec.Get(op, rate), retry: rec.Get(OpAcquireRetry, 0), id: id,
		reqID: w.cfg.RunID + "-" + strconv.FormatUint(w.reqSeq, 10), rev: s.rev, first: intended, grants: grants}
	if w.sb != nil {
		si, ok := w.pickSession()
		if !ok {
			w.toFree(id)
			w.mu.Unlock()
			rec.Get(op, rate).Skip()
			return
		}
		s.sess, a.session = si, w.sessions[si].id
		w.sessions[si].members[id] = struct{}{}
	}
	w.mu.Unlock()
	w.tryAcquire(a, intended)
}

func (w *Workload) tryAcquire(a attempt, intended time.Time) {
	r := a.rec
	if a.n > 0 {
		r = a.retry
	}
	var m *nats.Msg
	if a.session != "" {
		m = w.sb.AcquireInSession(w.names[a.id], a.reqID, a.session)
	} else {
		m = w.be.Acquire(w.names[a.id], a.reqID, "", w.cfg.TTL, 0, a.rev)
	}
	err := w.rq.Send(m, w.cfg.Timeout, func(reply *nats.Msg, at time.Time, err error) {
		res := w.be.Parse(streams.OpAcquire, reply, err)
		r.Record(at.Sub(intended), res.Code)
		w.shed(res, a.n > 0)
		w.afterAcquire(a, res, at)
	})
	if err != nil {
		r.Fail(SendCode(err))
		w.mu.Lock()
		if a.n == 0 && errors.Is(err, ErrBacklog) {
			w.toFree(a.id) // never sent
		} else {
			w.toQuarantine(a.id, time.Now())
		}
		w.mu.Unlock()
	}
}

func (w *Workload) afterAcquire(a attempt, res Result, at time.Time) {
	if res.Code == CodeOK {
		g := w.log.Granted(w.names[a.id], res.Token, res.Lease, a.first, at, w.cfg.TTL)
		a.grants.Add(a.first, at)
		w.mu.Lock()
		s := &w.slots[a.id]
		s.lease, s.token, s.g = res.Lease, res.Token, g
		s.okAt, s.lost = a.first, false
		if w.raw() {
			s.rev = res.Rev
		}
		if s.sess >= 0 && w.sessions[s.sess].state == ssLost {
			w.toFree(a.id) // granted, and ended with its session since
		} else {
			w.toHeld(a.id, w.renewDue(at))
		}
		w.mu.Unlock()
		return
	}
	if res.Unknown && a.n < w.cfg.Retries {
		// Outcome unknown: retry with the same request_id, which never
		// creates a second lease; after retry_after_ms if the answer
		// asks for longer than the backoff, as a client would.
		w.pendingRetries.Add(1)
		time.AfterFunc(retryDelay(w.cfg.RetryBackoff, res.RetryAfter), func() {
			defer w.pendingRetries.Add(-1)
			a.n++
			w.tryAcquire(a, time.Now())
		})
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case res.Unknown, res.Code == streams.CodeLocked, res.Code == streams.CodeLeaseLost:
		w.toQuarantine(a.id, at) // possibly held, by an earlier try or by someone else
	case res.Code == CodeConflict:
		w.toDead(a.id)
	default:
		w.toFree(a.id)
	}
}

// nextRenewal takes the held lease whose renewal is due first out of the
// held set; ok is false when none is held. The caller holds w.mu.
func (w *Workload) nextRenewal() (id int32, ok bool) {
	for w.renewQ.Len() > 0 {
		it := heap.Pop(&w.renewQ).(renewItem)
		if s := &w.slots[it.id]; s.state == stHeld && s.gen == it.gen {
			w.held.remove(it.id)
			s.state = stRenewing
			return it.id, true
		}
	}
	return 0, false
}

// sendRenew renews the held lease whose renewal is due first.
func (w *Workload) sendRenew(rec *Recorders, rate float64, intended time.Time) {
	r := rec.Get(OpRenew, rate)
	w.mu.Lock()
	id, ok := w.nextRenewal()
	s := w.slots[id]
	w.mu.Unlock()
	if !ok {
		r.Skip()
		return
	}
	sent := time.Now()
	m := w.be.Renew(w.names[id], s.lease, w.cfg.TTL, s.rev)
	err := w.rq.Send(m, w.cfg.Timeout, func(reply *nats.Msg, at time.Time, err error) {
		res := w.be.Parse(streams.OpRenew, reply, err)
		r.Record(at.Sub(intended), res.Code)
		w.mu.Lock()
		defer w.mu.Unlock()
		if !w.raw() {
			w.renewOutcome(id, res.Code, sent, at)
		}
		switch {
		case res.Code == CodeOK:
			if w.raw() {
				w.slots[id].rev, res.Token = res.Rev, s.token
			}
			w.log.RenewedAt(w.names[id], s.g, res.Token, sent)
			w.toHeld(id, w.renewDue(at))
		case res.Code == streams.CodeLeaseLost:
			w.toFree(id) // the lease is gone: expired and deleted
		case res.Code == CodeConflict:
			w.toDead(id)
		default:
			w.toHeld(id, at) // unknown, or refused leaving the lease as it was: renew again soon
		}
	})
	if err != nil {
		r.Fail(SendCode(err))
		w.mu.Lock()
		if !w.raw() {
			w.renewOutcome(id, SendCode(err), sent, time.Now())
		}
		w.toHeld(id, time.Now())
		w.mu.Unlock()
	}
}

// maxRetryAfter bounds how much longer than the backoff a retry waits for
// an answer's retry_after_ms, so that Drain's bound holds.
const maxRetryAfter = time.Second

// retryDelay is how long to wait before retrying an acquire: the backoff,
// or the answer's retry_after_ms when that is longer (at most
// maxRetryAfter more).
func retryDelay(backoff, retryAfter time.Duration) time.Duration {
	return min(max(backoff, retryAfter), backoff+maxRetryAfter)
}

// sendRelease releases a random held lease.
func (w *Workload) sendRelease(rec *Recorders, op string, rate float64, intended time.Time) {
	r := rec.Get(op, rate)
	w.mu.Lock()
	id, ok := w.held.pick(w.rng)
	if ok {
		w.slots[id].state = stReleasing
		w.slots[id].gen++
	}
	s := w.slots[id]
	w.mu.Unlock()
	if !ok {
		r.Skip()
		return
	}
	w.log.ReleasedAt(s.g, time.Now())
	err := w.rq.Send(w.be.Release(w.names[id], s.lease, s.rev), w.cfg.Timeout, func(reply *nats.Msg, at time.Time, err error) {
		res := w.be.Parse(streams.OpRelease, reply, err)
		code := res.Code
		if code == CodeOK && !res.Released {
			code = CodeReleasedFalse
		}
		r.Record(at.Sub(intended), code)
		w.mu.Lock()
		defer w.mu.Unlock()
		switch {
		case res.Code == CodeOK:
			if w.raw() {
				w.slots[id].rev = res.Rev
			}
			w.toFree(id)
		case res.Code == CodeConflict:
			w.toDead(id)
		default:
			w.toQuarantine(id, at)
		}
	})
	if err != nil {
		r.Fail(SendCode(err))
		w.log.ReleasedAt(s.g, time.Time{})
		w.mu.Lock()
		w.toHeld(id, time.Now())
		w.mu.Unlock()
	}
}

// Run drives the workload at r for d, recording into rec (and grant times
// into grants, which may be nil), and returns when the last operation has
// been sent (replies may still be in flight: see Drain).
func (w *Workload) Run(ctx context.Context, rec *Recorders, grants *GrantTimes, r Rates, d time.Duration) {
	start := time.Now()
	// Create the recorders up front so that tables list every operation.
	rec.Get(OpAcquire, r.Acquire)
	rec.Get(OpRenew, r.Renew)
	rec.Get(OpRelease, r.Release)
	if r.Keepalive > 0 {
		rec.Get(OpKeepalive, r.Keepalive)
	}
	Pace(ctx, []Paced{
		{NewSchedule(start, r.Acquire, d, 0), func(t time.Time) { w.sendAcquire(rec, OpAcquire, r.Acquire, t, grants) }},
		{NewSchedule(start, r.Renew, d, 0), func(t time.Time) { w.sendRenew(rec, r.Renew, t) }},
		{NewSchedule(start, r.Release, d, 0), func(t time.Time) { w.sendRelease(rec, OpRelease, r.Release, t) }},
		{NewSchedule(start, r.Keepalive, d, 0), func(t time.Time) { w.sendKeepalive(rec, r.Keepalive, t) }},
	}, w.housekeeping)
}

// warmupWindow bounds the requests in flight during warm-up and
// clean-up, which are not measured: they run as fast as the system allows
// (up to their rate) without queueing up work that would spill into the
// measured phase.
const warmupWindow = 256

// gated runs n operations of send at most rate per second and at most
// warmupWindow in flight, and waits for their answers.
func (w *Workload) gated(ctx context.Context, n int, rate float64, send func(time.Time)) {
	s := NewSchedule(time.Now(), rate, 24*time.Hour, int64(n))
	Pace(ctx, []Paced{{s, func(time.Time) {
		for w.rq.InFlight() >= warmupWindow && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		send(time.Now())
	}}}, w.housekeeping)
	w.Drain(ctx)
}

// Warmup acquires leases until n are held (in at most three rounds), with
// no other operation, recording into rec.
func (w *Workload) Warmup(ctx context.Context, rec *Recorders, n int, rate float64) {
	for round := 0; round < 3 && ctx.Err() == nil && w.Held() < n; round++ {
		w.gated(ctx, n-w.Held(), rate, func(t time.Time) { w.sendAcquire(rec, OpWarmup, rate, t, nil) })
	}
}

// ReleaseAll releases every held lease, recording into rec.
func (w *Workload) ReleaseAll(ctx context.Context, rec *Recorders, rate float64) {
	if n := w.Held(); n > 0 {
		w.gated(ctx, n, rate, func(t time.Time) { w.sendRelease(rec, OpCleanup, rate, t) })
	}
}

// Drain waits until no request or retry is in flight, at most the request
// timeout times the tries plus a margin.
func (w *Workload) Drain(ctx context.Context) {
	limit := w.cfg.Timeout*time.Duration(w.cfg.Retries+1) + time.Duration(w.cfg.Retries)*(w.cfg.RetryBackoff+maxRetryAfter) + 2*time.Second
	dctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for w.rq.InFlight() > 0 || w.pendingRetries.Load() > 0 {
		select {
		case <-dctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// idSet is a set of small integer ids with O(1) add, remove and uniform
// random pick. It is not safe for concurrent use.
type idSet struct {
	ids []int32
	pos []int32 // pos[id] is 1 + the index of id in ids, or 0
}

func newIDSet(n int) idSet { return idSet{pos: make([]int32, n)} }

func (s *idSet) len() int { return len(s.ids) }

func (s *idSet) has(id int32) bool { return s.pos[id] != 0 }

func (s *idSet) add(id int32) {
	if s.pos[id] == 0 {
		s.ids = append(s.ids, id)
		s.pos[id] = int32(len(s.ids))
	}
}

func (s *idSet) remove(id int32) {
	p := s.pos[id]
	if p == 0 {
		return
	}
	last := s.ids[len(s.ids)-1]
	s.ids[p-1] = last
	s.pos[last] = p
	s.ids = s.ids[:len(s.ids)-1]
	s.pos[id] = 0
}

// pick removes and returns a uniformly random member; ok is false when
// the set is empty.
func (s *idSet) pick(rng *rand.Rand) (id int32, ok bool) {
	if len(s.ids) == 0 {
		return 0, false
	}
	id = s.ids[rng.IntN(len(s.ids))]
	s.remove(id)
	return id, true
}

// renewItem is a lease due for renewal; gen tells a stale item (the lease
// was released or renewed since) from a current one.
type renewItem struct {
	due time.Time
	id  int32
	gen uint32
}

// renewHeap orders renewals by due time (container/heap).
type renewHeap []renewItem

func (h renewHeap) Len() int           { return len(h) }
func (h renewHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h renewHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *renewHeap) Push(x any)        { *h = append(*h, x.(renewItem)) }
func (h *renewHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// quarantined is a resource whose state is unknown (a write's outcome was
// unknown) until it can no longer hold a lease.
type quarantined struct {
	until time.Time
	id    int32
}
