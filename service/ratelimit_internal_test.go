package service

import (
	"testing"
)

// A tenant's own rate replaces the default: by user, else by account, and
// 0 means no limit; a request that crossed no import is not limited.
func TestTenantRates(t *testing.T) {
	l := newLimits(0, 1, map[string]float64{"BIG": 0, "BIG/small": 1, "MID/u": 10}, func(string) {})
	allowed := func(who origin, n int) int {
		ok := 0
		for range n {
			if l.allow("", who, 1) == nil {
				ok++
			}
		}
		return ok
	}
	for _, c := range []struct {
		who  origin
		want int // of 100 at once: the burst (twice the rate), or all
	}{
		{origin{account: "BIG", user: "any"}, 100}, // the account's rate: none
		{origin{account: "BIG", user: "small"}, 2}, // the user's own entry wins
		{origin{account: "MID", user: "u"}, 20},    // its own rate
		{origin{account: "MID", user: "other"}, 2}, // the default
		{origin{}, 100}, // no tenant: not limited
	} {
		if got := allowed(c.who, 100); got != c.want {
			t.Errorf("%+v: %d of 100 allowed, want %d", c.who, got, c.want)
		}
	}
}

// A tenant whose bucket is empty is told so by spent, which dispatch asks
// before any other work; a tenant with tokens left, one never seen, and a
// request of no tenant are not.
func TestSpentTenantRefusedEarly(t *testing.T) {
	refused := 0
	l := newLimits(0, 2, nil, func(string) { refused++ })
	noisy, quiet := origin{account: "APP", user: "flood"}, origin{account: "APP", user: "calm"}
	if l.spent(noisy) != nil || l.spent(origin{}) != nil {
		t.Fatal("a tenant never seen, or no tenant, is spent")
	}
	for l.allow("", noisy, 1) == nil {
	}
	err := l.spent(noisy)
	oe, ok := err.(*opError)
	if !ok || oe.code != "unavailable" || oe.retryAfter <= 0 {
		t.Fatalf("spent tenant: %v, want unavailable with retry_after", err)
	}
	if l.allow("", quiet, 1) != nil || l.spent(quiet) != nil {
		t.Fatal("another tenant is refused")
	}
	if refused != 2 { // allow's refusal ending the loop, and spent's
		t.Fatalf("refusals counted %d, want 2", refused)
	}
}
