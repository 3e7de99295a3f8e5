package main

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// grant is one lease as the answers showed it to the bench. Every time is
// the bench's own monotonic clock.
type grant struct {
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
func (g *grant) endBound() time.Time {
	base := g.sent
	if g.renewed.After(base) {
		base = g.renewed
	}
	end := base.Add(g.ttl)
	if !g.released.IsZero() && g.released.Before(end) {
		end = g.released
	}
	return end
}

// grantLog records the grants of a run, to check afterwards that no two
// leases of one resource were valid at once and that tokens rose strictly
// with every grant. It is safe for concurrent use.
type grantLog struct {
	mu       sync.Mutex
	byRes    map[string][]*grant
	byLease  map[string]*grant
	problems []string // found while recording: a token changed by a renewal
}

func newGrantLog() *grantLog {
	return &grantLog{byRes: map[string][]*grant{}, byLease: map[string]*grant{}}
}

// granted records a grant reply. A reply repeating a known lease (an
// acquire retried with the same request_id) returns the known grant.
func (l *grantLog) granted(res string, token uint64, lease string, sent, recv time.Time, ttl time.Duration) *grant {
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
	g := &grant{token: token, lease: lease, sent: sent, recv: recv, ttl: ttl}
	l.byRes[res] = append(l.byRes[res], g)
	l.byLease[lease] = g
	return g
}

// renewedAt records a successful renewal sent at t that answered token.
func (l *grantLog) renewedAt(res string, g *grant, token uint64, t time.Time) {
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

// releasedAt records that the release of g was sent at t.
func (l *grantLog) releasedAt(g *grant, t time.Time) {
	if l == nil || g == nil {
		return
	}
	l.mu.Lock()
	if g.released.IsZero() {
		g.released = t
	}
	l.mu.Unlock()
}

// unrelease undoes releasedAt for a release that was never sent.
func (l *grantLog) unrelease(g *grant) {
	if l == nil || g == nil {
		return
	}
	l.mu.Lock()
	g.released = time.Time{}
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

// check verifies, per resource, with grants ordered by token: no token
// twice, and each grant's reply arrived after the previous lease can have
// ended. A grant received while an earlier-token lease may still be valid,
// or received before a grant with a smaller token ended, is a violation:
// both a double grant and a token that went backwards in time show up so.
// The bounds are conservative, so there are no false alarms; a violation
// that lies within the bench's own timing uncertainty can be missed.
func (l *grantLog) check() SafetyResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	res := SafetyResult{Checked: true, Resources: len(l.byRes)}
	add := func(s string) {
		res.Violations++
		if len(res.Examples) < 10 {
			res.Examples = append(res.Examples, s)
		}
	}
	for _, p := range l.problems {
		add(p)
	}
	for r, gs := range l.byRes {
		res.Grants += len(gs)
		sort.Slice(gs, func(i, j int) bool { return gs[i].token < gs[j].token })
		for i := 1; i < len(gs); i++ {
			a, b := gs[i-1], gs[i]
			if a.token == b.token {
				add(fmt.Sprintf("%s: token %d granted to two leases", r, a.token))
				continue
			}
			if end := a.endBound(); !b.recv.After(end) {
				add(fmt.Sprintf("%s: token %d granted %v before token %d can have ended",
					r, b.token, end.Sub(b.recv).Round(time.Microsecond), a.token))
			}
		}
	}
	return res
}
