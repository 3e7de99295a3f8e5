package main

import "time"

// schedule is an open-loop arrival schedule: operation i is intended to be
// sent at start + i/rate, whatever happened to the operations before it.
// Latency is measured from that intended time, so a stalled system (or a
// stalled load generator) shows up as latency instead of as a quietly lower
// send rate: the measurement is safe from coordinated omission.
//
// A schedule is bounded in time (no operation is intended at or after end)
// and, when limit > 0, in count. It is not safe for concurrent use; the
// pacer owns it.
type schedule struct {
	start time.Time
	end   time.Time
	rate  float64 // operations per second; <= 0 means none
	limit int64   // at most this many operations when > 0
	next  int64   // index of the next operation to send
}

func newSchedule(start time.Time, rate float64, d time.Duration, limit int64) *schedule {
	return &schedule{start: start, end: start.Add(d), rate: rate, limit: limit}
}

// intended returns the intended send time of operation i.
func (s *schedule) intended(i int64) time.Time {
	return s.start.Add(time.Duration(float64(i) * float64(time.Second) / s.rate))
}

// done reports whether every operation of the schedule has been handed out.
func (s *schedule) done() bool {
	if s.rate <= 0 {
		return true
	}
	if s.limit > 0 && s.next >= s.limit {
		return true
	}
	return !s.intended(s.next).Before(s.end)
}

// nextAt returns the intended time of the next operation; ok is false when
// the schedule is done.
func (s *schedule) nextAt() (t time.Time, ok bool) {
	if s.done() {
		return time.Time{}, false
	}
	return s.intended(s.next), true
}

// due hands out the intended times of every operation due at now, in
// order, calling f for each; it returns how many it handed out.
func (s *schedule) due(now time.Time, f func(intended time.Time)) int {
	n := 0
	for !s.done() {
		t := s.intended(s.next)
		if t.After(now) {
			break
		}
		s.next++
		n++
		f(t)
	}
	return n
}
