package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/internal/devcluster"
)

// Workload drives many clients against the service while faults are
// injected: raw request-reply clients that acquire (some waiting in the
// queue), renew, release, cancel, lose replies and retry with the same
// request id, and write through the fenced register; and Go clients
// (package client) that wait for hot resources, sometimes giving up
// mid-wait; and, when asked, session actors (runSession) that open
// sessions, keep them alive and hold several leases in each (lock sets
// and permits of semaphores among them), and actors of lock sets,
// semaphores and elections (primitives_workload_test.go), with an
// observer of election events and a watch of the bucket. Every operation
// is recorded in Hist. Zero values of the tuning fields take the defaults
// given.
type Workload struct {
	H    *Harness
	Hist *History
	Reg  *Register
	// Prefix starts every resource name (and request id), so that runs on
	// one cluster do not meet. The default is "w".
	Prefix string
	// Hot and Cold are the numbers of hot and cold resources. The defaults
	// are 3 and 40.
	Hot, Cold int
	// HotShare is the share of acquires on a hot resource. Default 0.7.
	HotShare float64
	// Raw and Go are the numbers of raw and Go-client actors. Defaults 12
	// and 3; Go may be set negative for none.
	Raw, Go int
	// Sessions is the number of session actors. The default is none.
	Sessions int
	// SessionSets and SessionPermits are the shares of a session actor's
	// acquires that take a lock set (2 to 4 resources, out of the set
	// pool or of the hot and cold resources) or a permit of a semaphore
	// (of Permits permits) in the session. Defaults 0.25 and 0.2;
	// negative for none.
	SessionSets, SessionPermits float64
	// MinSessionTTL and MaxSessionTTL bound the TTL of each session, drawn
	// at random between them. Defaults 2s and 4s.
	MinSessionTTL, MaxSessionTTL time.Duration
	// Sets, Sems and Candidates are the numbers of lock-set, semaphore
	// and election actors. The default is none.
	Sets, Sems, Candidates int
	// SetPool is the number of resources the sets are drawn from (default
	// 8); Semaphores the number of semaphores (default 1), each of
	// Permits permits (default 3); Elections the number of elections
	// (default 1).
	SetPool, Semaphores, Permits, Elections int
	// Limits, when set, gives semaphore i the limit Limits[i%len(Limits)]
	// instead of Permits, so that semaphores of several limits are used
	// at once.
	Limits []int
	// Swappers is the number of actors each of which uses a name of its
	// own first as a semaphore, then, once its permits have ended, as a
	// lock, and so on (runSwap). The default is none.
	Swappers int
	// TTL is the lease TTL. The default is 3s.
	TTL time.Duration
	// DropReply is the share of acquires whose first reply is dropped
	// (then retried with the same request id). The default is 0.15.
	DropReply float64
	// WaitShare is the share of raw acquires that wait in the queue, and
	// CancelShare the share of those cancelled mid-wait. Defaults 0.2, 0.3.
	WaitShare, CancelShare float64
	// StaleWrite is the share of ended leases whose holder writes once
	// more, late, with the old token. The default is 0.15.
	StaleWrite float64
	// MaxIterations bounds the logical acquires of all actors together.
	// The default is 100000.
	MaxIterations int64

	iter      atomic.Int64
	actors    []*actor
	goStats   goStats
	sessStats sessionStats
	prim      primitiveStats
	wg        sync.WaitGroup

	observer  *Observer
	obsConn   *nats.Conn
	bucket    *BucketWatch
	bucketLog []BucketWrite
	stopOnce  sync.Once
}

type actor struct {
	w     *Workload
	id    int
	c     *Caller
	proxy *Proxy
	rng   *rand.Rand
	n     int
}

func (w *Workload) defaults() {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	if w.Prefix == "" {
		w.Prefix = "w"
	}
	if w.Hot == 0 {
		w.Hot = 3
	}
	if w.Cold == 0 {
		w.Cold = 40
	}
	if w.Raw == 0 {
		w.Raw = 12
	}
	if w.Go == 0 {
		w.Go = 3
	}
	if w.TTL == 0 {
		w.TTL = 3 * time.Second
	}
	if w.MinSessionTTL == 0 {
		w.MinSessionTTL = 2 * time.Second
	}
	if w.MaxSessionTTL == 0 {
		w.MaxSessionTTL = 4 * time.Second
	}
	if w.MaxIterations == 0 {
		w.MaxIterations = 100000
	}
	def(&w.HotShare, 0.7)
	def(&w.DropReply, 0.15)
	def(&w.WaitShare, 0.2)
	def(&w.CancelShare, 0.3)
	def(&w.StaleWrite, 0.15)
	def(&w.SessionSets, 0.25)
	def(&w.SessionPermits, 0.2)
	w.SessionSets, w.SessionPermits = max(w.SessionSets, 0), max(w.SessionPermits, 0)
	w.primitiveDefaults()
}

// Prepare connects the actors, spread over the nodes, each through its
// own proxy, and starts the observer of election events and the watch of
// the bucket if there are actors of sets, semaphores or elections. Call it
// from the test goroutine before Run.
func (w *Workload) Prepare() {
	w.defaults()
	w.startObservers()
	for i := 0; i < w.Raw+max(w.Go, 0)+w.Sessions+w.primitives(); i++ {
		nc, p := w.H.Connect(i%devcluster.Size, fmt.Sprintf("actor-%d", i))
		w.actors = append(w.actors, &actor{w: w, id: i, c: &Caller{NC: nc, H: w.Hist, Client: i}, proxy: p,
			rng: rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))})
	}
}

// Close closes the actors' connections and proxies (also done at the
// test's cleanup); call it after Run to free them early.
func (w *Workload) Close() {
	w.stopObservers()
	for _, a := range w.actors {
		a.c.NC.Close()
		a.proxy.Close()
	}
	if w.obsConn != nil {
		w.obsConn.Close()
	}
}

// ClientProxies returns the proxies of the actors' connections.
func (w *Workload) ClientProxies() []*Proxy {
	out := make([]*Proxy, len(w.actors))
	for i, a := range w.actors {
		out[i] = a.proxy
	}
	return out
}

// Run runs every actor until ctx ends or the iterations are spent, then
// lets each finish its current lease (bounded retries), and returns when
// all have stopped.
func (w *Workload) Run(ctx context.Context) {
	for i, a := range w.actors {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			switch {
			case i < w.Raw:
				a.runRaw(ctx)
			case i < w.Raw+max(w.Go, 0):
				a.runGo(ctx)
			case i < w.Raw+max(w.Go, 0)+w.Sessions:
				a.runSession(ctx)
			case i < w.Raw+max(w.Go, 0)+w.Sessions+w.Sets:
				a.runSet(ctx)
			case i < w.Raw+max(w.Go, 0)+w.Sessions+w.Sets+w.Sems:
				a.runSem(ctx)
			case i < w.Raw+max(w.Go, 0)+w.Sessions+w.Sets+w.Sems+w.Swappers:
				a.runSwap(ctx)
			default:
				a.runCandidate(ctx)
			}
		}()
	}
	w.wg.Wait()
}

func (w *Workload) next() bool { return w.iter.Add(1) <= w.MaxIterations }

func (a *actor) pick() string {
	w := a.w
	if a.rng.Float64() < w.HotShare {
		return fmt.Sprintf("%s/hot/%d", w.Prefix, a.rng.IntN(w.Hot))
	}
	return fmt.Sprintf("%s/cold/%d", w.Prefix, a.rng.IntN(w.Cold))
}

func (a *actor) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(a.rng.Int64N(int64(hi-lo)+1))
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (a *actor) runRaw(ctx context.Context) {
	for ctx.Err() == nil && a.w.next() {
		a.n++
		res, rid := a.pick(), fmt.Sprintf("%s-c%d-%d", a.w.Prefix, a.id, a.n)
		if a.rng.Float64() < 0.15 {
			a.c.Status(res)
		}
		var wait time.Duration
		if a.rng.Float64() < a.w.WaitShare {
			wait = a.between(300*time.Millisecond, 3*time.Second)
			if a.rng.Float64() < a.w.CancelShare {
				a.waitThenCancel(res, rid, wait)
				continue
			}
		}
		op, ok := a.acquire(ctx, res, rid, wait)
		if !ok {
			sleepCtx(ctx, a.between(10*time.Millisecond, 150*time.Millisecond))
			continue
		}
		a.hold(ctx, res, rid, op)
	}
}

// acquire makes one logical acquire: its first reply maybe dropped, then
// retried with the same request id while the outcome is unknown, and
// cancelled if it stays unknown.
func (a *actor) acquire(ctx context.Context, res, rid string, wait time.Duration) (Op, bool) {
	retry := false
	if a.rng.Float64() < a.w.DropReply {
		a.c.AcquireDropReply(res, rid, a.w.TTL)
		time.Sleep(a.between(10*time.Millisecond, 400*time.Millisecond))
		retry = true
	}
	backoff := 100 * time.Millisecond
	for attempt := 0; attempt < 4; attempt++ {
		op := a.c.Acquire(res, rid, a.w.TTL, wait, retry)
		switch op.Result {
		case OK:
			return op, true
		case Fail:
			return op, false
		}
		retry = true
		if ctx.Err() != nil {
			break
		}
		time.Sleep(a.between(backoff/2, backoff))
		backoff *= 2
	}
	a.cancel(res, rid)
	return Op{}, false
}

// cancel sends cancel until it is answered (at most 4 times).
func (a *actor) cancel(res, rid string) Op {
	var op Op
	for attempt := 0; attempt < 4; attempt++ {
		if op = a.c.Cancel(res, rid); op.Result != Unknown {
			break
		}
		time.Sleep(a.between(50*time.Millisecond, 200*time.Millisecond))
	}
	return op
}

// waitThenCancel queues a waiting acquire and cancels it mid-wait. A grant
// that arrives is never used; once the cancel is answered it must be gone,
// which a renewal then probes.
func (a *actor) waitThenCancel(res, rid string, wait time.Duration) {
	done := make(chan Op, 1)
	go func() { done <- a.c.Acquire(res, rid, a.w.TTL, wait, false) }()
	time.Sleep(a.between(50*time.Millisecond, wait*4/5))
	a.cancel(res, rid)
	if op := <-done; op.Result == OK {
		a.c.Renew(res, op.LeaseID, a.w.TTL)
	}
}

// hold keeps a granted lease for a while: writes to the register while the
// client's deadline has not passed, renews every third of the TTL, and
// ends by release, cancel or abandonment, perhaps followed by a late write
// with the old token.
func (a *actor) hold(ctx context.Context, res, rid string, op Op) {
	w, h := a.w, a.w.Hist
	deadline, token := op.Deadline, op.Token
	until := h.Now() + a.between(0, w.TTL*2)
	lost := false
	for !lost && ctx.Err() == nil && h.Now() < until {
		if h.Now() < deadline-100*time.Millisecond && a.rng.Float64() < 0.8 {
			w.Reg.Write(a.id, res, token, "")
		}
		sleepCtx(ctx, min(a.between(w.TTL/4, w.TTL/3), max(0, until-h.Now())))
		if ctx.Err() != nil || h.Now() >= until {
			break
		}
		for {
			if h.Now() >= deadline {
				lost = true
				break
			}
			r := a.c.Renew(res, op.LeaseID, w.TTL)
			if r.Result == OK {
				deadline = r.Deadline
				break
			}
			if r.Result == Fail {
				lost = true
				break
			}
			time.Sleep(a.between(20*time.Millisecond, 150*time.Millisecond))
		}
	}
	switch p := a.rng.Float64(); {
	case p < 0.75:
		for attempt := 0; attempt < 3; attempt++ {
			if a.c.Release(res, op.LeaseID).Result != Unknown {
				break
			}
			time.Sleep(a.between(50*time.Millisecond, 200*time.Millisecond))
		}
	case p < 0.87:
		a.cancel(res, rid)
	}
	if a.rng.Float64() < w.StaleWrite {
		w.wg.Add(1)
		delay := a.between(0, w.TTL)
		go func() {
			defer w.wg.Done()
			time.Sleep(delay)
			w.Reg.Write(a.id, res, token, "late write of an ended lease")
		}()
	}
}
