package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Actors of lock sets, semaphores and elections, all raw request-reply
// clients.
//
// A set actor acquires sets of 2 to 4 resources out of a small pool (so
// that sets overlap), naming them in a random order, some waiting in the
// queues; sometimes it acquires one resource of the pool alone instead, so
// that single waiters and set waiters share the queues. It holds a set as
// a raw actor holds a lease (writes through the fenced register to each
// resource with that resource's own token, renews the set whole, naming
// it in another order, releases it whole, cancels it, or abandons it),
// sometimes probes renewing or releasing one resource of it alone (which
// must be refused), and sometimes writes once more, late, with each
// token. A semaphore actor takes a permit of a semaphore of Permits
// permits (some waiting), renews and releases it by its number, and fences
// its writes per permit ("<sem>#<k>"). A candidate campaigns for an
// election (an acquire with a value, usually waiting), and while it leads
// renews, sometimes proclaiming a new value, writes through the fence with
// its token, reads the status, and resigns, is cancelled or stops
// renewing. Replies are dropped and requests retried with the same ids as
// by the raw actors. An observer records every election event, and a watch
// records every write to the bucket.

// primitiveStats counts what the actors of sets, semaphores and elections
// did.
type primitiveStats struct {
	sets, singles, permits, leaderships, proclaims, resigned, abandoned, probes atomic.Int64
	swapPermits, swapLocks                                                      atomic.Int64 // of the swap actors (runSwap)
}

func (s *primitiveStats) String() string {
	return fmt.Sprintf("%d sets and %d single resources of the set pool held, %d permits, %d leaderships (%d proclaims, %d resigned), %d permits and %d locks of names that change kind, %d abandoned, %d probes",
		s.sets.Load(), s.singles.Load(), s.permits.Load(), s.leaderships.Load(), s.proclaims.Load(), s.resigned.Load(),
		s.swapPermits.Load(), s.swapLocks.Load(), s.abandoned.Load(), s.probes.Load())
}

func (w *Workload) primitives() int { return w.Sets + w.Sems + w.Swappers + w.Candidates }

// primitiveDefaults sets the defaults of the fields of sets, semaphores
// and elections.
func (w *Workload) primitiveDefaults() {
	if w.SetPool == 0 {
		w.SetPool = 8
	}
	if w.Permits == 0 {
		w.Permits = 3
	}
	if w.Semaphores == 0 {
		w.Semaphores = 1
	}
	if w.Elections == 0 {
		w.Elections = 1
	}
}

// startObservers starts the election events' observer, when the workload
// has actors of sets, semaphores or elections, and the bucket's watch,
// when it has those or session actors that take lock sets.
func (w *Workload) startObservers() {
	if w.primitives() > 0 {
		nc, _ := w.H.Connect(0, "observer")
		o, err := Observe(nc, w.Hist, -2)
		if err != nil {
			w.H.T.Fatal(err)
		}
		w.observer, w.obsConn = o, nc
	}
	if w.primitives() > 0 || w.Sessions > 0 && w.SessionSets > 0 {
		w.bucket = WatchBucket(w.H, w.Hist)
	}
}

// stopObservers stops the observer and the watch (once the watch has
// caught up with the stream, for at most 60s) and returns what the watch
// saw.
func (w *Workload) stopObservers() []BucketWrite {
	w.stopOnce.Do(func() {
		if w.observer != nil {
			// The last events in flight: until none has come for half a
			// second (a busy machine delivers late), for at most 10s.
			for i, n, quiet := 0, -1, 0; quiet < 5 && i < 100; i++ {
				if m := w.observer.Received(); m != n {
					n, quiet = m, 0
				} else {
					quiet++
				}
				time.Sleep(100 * time.Millisecond)
			}
			w.observer.Stop()
		}
		if w.bucket != nil {
			w.bucketLog = w.bucket.Stop(60 * time.Second)
		}
	})
	return w.bucketLog
}

func (w *Workload) setRes(i int) string   { return fmt.Sprintf("%s/set/%d", w.Prefix, i) }
func (w *Workload) semRes(i int) string   { return fmt.Sprintf("%s/sem/%d", w.Prefix, i) }
func (w *Workload) electRes(i int) string { return fmt.Sprintf("%s/elect/%d", w.Prefix, i) }

// pickSem draws one of the semaphores and returns its name and limit
// (Permits, or its entry of Limits).
func (w *Workload) pickSem(rng *rand.Rand) (string, int) {
	i := rng.IntN(w.Semaphores)
	if len(w.Limits) > 0 {
		return w.semRes(i), w.Limits[i%len(w.Limits)]
	}
	return w.semRes(i), w.Permits
}

// pickSet draws 2 to 4 distinct resources of the pool, in a random order.
func (a *actor) pickSet() []string {
	w := a.w
	n := min(2+a.rng.IntN(3), w.SetPool)
	perm := a.rng.Perm(w.SetPool)[:n]
	out := make([]string, n)
	for i, k := range perm {
		out[i] = w.setRes(k)
	}
	return out
}

// shuffled returns res in another random order.
func (a *actor) shuffled(res []string) []string {
	out := append([]string(nil), res...)
	a.rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// maybeWait returns a wait, with probability p, else none.
func (a *actor) maybeWait(p float64) time.Duration {
	if a.rng.Float64() < p {
		return a.between(300*time.Millisecond, 3*time.Second)
	}
	return 0
}

// retried makes one logical request: send, its first reply maybe dropped
// (drop), then retried while the outcome is unknown (at most 4 attempts,
// with backoff). It returns the last answer.
func (a *actor) retried(ctx context.Context, drop func(), send func(retry bool) Op) Op {
	retry := false
	if a.rng.Float64() < a.w.DropReply {
		drop()
		time.Sleep(a.between(10*time.Millisecond, 400*time.Millisecond))
		retry = true
	}
	backoff := 100 * time.Millisecond
	var op Op
	for attempt := 0; attempt < 4; attempt++ {
		if op = send(retry); op.Result != Unknown {
			return op
		}
		retry = true
		if ctx.Err() != nil {
			break
		}
		time.Sleep(a.between(backoff/2, backoff))
		backoff *= 2
	}
	return op
}

// untilAnswered repeats f while its outcome is unknown, at most n times.
func (a *actor) untilAnswered(n int, f func() Op) Op {
	var op Op
	for attempt := 0; attempt < n; attempt++ {
		if op = f(); op.Result != Unknown {
			break
		}
		time.Sleep(a.between(50*time.Millisecond, 200*time.Millisecond))
	}
	return op
}

// keep holds a lease granted with deadline for up to hold: it writes (write)
// while the client's deadline has not passed, renews (renew) about every
// third of the TTL, at once when renewNow (a grant after waiting, whose
// TTL counts from before the wait), retrying a renewal whose outcome is
// unknown until the deadline. It returns when the time it meant to hold
// is up, or when the lease is lost (the deadline passed, or a renewal was
// refused).
func (a *actor) keep(ctx context.Context, hold, deadline time.Duration, renewNow bool, write func(), renew func() Op) {
	w, h := a.w, a.w.Hist
	until := h.Now() + a.between(0, hold)
	renewAll := func() bool {
		for {
			if h.Now() >= deadline {
				return false
			}
			r := renew()
			if r.Result == OK {
				deadline = max(deadline, r.Deadline)
				return true
			}
			if r.Result == Fail {
				return false
			}
			time.Sleep(a.between(20*time.Millisecond, 150*time.Millisecond))
		}
	}
	if renewNow && !renewAll() {
		return
	}
	for ctx.Err() == nil && h.Now() < until {
		if h.Now() < deadline-100*time.Millisecond && a.rng.Float64() < 0.8 {
			write()
		}
		sleepCtx(ctx, min(a.between(w.TTL/4, w.TTL/3), max(0, until-h.Now())))
		if ctx.Err() != nil || h.Now() >= until || !renewAll() {
			return
		}
	}
}

// lateWrite writes once more, late, with token to key, with the
// probability of a stale write.
func (a *actor) lateWrite(key string, token uint64, note string) {
	w := a.w
	if a.rng.Float64() >= w.StaleWrite {
		return
	}
	w.wg.Add(1)
	delay := a.between(0, w.TTL)
	go func() {
		defer w.wg.Done()
		time.Sleep(delay)
		w.Reg.Write(a.id, key, token, note)
	}()
}

// runSet is a set actor.
func (a *actor) runSet(ctx context.Context) {
	w := a.w
	for ctx.Err() == nil && w.next() {
		a.n++
		rid := fmt.Sprintf("%s-x%d-%d", w.Prefix, a.id, a.n)
		if a.rng.Float64() < 0.2 {
			// One resource of the pool alone, in the same queues.
			res := w.setRes(a.rng.IntN(w.SetPool))
			op, ok := a.acquire(ctx, res, rid, a.maybeWait(0.4))
			if !ok {
				sleepCtx(ctx, a.between(10*time.Millisecond, 150*time.Millisecond))
				continue
			}
			w.prim.singles.Add(1)
			a.hold(ctx, res, rid, op)
			continue
		}
		set := a.pickSet()
		if a.rng.Float64() < 0.1 {
			a.c.Status(set[0])
		}
		wait := a.maybeWait(0.6)
		if wait > 0 && a.rng.Float64() < 0.2 {
			a.waitThenCancelSet(set, rid, wait)
			continue
		}
		op := a.retried(ctx,
			func() { a.c.AcquireSetDropReply(set, rid, w.TTL) },
			func(retry bool) Op { return a.c.AcquireSet(a.shuffled(set), rid, w.TTL, wait, retry) })
		switch op.Result {
		case Unknown:
			a.untilAnswered(4, func() Op { return a.c.CancelSet(set, rid) })
			fallthrough
		case Fail:
			sleepCtx(ctx, a.between(10*time.Millisecond, 150*time.Millisecond))
			continue
		}
		w.prim.sets.Add(1)
		a.holdSet(ctx, set, rid, op, wait > 0)
	}
}

// holdSet keeps the set lease op granted for a while (see keep), writing
// to each resource with its own token, then ends it.
func (a *actor) holdSet(ctx context.Context, set []string, rid string, op Op, waited bool) {
	w := a.w
	tokens := map[string]uint64{}
	for _, m := range op.Members {
		tokens[m.Resource] = m.Token
	}
	a.keep(ctx, w.TTL, op.Deadline, waited, func() {
		for _, res := range set {
			if a.rng.Float64() < 0.8 {
				w.Reg.Write(a.id, res, tokens[res], "set")
			}
		}
		if a.rng.Float64() < 0.05 {
			// One resource alone: refused (invalid_request), a set is
			// renewed and released whole.
			w.prim.probes.Add(1)
			if a.rng.Float64() < 0.5 {
				a.c.Renew(set[0], op.LeaseID, w.TTL)
			} else {
				a.c.Release(set[0], op.LeaseID)
			}
		}
	}, func() Op { return a.c.RenewSet(a.shuffled(set), op.LeaseID, w.TTL) })
	switch p := a.rng.Float64(); {
	case p < 0.7:
		a.untilAnswered(3, func() Op { return a.c.ReleaseSet(a.shuffled(set), op.LeaseID) })
	case p < 0.85:
		a.untilAnswered(4, func() Op { return a.c.CancelSet(a.shuffled(set), rid) })
	default:
		w.prim.abandoned.Add(1)
	}
	for _, res := range set {
		a.lateWrite(res, tokens[res], "late write of an ended set")
	}
}

// waitThenCancelSet queues a waiting acquire of a set and cancels it
// mid-wait. A grant that arrives is never used; once the cancel is
// answered it must be gone, which a renewal then probes.
func (a *actor) waitThenCancelSet(set []string, rid string, wait time.Duration) {
	done := make(chan Op, 1)
	go func() { done <- a.c.AcquireSet(set, rid, a.w.TTL, wait, false) }()
	time.Sleep(a.between(50*time.Millisecond, wait*4/5))
	a.untilAnswered(4, func() Op { return a.c.CancelSet(a.shuffled(set), rid) })
	if op := <-done; op.Result == OK {
		a.c.RenewSet(set, op.LeaseID, a.w.TTL)
	}
}

// runSem is a semaphore actor.
func (a *actor) runSem(ctx context.Context) {
	w := a.w
	for ctx.Err() == nil && w.next() {
		a.n++
		sem, limit := w.pickSem(a.rng)
		rid := fmt.Sprintf("%s-p%d-%d", w.Prefix, a.id, a.n)
		if a.rng.Float64() < 0.15 {
			a.c.SemaphoreStatus(sem, limit)
		}
		wait := a.maybeWait(0.5)
		if wait > 0 && a.rng.Float64() < 0.2 {
			done := make(chan Op, 1)
			go func() { done <- a.c.AcquirePermit(sem, limit, rid, w.TTL, wait, false) }()
			time.Sleep(a.between(50*time.Millisecond, wait*4/5))
			a.untilAnswered(4, func() Op { return a.c.CancelPermit(sem, limit, rid) })
			if op := <-done; op.Result == OK {
				a.c.RenewPermit(sem, op.Permit, op.LeaseID, w.TTL)
			}
			continue
		}
		op := a.retried(ctx,
			func() { a.c.AcquirePermitDropReply(sem, limit, rid, w.TTL) },
			func(retry bool) Op { return a.c.AcquirePermit(sem, limit, rid, w.TTL, wait, retry) })
		switch op.Result {
		case Unknown:
			a.untilAnswered(4, func() Op { return a.c.CancelPermit(sem, limit, rid) })
			fallthrough
		case Fail:
			sleepCtx(ctx, a.between(10*time.Millisecond, 150*time.Millisecond))
			continue
		}
		w.prim.permits.Add(1)
		key := streams.PermitResource(sem, op.Permit)
		a.keep(ctx, 2*w.TTL, op.Deadline, wait > 0, func() { w.Reg.Write(a.id, key, op.Token, "permit") },
			func() Op { return a.c.RenewPermit(sem, op.Permit, op.LeaseID, w.TTL) })
		switch p := a.rng.Float64(); {
		case p < 0.7:
			a.untilAnswered(3, func() Op { return a.c.ReleasePermit(sem, op.Permit, op.LeaseID) })
		case p < 0.85:
			a.untilAnswered(4, func() Op { return a.c.CancelPermit(sem, limit, rid) })
		default:
			w.prim.abandoned.Add(1)
		}
		a.lateWrite(key, op.Token, "late write of an ended permit")
	}
}

// runCandidate is an election candidate.
func (a *actor) runCandidate(ctx context.Context) {
	w := a.w
	for ctx.Err() == nil && w.next() {
		a.n++
		res, rid := w.electRes(a.rng.IntN(w.Elections)), fmt.Sprintf("%s-e%d-%d", w.Prefix, a.id, a.n)
		value := fmt.Sprintf("c%d-%d", a.id, a.n)
		var wait time.Duration
		if a.rng.Float64() < 0.85 {
			wait = a.between(time.Second, 5*time.Second)
		}
		op := a.retried(ctx,
			func() { a.c.CampaignDropReply(res, rid, value, w.TTL) },
			func(retry bool) Op { return a.c.Campaign(res, rid, value, w.TTL, wait, retry) })
		switch op.Result {
		case Unknown:
			a.untilAnswered(4, func() Op { return a.c.Cancel(res, rid) })
			fallthrough
		case Fail:
			sleepCtx(ctx, a.between(10*time.Millisecond, 150*time.Millisecond))
			continue
		}
		w.prim.leaderships.Add(1)
		a.lead(ctx, res, rid, op, wait > 0)
	}
}

// lead keeps the leadership op granted for a while (see keep): writes with
// its token, renews, sometimes proclaiming a new value, sometimes reads
// the status; then resigns, is cancelled, or stops renewing.
func (a *actor) lead(ctx context.Context, res, rid string, op Op, waited bool) {
	w := a.w
	j := 0
	a.keep(ctx, w.TTL, op.Deadline, waited, func() {
		w.Reg.Write(a.id, res, op.Token, "leader")
		if a.rng.Float64() < 0.2 {
			a.c.Status(res)
		}
	}, func() Op {
		if a.rng.Float64() < 0.4 {
			j++
			w.prim.proclaims.Add(1)
			return a.c.Proclaim(res, op.LeaseID, fmt.Sprintf("%s-%d", op.Value, j), w.TTL)
		}
		return a.c.Renew(res, op.LeaseID, w.TTL)
	})
	switch p := a.rng.Float64(); {
	case p < 0.6:
		w.prim.resigned.Add(1)
		a.untilAnswered(3, func() Op { return a.c.Release(res, op.LeaseID) })
	case p < 0.75:
		a.untilAnswered(4, func() Op { return a.c.Cancel(res, rid) })
	default:
		w.prim.abandoned.Add(1)
	}
	a.lateWrite(res, op.Token, "late write of an ended leadership")
}
