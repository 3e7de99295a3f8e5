package load

import (
	"context"
	"time"
)

// Schedule is an open-loop arrival schedule: operation i is intended to be
// sent at start + i/rate, whatever happened to the operations before it.
// Latency is measured from that intended time, so a stalled system (or a
// stalled load generator) shows up as latency instead of as a quietly lower
// send rate: the measurement is safe from coordinated omission.
//
// A schedule is bounded in time (no operation is intended at or after end)
// and, when limit > 0, in count. It is not safe for concurrent use; Pace
// owns it.
type Schedule struct {
	start, end time.Time
	rate       float64 // operations per second; <= 0 means none
	limit      int64   // at most this many operations when > 0
	next       int64   // index of the next operation to send
}

// NewSchedule returns a schedule of rate per second from start for d, of
// at most limit operations when limit > 0.
func NewSchedule(start time.Time, rate float64, d time.Duration, limit int64) *Schedule {
	return &Schedule{start: start, end: start.Add(d), rate: rate, limit: limit}
}

func (s *Schedule) intended(i int64) time.Time {
	return s.start.Add(time.Duration(float64(i) * float64(time.Second) / s.rate))
}

// Done reports whether every operation of the schedule has been handed out.
func (s *Schedule) Done() bool {
	return s.rate <= 0 || (s.limit > 0 && s.next >= s.limit) || !s.intended(s.next).Before(s.end)
}

// NextAt returns the intended time of the next operation; ok is false when
// the schedule is done.
func (s *Schedule) NextAt() (t time.Time, ok bool) {
	if s.Done() {
		return time.Time{}, false
	}
	return s.intended(s.next), true
}

// Due calls f with the intended time of every operation due at now, in
// order, and returns how many it handed out.
func (s *Schedule) Due(now time.Time, f func(intended time.Time)) int {
	n := 0
	for ; !s.Done() && !s.intended(s.next).After(now); n++ {
		s.next++
		f(s.intended(s.next - 1))
	}
	return n
}

// Paced is one schedule and what to do at each of its intended times.
type Paced struct {
	S    *Schedule
	Send func(intended time.Time)
}

// minSleep keeps the pacer from spinning: operations due within it are sent
// together, up to that much after their intended time (which the latency
// measurement then includes).
const minSleep = 200 * time.Microsecond

// Pace runs the schedules until every one is done or ctx ends, calling
// each Send at (or just after) its intended time, and housekeeping (if not
// nil) at least every 50ms. It runs on the caller's goroutine.
func Pace(ctx context.Context, ps []Paced, housekeeping func(now time.Time)) {
	for {
		now := time.Now()
		var next time.Time
		for _, p := range ps {
			p.S.Due(now, p.Send)
			if t, ok := p.S.NextAt(); ok && (next.IsZero() || t.Before(next)) {
				next = t
			}
		}
		if housekeeping != nil {
			housekeeping(now)
		}
		if next.IsZero() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(max(time.Until(next), minSleep), 50*time.Millisecond)):
		}
	}
}
