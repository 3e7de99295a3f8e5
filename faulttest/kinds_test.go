package faulttest

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// A name is one thing at a time (a lock, an election, or a semaphore of
// one limit), and may become another once it is free. A swap actor has a
// name of its own that it uses by turns as a semaphore and as a lock;
// checkKinds checks that no lock of a name is valid while one of its
// permits is.

// swapLimit is the limit of a swap actor's semaphore.
const swapLimit = 2

func (w *Workload) swapRes(id int) string { return fmt.Sprintf("%s/swap/%d", w.Prefix, id) }

// runSwap is a swap actor. Each turn it takes a permit of its name as a
// semaphore of swapLimit permits, holds it (see keep) and releases it, or
// now and then cancels or abandons it; then it asks for the name as a
// lock, again every 200 to 400 ms while that is refused, for at most two
// TTLs: the service refuses the lock while a permit may still be held (by
// the name rule, or, on an instance that does not know the name record,
// as locked). It holds a lock it is granted as a raw actor does (see
// hold). So the name goes from semaphore to lock and back while instances
// of both releases serve it.
func (a *actor) runSwap(ctx context.Context) {
	w := a.w
	name := w.swapRes(a.id)
	for ctx.Err() == nil && w.next() {
		a.n++
		rid := fmt.Sprintf("%s-x%d-%d", w.Prefix, a.id, a.n)
		op := a.retried(ctx,
			func() { a.c.AcquirePermitDropReply(name, swapLimit, rid, w.TTL) },
			func(retry bool) Op { return a.c.AcquirePermit(name, swapLimit, rid, w.TTL, 0, retry) })
		switch op.Result {
		case Unknown:
			a.untilAnswered(4, func() Op { return a.c.CancelPermit(name, swapLimit, rid) })
		case OK:
			w.prim.swapPermits.Add(1)
			key := streams.PermitResource(name, op.Permit)
			a.keep(ctx, w.TTL, op.Deadline, false, func() { w.Reg.Write(a.id, key, op.Token, "swap permit") },
				func() Op { return a.c.RenewPermit(name, op.Permit, op.LeaseID, w.TTL) })
			switch p := a.rng.Float64(); {
			case p < 0.75:
				a.untilAnswered(3, func() Op { return a.c.ReleasePermit(name, op.Permit, op.LeaseID) })
			case p < 0.85:
				a.untilAnswered(4, func() Op { return a.c.CancelPermit(name, swapLimit, rid) })
			default:
				w.prim.abandoned.Add(1) // the lock is refused until the permit expires
			}
		}
		a.swapToLock(ctx, name)
	}
}

// swapToLock asks for name as a lock until granted, for at most two TTLs,
// and holds what it is granted.
func (a *actor) swapToLock(ctx context.Context, name string) {
	w, h := a.w, a.w.Hist
	for until := h.Now() + 2*w.TTL; ctx.Err() == nil && h.Now() < until; {
		a.n++
		rid := fmt.Sprintf("%s-x%d-%d", w.Prefix, a.id, a.n)
		op, ok := a.acquire(ctx, name, rid, a.maybeWait(0.3))
		if ok {
			w.prim.swapLocks.Add(1)
			a.hold(ctx, name, rid, op)
			return
		}
		sleepCtx(ctx, a.between(200*time.Millisecond, 400*time.Millisecond))
	}
}

// checkKinds checks that a name is one thing at a time: no lease of a
// name (a lock, an election, a set's member) is valid while a permit of a
// semaphore of that name is (kind-overlap). Validity is Check's, from the
// granting reply to the lease's end (leases holds them by the resource of
// their key: a permit's is "<sem>#<k>").
func checkKinds(leases map[string]*lease, rep *Report) {
	permits := map[string][]*lease{} // semaphore -> its permits' leases
	for _, l := range leases {
		if sem, _, ok := streams.SplitPermit(l.res); ok {
			permits[sem] = append(permits[sem], l)
		}
	}
	if len(permits) == 0 {
		return
	}
	var names []*lease
	for _, l := range leases {
		if len(permits[l.res]) > 0 {
			names = append(names, l)
		}
	}
	sort.Slice(names, func(i, j int) bool { return names[i].granted < names[j].granted })
	for _, a := range names {
		for _, b := range permits[a.res] {
			if a.granted < b.end && b.granted < a.end && a.granted < a.end && b.granted < b.end {
				rep.add("kind-overlap", "%s held as a lock and as a semaphore at once: lock %s valid [%v, %v] (until %v), permit %s valid [%v, %v] (until %v)",
					a.res, short(a.id), a.granted, a.end, a.endOp, short(b.id), b.granted, b.end, b.endOp)
			}
		}
	}
}
