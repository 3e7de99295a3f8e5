package service

import (
	"context"
	"sync"
	"time"
)

// deadlineStep is the granularity of the requests' shared deadlines.
const deadlineStep = 10 * time.Millisecond

// deadlines hands out the contexts that bound a request's store work:
// each ends budget after the request was received, rounded up to the next
// deadlineStep, and requests received in the same step share one. A
// context of its own per request cost a timer and three allocations on
// every request, about a sixth of what the service allocated at the design
// load.
//
// The budget counts from receipt, so the time a request waited in the
// queue is taken from the same budget as its store work: a request that
// did not wait has the whole of it for a slow stretch of the stream.
//
// Deadlines are counted on the monotonic clock from base, so a step of the
// wall clock moves none of them.
type deadlines struct {
	budget time.Duration
	base   time.Time // carries a monotonic reading

	mu sync.Mutex
	// The two latest steps' contexts: requests received at about the same
	// time are handled in a slightly different order, so around a step's
	// end both are asked for.
	cur, prev shared
}

// shared is one step's context.
type shared struct {
	step   int64 // of the deadline, counted from base
	ctx    context.Context
	cancel context.CancelFunc // ctx's; it ends at its deadline anyway
}

func newDeadlines(budget time.Duration) *deadlines {
	return &deadlines{budget: budget, base: time.Now()}
}

// get returns a context that ends between budget and budget+deadlineStep
// after received.
func (d *deadlines) get(received time.Time) context.Context {
	step := int64((received.Sub(d.base)+d.budget)/deadlineStep) + 1
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.cur.ctx != nil && step == d.cur.step:
		return d.cur.ctx
	case d.prev.ctx != nil && step == d.prev.step:
		return d.prev.ctx
	}
	sh := shared{step: step}
	sh.ctx, sh.cancel = context.WithDeadline(context.Background(), d.base.Add(time.Duration(step)*deadlineStep))
	switch {
	case d.cur.ctx == nil || step > d.cur.step:
		d.prev, d.cur = d.cur, sh
	case step > d.prev.step:
		d.prev = sh
	}
	return sh.ctx
}
