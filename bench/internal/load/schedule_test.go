package load

import (
	"testing"
	"time"
)

func TestScheduleIntendedTimesAreEvenlySpaced(t *testing.T) {
	start := time.Now()
	s := NewSchedule(start, 4, time.Second, 0) // 4/s for 1s: 0, 250, 500, 750ms
	var got []time.Duration
	s.Due(start.Add(10*time.Second), func(it time.Time) { got = append(got, it.Sub(start)) })
	want := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, 750 * time.Millisecond}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("op %d intended at %v, want %v", i, got[i], want[i])
		}
	}
	if !s.Done() {
		t.Fatal("schedule not done after its duration")
	}
}

func TestScheduleHandsOutOnlyWhatIsDue(t *testing.T) {
	start := time.Now()
	s := NewSchedule(start, 1000, time.Hour, 0)
	if n := s.Due(start.Add(-time.Millisecond), func(time.Time) {}); n != 0 {
		t.Fatalf("%d ops due before start", n)
	}
	if n := s.Due(start.Add(9500*time.Microsecond), func(time.Time) {}); n != 10 {
		t.Fatalf("%d ops due in the first 9.5ms at 1000/s, want 10 (0..9ms)", n)
	}
	next, ok := s.NextAt()
	if !ok || next.Sub(start) != 10*time.Millisecond {
		t.Fatalf("next at %v, want 10ms", next.Sub(start))
	}
}

// After a stall the schedule catches up with the intended times of the
// operations it missed, not the time they were finally sent: that is what
// makes the latency measurement safe from coordinated omission.
func TestScheduleCatchUpKeepsIntendedTimes(t *testing.T) {
	start := time.Now()
	s := NewSchedule(start, 100, time.Hour, 0)
	var intended []time.Time
	s.Due(start.Add(time.Second), func(it time.Time) { intended = append(intended, it) })
	if len(intended) != 101 {
		t.Fatalf("after a 1s stall %d ops are due, want 101", len(intended))
	}
	if lat := start.Add(time.Second).Sub(intended[0]); lat != time.Second {
		t.Fatalf("first op's latency would count from %v before the send, want 1s", lat)
	}
}

func TestScheduleBoundedByCount(t *testing.T) {
	start := time.Now()
	s := NewSchedule(start, 1e6, time.Hour, 5)
	if n := s.Due(start.Add(time.Second), func(time.Time) {}); n != 5 {
		t.Fatalf("handed out %d, want the limit 5", n)
	}
	if _, ok := s.NextAt(); ok {
		t.Fatal("schedule past its limit has a next op")
	}
}

func TestScheduleZeroRateIsDone(t *testing.T) {
	s := NewSchedule(time.Now(), 0, time.Hour, 0)
	if !s.Done() {
		t.Fatal("zero-rate schedule not done")
	}
}
