package load

import (
	"testing"
	"time"
)

func TestGrantLogAcceptsSequentialLeases(t *testing.T) {
	l := NewGrantLog()
	t0 := time.Now()
	a := l.Granted("r", 10, "a", t0, t0.Add(time.Millisecond), 30*time.Second)
	l.ReleasedAt(a, t0.Add(10*time.Millisecond))
	l.Granted("r", 12, "b", t0.Add(5*time.Millisecond), t0.Add(11*time.Millisecond), 30*time.Second)
	// A retry answered with the same lease is not a second grant.
	l.Granted("r", 12, "b", t0.Add(5*time.Millisecond), t0.Add(12*time.Millisecond), 30*time.Second)
	if s := l.Check(); s.Violations != 0 || s.Grants != 2 {
		t.Fatalf("check %+v, want 2 grants and no violation", s)
	}
}

func TestGrantLogFindsOverlap(t *testing.T) {
	l := NewGrantLog()
	t0 := time.Now()
	a := l.Granted("r", 10, "a", t0, t0.Add(time.Millisecond), 30*time.Second)
	l.Granted("r", 12, "b", t0, t0.Add(2*time.Millisecond), 30*time.Second) // a still held
	l.ReleasedAt(a, t0.Add(10*time.Millisecond))
	if s := l.Check(); s.Violations != 1 {
		t.Fatalf("check %+v, want the overlap found", s)
	}
}

func TestGrantLogFindsTokenGoingBackwards(t *testing.T) {
	l := NewGrantLog()
	t0 := time.Now()
	a := l.Granted("r", 20, "a", t0, t0.Add(time.Millisecond), 30*time.Second)
	l.ReleasedAt(a, t0.Add(2*time.Millisecond))
	l.Granted("r", 15, "b", t0.Add(3*time.Millisecond), t0.Add(4*time.Millisecond), 30*time.Second)
	if s := l.Check(); s.Violations != 1 {
		t.Fatalf("check %+v, want the smaller later token found", s)
	}
}

func TestGrantLogFindsSameTokenTwice(t *testing.T) {
	l := NewGrantLog()
	t0 := time.Now()
	a := l.Granted("r", 7, "a", t0, t0, time.Second)
	l.ReleasedAt(a, t0)
	l.Granted("r", 7, "b", t0.Add(time.Minute), t0.Add(time.Minute), time.Second)
	if s := l.Check(); s.Violations != 1 {
		t.Fatalf("check %+v, want the repeated token found", s)
	}
}

// An unreleased lease may be granted again once its TTL has passed since
// its last renewal; earlier is a violation.
func TestGrantLogExpiry(t *testing.T) {
	t0 := time.Now()
	ttl := 30 * time.Second
	l := NewGrantLog()
	a := l.Granted("r", 1, "a", t0, t0, ttl)
	l.RenewedAt("r", a, 1, t0.Add(10*time.Second))
	l.Granted("r", 2, "b", t0.Add(41*time.Second), t0.Add(41*time.Second), ttl)
	if s := l.Check(); s.Violations != 0 {
		t.Fatalf("grant after expiry flagged: %+v", s)
	}
	l = NewGrantLog()
	a = l.Granted("r", 1, "a", t0, t0, ttl)
	l.RenewedAt("r", a, 1, t0.Add(10*time.Second))
	l.Granted("r", 2, "b", t0.Add(35*time.Second), t0.Add(35*time.Second), ttl)
	if s := l.Check(); s.Violations != 1 {
		t.Fatalf("grant before expiry not flagged: %+v", s)
	}
}

func TestGrantLogRenewalMustKeepToken(t *testing.T) {
	l := NewGrantLog()
	t0 := time.Now()
	a := l.Granted("r", 5, "a", t0, t0, time.Minute)
	l.RenewedAt("r", a, 6, t0.Add(time.Second))
	if s := l.Check(); s.Violations != 1 {
		t.Fatalf("token changed by renewal not flagged: %+v", s)
	}
}

func TestNilGrantLogRecordsNothing(t *testing.T) {
	var l *GrantLog
	g := l.Granted("r", 1, "a", time.Now(), time.Now(), time.Second)
	l.RenewedAt("r", g, 1, time.Now())
	l.ReleasedAt(g, time.Now())
	l.ReleasedAt(g, time.Time{})
}

// The longest window without grants over a stretch counts from the last
// grant before it, ends with the first grant after it, and runs to its
// end when no grant came after.
func TestGrantTimesLongestGap(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var g GrantTimes
	for _, ms := range []int{0, 100, 900, 1000, 1200, 5000} {
		g.Add(at(ms), at(ms))
	}
	for _, c := range []struct {
		from, to int
		want     time.Duration
	}{
		{150, 950, 800 * time.Millisecond},    // 100 to 900
		{1050, 1100, 200 * time.Millisecond},  // 1000 to 1200, the first after it
		{1250, 1300, 3800 * time.Millisecond}, // 1200 to 5000, after the stretch
		{5100, 5600, 600 * time.Millisecond},  // 5000 to the end of the stretch
		{-500, -100, 500 * time.Millisecond},  // no grant before: from its start to 0
	} {
		if got := g.LongestGap(at(c.from), at(c.to)); got != c.want {
			t.Errorf("LongestGap(%d, %d ms) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}
