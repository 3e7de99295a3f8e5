package main

import (
	"context"
	"time"
)

// paced is one schedule and what to do at each of its intended times.
type paced struct {
	s    *schedule
	send func(intended time.Time)
}

// minSleep keeps the pacer from spinning: operations due within it are sent
// together, up to that much after their intended time (which the latency
// measurement then includes).
const minSleep = 200 * time.Microsecond

// pace runs the schedules until every one is done or ctx ends, calling
// each send at (or just after) its intended time, and housekeeping (if not
// nil) at least every 50ms. It runs on the caller's goroutine.
func pace(ctx context.Context, ps []paced, housekeeping func(now time.Time)) {
	for {
		now := time.Now()
		for _, p := range ps {
			p.s.due(now, p.send)
		}
		if housekeeping != nil {
			housekeeping(now)
		}
		var next time.Time
		any := false
		for _, p := range ps {
			if t, ok := p.s.nextAt(); ok && (!any || t.Before(next)) {
				next, any = t, true
			}
		}
		if !any {
			return
		}
		d := time.Until(next)
		if d < minSleep {
			d = minSleep
		}
		if d > 50*time.Millisecond {
			d = 50 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}
