package load

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Grant is one lease as the answers showed it to the bench. Every time is
// the bench's own monotonic clock.
type Grant struct {
	token    uint64
	lease    string
	sent     time.Time     // the acquire was sent (no earlier than this)
	recv     time.Time     // the grant reply arrived
	renewed  time.Time     // the last renewal that succeeded was sent
	released time.Time     // the release was sent (zero if never)
	ttl      time.Duration // the lease's TTL
}

// endBound is the earliest moment the lease can have ended: released no
// earlier than its release was sent, or expired no earlier than TTL after
// its last write the bench saw succeed (the service expires a lease only
// after TTL plus grace have passed since it saw that write).
func (g *Grant) endBound() time.Time {
	end := g.sent
	if g.renewed.After(end) {
		end = g.renewed
	}
	end = end.Add(g.ttl)
	if !g.released.IsZero() && g.released.Before(end) {
		end = g.released
	}
	return end
}

// GrantLog records the grants of a run, to check afterwards that no two
// leases of one resource were valid at once and that tokens rose strictly
// with every grant. A nil *GrantLog records nothing. It is safe for
// concurrent use.
type GrantLog struct {
	mu       sync.Mutex
	byRes    map[string][]*Grant
	byLease  map[string]*Grant
	problems []string // found while recording: a token changed by a renewal
}

// NewGrantLog returns an empty log.
func NewGrantLog() *GrantLog {
	return &GrantLog{byRes: map[string][]*Grant{}, byLease: map[string]*Grant{}}
}

// Granted records a grant reply. A reply repeating a known lease (an
// acquire retried with the same request_id) returns the known grant.
func (l *GrantLog) Granted(res string, token uint64, lease string, sent, recv time.Time, ttl time.Duration) *Grant {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.byLease[lease]; g != nil {
		if g.token != token {
			l.problems = append(l.problems, fmt.Sprintf("%s: lease answered with token %d, earlier %d", res, token, g.token))
		}
		return g
	}
	g := &Grant{token: token, lease: lease, sent: sent, recv: recv, ttl: ttl}
	l.byRes[res] = append(l.byRes[res], g)
	l.byLease[lease] = g
	return g
}

// RenewedAt records a successful renewal sent at t that answered token.
func (l *GrantLog) RenewedAt(res string, g *Grant, token uint64, t time.Time) {
	if l == nil || g == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if token != g.token {
		l.problems = append(l.problems, fmt.Sprintf("%s: renewal changed token %d to %d", res, g.token, token))
	}
	if t.After(g.renewed) {
		g.renewed = t
	}
}

// ReleasedAt records that the release of g was sent at t; a zero t undoes
// it (the release was never sent).
func (l *GrantLog) ReleasedAt(g *Grant, t time.Time) {
	if l == nil || g == nil {
		return
	}
	l.mu.Lock()
	if g.released.IsZero() || t.IsZero() {
		g.released = t
	}
	l.mu.Unlock()
}

// SafetyResult is the outcome of the double-grant check.
type SafetyResult struct {
	Checked    bool     `json:"checked"`
	Grants     int      `json:"grants"`
	Resources  int      `json:"resources"`
	Violations int      `json:"violations"`
	Examples   []string `json:"examples,omitempty"`
}

func (r *SafetyResult) add(s string) {
	r.Violations++
	if len(r.Examples) < 10 {
		r.Examples = append(r.Examples, s)
	}
}

// Check verifies, per resource, with grants ordered by token: no token
// twice, and each grant's reply arrived after the previous lease can have
// ended. A grant received while an earlier-token lease may still be valid,
// or received before a grant with a smaller token ended, is a violation:
// both a double grant and a token that went backwards in time show up so.
// The bounds are conservative, so there are no false alarms; a violation
// that lies within the bench's own timing uncertainty can be missed.
func (l *GrantLog) Check() SafetyResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	res := SafetyResult{Checked: true, Resources: len(l.byRes)}
	for _, p := range l.problems {
		res.add(p)
	}
	for r, gs := range l.byRes {
		res.Grants += len(gs)
		slices.SortFunc(gs, func(a, b *Grant) int { return cmp.Compare(a.token, b.token) })
		for i := 1; i < len(gs); i++ {
			a, b := gs[i-1], gs[i]
			if a.token == b.token {
				res.add(fmt.Sprintf("%s: token %d granted to two leases", r, a.token))
			} else if end := a.endBound(); !b.recv.After(end) {
				res.add(fmt.Sprintf("%s: token %d granted %v before token %d can have ended",
					r, b.token, end.Sub(b.recv).Round(time.Microsecond), a.token))
			}
		}
	}
	return res
}

// GrantTimes records when each successful acquire was sent and answered,
// for the failover report. A nil *GrantTimes records nothing. It is safe
// for concurrent use.
type GrantTimes struct {
	mu         sync.Mutex
	sent, recv []time.Time
}

// Add records one grant.
func (g *GrantTimes) Add(sent, recv time.Time) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.sent = append(g.sent, sent)
	g.recv = append(g.recv, recv)
	g.mu.Unlock()
}

// Around returns, for a moment t: how long before t the last grant
// arrived, when after t the first grant of an acquire sent after t
// arrived, and the longest time without any grant arriving after the last
// one before t (zero when there is nothing to measure).
func (g *GrantTimes) Around(t time.Time) (lastBefore, firstAfter, longestGap time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var first time.Time
	for i := range g.sent {
		if !g.sent[i].Before(t) && (first.IsZero() || g.recv[i].Before(first)) {
			first = g.recv[i]
		}
	}
	if !first.IsZero() {
		firstAfter = first.Sub(t)
	}
	recv := slices.Clone(g.recv)
	slices.SortFunc(recv, func(a, b time.Time) int { return a.Compare(b) })
	for i, r := range recv {
		if !r.After(t) {
			lastBefore = t.Sub(r)
		} else if i > 0 {
			longestGap = max(longestGap, r.Sub(recv[i-1]))
		}
	}
	return lastBefore, firstAfter, longestGap
}

// LongestGap returns the longest time without any grant arriving over the
// stretch from a moment from to a moment to: between the last grant
// before from and the first grant after it, between consecutive grants
// up to to, and from the last of them to to when none came after it.
// A stretch with no grant before from counts from from.
func (g *GrantTimes) LongestGap(from, to time.Time) time.Duration {
	g.mu.Lock()
	recv := slices.Clone(g.recv)
	g.mu.Unlock()
	slices.SortFunc(recv, func(a, b time.Time) int { return a.Compare(b) })
	prev, gap := from, time.Duration(0)
	for _, r := range recv {
		if !r.After(from) {
			prev = r
			continue
		}
		gap = max(gap, r.Sub(prev))
		prev = r
		if r.After(to) {
			return gap
		}
	}
	return max(gap, to.Sub(prev))
}
