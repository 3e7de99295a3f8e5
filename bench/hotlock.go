package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// HotlockResult is the outcome of the hotlock scenario.
type HotlockResult struct {
	Mode      string  `json:"mode"` // "wait" (wait_ms) or "poll" (the service refused waiting)
	ModeNote  string  `json:"mode_note,omitempty"`
	Resources int     `json:"resources"`
	Waiters   int     `json:"waiters_per_resource"`
	HoldMs    float64 `json:"hold_ms"`
	Grants    int64   `json:"grants"`
	Releases  int64   `json:"releases"`
	Handovers int64   `json:"handovers"`
	// Hand-over latency: from the release being sent to the next grant of
	// that resource arriving.
	HandoverP50 float64 `json:"handover_p50_ms"`
	HandoverP99 float64 `json:"handover_p99_ms"`
	HandoverMax float64 `json:"handover_max_ms"`
	// Wake messages seen on WakeSubject; WakesPerRelease is null (n/a) when
	// none were seen.
	WakeSubject     string   `json:"wake_subject"`
	Wakes           int64    `json:"wakes"`
	WakesPerRelease *float64 `json:"wakes_per_release"`
	// Fairness: Jain's index of grants per caller (1 = perfectly even),
	// the fewest and most grants of one caller, and the fraction of grants
	// that went to a caller while another had been waiting longer.
	JainIndex      float64 `json:"jain_index"`
	MinGrants      int64   `json:"min_grants"`
	MaxGrants      int64   `json:"max_grants"`
	BypassFraction float64 `json:"bypass_fraction"`
	// HolderOverlaps counts grants that arrived while the bench still held
	// the resource under another lease (must be 0).
	HolderOverlaps int64 `json:"holder_overlaps"`
}

type hotResource struct {
	name string

	mu         sync.Mutex
	holder     int       // caller holding it, or -1
	releasedAt time.Time // a release was sent and no grant has arrived since
	waiting    map[int]hotWait
}

type hotWait struct {
	since time.Time
	reqID string
}

type hotlock struct {
	e     *env
	be    *serviceBackend
	ph    *phase
	log   *grantLog
	res   []*hotResource
	poll  atomic.Bool
	note  atomic.Value // string
	hand  *recorder
	count []atomic.Int64 // grants per caller

	grants, releases, bypassed, overlaps atomic.Int64
}

// runHotlock makes many callers contend for few resources: each caller
// acquires with wait_ms, holds the lock for --hold, releases and acquires
// again at once. It measures hand-over latency (release sent to next grant
// received), wake messages per release, and fairness. If the service
// refuses wait_ms, the callers poll with wait_ms 0 every --poll instead,
// and the report says so.
//
// Unlike the other scenarios this one is closed-loop by nature: a waiting
// caller sends its next request only when it has been answered.
func runHotlock(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	h := &hotlock{e: e, be: e.serviceBackend(), log: e.grantLog(), hand: newRecorder("handover", 0),
		count: make([]atomic.Int64, c.hotResources*c.waiters)}
	h.note.Store("")
	for i := 0; i < c.hotResources; i++ {
		h.res = append(h.res, &hotResource{name: fmt.Sprintf("%shot%03d", e.names("hot"), i), holder: -1, waiting: map[int]hotWait{}})
	}
	wakeSubj := c.wakeSubject
	if wakeSubj == "" {
		wakeSubj = c.prefix + ".>"
	}
	ops := map[string]bool{}
	for _, op := range streams.Operations {
		ops[streams.Subject(c.prefix, op)] = true
	}
	var wakes atomic.Int64
	sub, err := e.conns[0].Subscribe(wakeSubj, func(m *nats.Msg) {
		if !ops[m.Subject] {
			wakes.Add(1)
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", wakeSubj, err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	defer sub.Unsubscribe()

	h.ph = newPhase("hotlock", "service")
	h.ph.sched = c.duration
	fmt.Fprintf(e.out, "hotlock: %d callers on each of %d resources, hold %v, wait_ms %d, for %v\n",
		c.waiters, c.hotResources, c.hold, c.wait.Milliseconds(), c.duration)
	e.measure(ctx, h.ph, h.be.stream(), func() {
		end := time.Now().Add(c.duration)
		var wg sync.WaitGroup
		for i := 0; i < c.hotResources*c.waiters; i++ {
			wg.Add(1)
			go func(id int) {
				defer wg.Done()
				h.caller(ctx, id, h.res[id%c.hotResources], end)
			}(i)
		}
		// At the end, cancel the waits still open so that no caller sits
		// out its whole wait_ms.
		stopWaits := make(chan struct{})
		go func() {
			select {
			case <-time.After(time.Until(end)):
			case <-ctx.Done():
			}
			h.cancelWaits()
			close(stopWaits)
		}()
		wg.Wait()
		<-stopWaits
	})
	sum.Phases = append(sum.Phases, h.ph)
	sum.use(h.ph)

	r := &HotlockResult{Mode: "wait", Resources: c.hotResources, Waiters: c.waiters, HoldMs: float64(c.hold) / 1e6,
		Grants: h.grants.Load(), Releases: h.releases.Load(), WakeSubject: wakeSubj, Wakes: wakes.Load(),
		HolderOverlaps: h.overlaps.Load()}
	if h.poll.Load() {
		r.Mode = "poll"
		r.ModeNote = h.note.Load().(string)
	}
	hs := h.hand.summary(time.Second)
	r.Handovers, r.HandoverP50, r.HandoverP99, r.HandoverMax = hs.Count, hs.P50, hs.P99, hs.Max
	if r.Wakes > 0 && r.Releases > 0 {
		v := round2(float64(r.Wakes) / float64(r.Releases))
		r.WakesPerRelease = &v
	}
	var counts []int64
	for i := range h.count {
		counts = append(counts, h.count[i].Load())
	}
	r.JainIndex, r.MinGrants, r.MaxGrants = jain(counts)
	if r.Grants > 0 {
		r.BypassFraction = round2(float64(h.bypassed.Load()) / float64(r.Grants))
	}
	sum.Hotlock = r
	if h.log != nil {
		s := h.log.check()
		sum.Safety = &s
	}
	if r.HolderOverlaps > 0 {
		return fmt.Errorf("hotlock: %d grants arrived while another lease of the resource was held", r.HolderOverlaps)
	}
	return nil
}

// jain returns Jain's fairness index of xs, and their minimum and maximum.
func jain(xs []int64) (index float64, min, max int64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	var s, s2 float64
	min, max = xs[0], xs[0]
	for _, x := range xs {
		s += float64(x)
		s2 += float64(x) * float64(x)
		if x < min {
			min = x
		}
		if x > max {
			max = x
		}
	}
	if s2 == 0 {
		return 0, min, max
	}
	return round2(s * s / (float64(len(xs)) * s2)), min, max
}

// caller acquires, holds and releases r in a loop until end.
func (h *hotlock) caller(ctx context.Context, id int, r *hotResource, end time.Time) {
	c := h.e.cfg
	rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
	for n := 0; time.Now().Before(end) && ctx.Err() == nil; n++ {
		reqID := fmt.Sprintf("%s-h%d-%d", h.e.runID, id, n)
		sent := time.Now()
		r.mu.Lock()
		r.waiting[id] = hotWait{since: sent, reqID: reqID}
		r.mu.Unlock()
		res, at := h.acquire(ctx, r, reqID, fmt.Sprintf("caller-%d", id), end, rng)
		r.mu.Lock()
		delete(r.waiting, id)
		r.mu.Unlock()
		if res.code != codeOK {
			continue
		}
		g := h.granted(id, r, res, sent, at)
		select {
		case <-time.After(c.hold):
		case <-ctx.Done():
		}
		h.release(r, res, g)
	}
}

// acquire sends one logical acquire: a waiting one, or polls until
// granted, end or an error that is not "locked".
func (h *hotlock) acquire(ctx context.Context, r *hotResource, reqID, owner string, end time.Time, rng *rand.Rand) (result, time.Time) {
	c := h.e.cfg
	for attempt := 0; ; attempt++ {
		poll := h.poll.Load()
		op, wait := opWaitAcquire, c.wait
		if poll {
			op, wait = opPollAcquire, 0
		}
		rec := h.ph.rec.get(op, 0)
		// Each caller is its own owner, as separate services would be: the
		// service caps waiters per owner.
		m := h.be.acquire(r.name, reqID, owner, c.ttl, wait, 0)
		sent := time.Now()
		reply, at, err := h.e.rq.do(context.WithoutCancel(ctx), m, wait+c.timeout)
		res := h.be.parse(streams.OpAcquire, reply, err)
		code := res.code
		if poll && code == streams.CodeLocked {
			code = codeOK // an expected answer while polling, not an error
		}
		rec.record(at.Sub(sent), code)
		switch {
		case res.code == codeOK:
			return res, at
		case !poll && res.code == streams.CodeInvalidRequest && wait > 0:
			if h.poll.CompareAndSwap(false, true) {
				msg := "the service answered invalid_request to wait_ms > 0: waiting is not supported; callers poll with wait_ms 0 every " + c.poll.String() + " instead, so hand-over latency is bounded below by the poll interval"
				if reply != nil {
					msg += " (" + string(reply.Data) + ")"
				}
				h.note.Store(msg)
				fmt.Fprintln(h.e.out, "hotlock: "+msg)
			}
			continue
		case time.Now().After(end) || ctx.Err() != nil:
			return res, at
		case poll && res.code == streams.CodeLocked, res.unknown:
			// Retry the same request_id after a jittered pause.
			d := time.Duration(float64(c.poll) * (0.5 + rng.Float64()))
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		default:
			// locked after the wait ran out, or another refusal: a new
			// logical acquire.
			return res, at
		}
	}
}

// granted records a grant of r to caller id.
func (h *hotlock) granted(id int, r *hotResource, res result, sent, at time.Time) *grant {
	h.grants.Add(1)
	h.count[id].Add(1)
	g := h.log.granted(r.name, res.token, res.lease, sent, at, h.e.cfg.ttl)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.holder >= 0 {
		h.overlaps.Add(1)
	}
	for other, w := range r.waiting {
		if other != id && w.since.Before(sent) {
			h.bypassed.Add(1)
			break
		}
	}
	if !r.releasedAt.IsZero() {
		h.hand.record(at.Sub(r.releasedAt), codeOK)
		r.releasedAt = time.Time{}
	}
	r.holder = id
	return g
}

// release releases r's lease, retrying (it is idempotent) while the
// outcome is unknown.
func (h *hotlock) release(r *hotResource, res result, g *grant) {
	now := time.Now()
	r.mu.Lock()
	r.holder = -1
	r.releasedAt = now
	r.mu.Unlock()
	h.log.releasedAt(g, now)
	h.releases.Add(1)
	rec := h.ph.rec.get(opRelease, 0)
	for attempt := 0; attempt <= h.e.cfg.retries; attempt++ {
		m := h.be.release(r.name, res.lease, 0)
		sent := time.Now()
		reply, at, err := h.e.rq.do(context.Background(), m, h.e.cfg.timeout)
		rr := h.be.parse(streams.OpRelease, reply, err)
		code := rr.code
		if code == codeOK && !rr.released {
			code = codeReleasedFalse
		}
		rec.record(at.Sub(sent), code)
		if !rr.unknown {
			return
		}
	}
}

// cancelWaits cancels every wait still open, so that callers return.
func (h *hotlock) cancelWaits() {
	if h.poll.Load() {
		return
	}
	var wg sync.WaitGroup
	for _, r := range h.res {
		r.mu.Lock()
		var ids []string
		for _, w := range r.waiting {
			ids = append(ids, w.reqID)
		}
		r.mu.Unlock()
		for _, id := range ids {
			wg.Add(1)
			go func(res, id string) {
				defer wg.Done()
				data := fmt.Sprintf(`{"resource":%q,"request_id":%q}`, res, id)
				m := &nats.Msg{Subject: streams.Subject(h.e.cfg.prefix, streams.OpCancel), Data: []byte(data)}
				_, _, _ = h.e.rq.do(context.Background(), m, h.e.cfg.timeout)
			}(r.name, id)
		}
	}
	wg.Wait()
}

func printHotlock(w io.Writer, r *HotlockResult) {
	fmt.Fprintf(w, "\n== hotlock: %d callers on each of %d resources, hold %.0fms, mode %s ==\n", r.Waiters, r.Resources, r.HoldMs, r.Mode)
	if r.ModeNote != "" {
		fmt.Fprintf(w, "note: %s\n", r.ModeNote)
	}
	fmt.Fprintf(w, "grants %d, releases %d; hand-over (release sent -> next grant) p50 %s p99 %s max %s over %d hand-overs\n",
		r.Grants, r.Releases, fmtMs(r.HandoverP50), fmtMs(r.HandoverP99), fmtMs(r.HandoverMax), r.Handovers)
	if r.WakesPerRelease != nil {
		fmt.Fprintf(w, "wakes: %d on %s, %.2f per release\n", r.Wakes, r.WakeSubject, *r.WakesPerRelease)
	} else {
		fmt.Fprintf(w, "wakes per release: n/a (no wake messages seen on %s)\n", r.WakeSubject)
	}
	fmt.Fprintf(w, "fairness: Jain index %.2f, grants per caller %d..%d, %.0f%% of grants bypassed a caller waiting longer\n",
		r.JainIndex, r.MinGrants, r.MaxGrants, 100*r.BypassFraction)
	fmt.Fprintf(w, "grants that arrived while another lease was held: %d\n", r.HolderOverlaps)
}
