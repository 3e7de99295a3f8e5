package service

import (
	"context"
	"sync"
	"time"
)

// deadlineStep is the granularity of the requests' shared deadlines.
const deadlineStep = 10 * time.Millisecond

// deadlines hands out the contexts that bound a request's store work:
// each ends timeout after the request started, rounded up to the next
// deadlineStep, and requests that start in the same step share one. A
// context of its own per request cost a timer and three allocations on
// every request, about a sixth of what the service allocated at the design
// load.
//
// Deadlines are counted on the monotonic clock from base, so a step of the
// wall clock moves none of them.
type deadlines struct {
	timeout time.Duration
	base    time.Time // carries a monotonic reading

	mu     sync.Mutex
	step   int64 // of cur's deadline, counted from base
	cur    context.Context
	cancel context.CancelFunc // cur's; it ends at its deadline anyway
}

func newDeadlines(timeout time.Duration) *deadlines {
	return &deadlines{timeout: timeout, base: time.Now()}
}

// get returns a context that ends between timeout and timeout+deadlineStep
// from now.
func (d *deadlines) get() context.Context {
	step := int64((time.Since(d.base)+d.timeout)/deadlineStep) + 1
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cur == nil || step != d.step {
		d.cur, d.cancel = context.WithDeadline(context.Background(), d.base.Add(time.Duration(step)*deadlineStep))
		d.step = step
	}
	return d.cur
}
