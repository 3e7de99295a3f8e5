package service

import (
	"container/list"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/jetlock/jetlock/streams"
)

// limits is fair use: acquires (waiting or not) are limited per owner, and
// every operation per NATS user (tenant) by its cost (opCost), each with a
// token bucket of rate r per second and burst 2r, so that one noisy caller
// cannot take every place from the others. A caller over its rate is
// answered unavailable with retry_after_ms.
//
// Owners are chosen by callers, so the buckets live in an LRU set of at
// most maxLimited keys: a caller that sends a new owner with every request
// evicts only idle buckets, and each new owner starts with a fresh one —
// the per-user limit, whose keys the NATS server vouches for, is what
// bounds such a caller.
type limits struct {
	perOwner, perUser float64
	tenantRates       map[string]float64 // overrides of perUser: "ACCOUNT/user" or "ACCOUNT"
	refused           func(scope string)

	mu    sync.Mutex
	byKey map[string]*list.Element
	lru   *list.List // of *limited, most recent first
}

const maxLimited = 100_000

type limited struct {
	key string
	lim *rate.Limiter
}

func newLimits(perOwner, perUser float64, tenantRates map[string]float64, refused func(scope string)) *limits {
	return &limits{perOwner: perOwner, perUser: perUser, tenantRates: tenantRates, refused: refused,
		byKey: map[string]*list.Element{}, lru: list.New()}
}

// userRate returns the rate of who's tenant: its own (TenantRates names it,
// or its account), else the default; 0 means no limit.
func (l *limits) userRate(who origin) float64 {
	if r, ok := l.tenantRates[who.tenant()]; ok {
		return r
	}
	if r, ok := l.tenantRates[who.account]; ok {
		return r
	}
	return l.perUser
}

// allow takes one token from the owner's bucket (for an acquire, which
// names an owner) and cost tokens from the tenant's, or returns the
// unavailable answer with the wait until they are free.
func (l *limits) allow(owner string, who origin, cost float64) error {
	if l.perOwner > 0 && owner != "" {
		if err := l.take("owner", "o\x00"+owner, l.perOwner, 1); err != nil {
			return err
		}
	}
	if who.tenant() == "" {
		return nil
	}
	if r := l.userRate(who); r > 0 {
		if err := l.take("user", "u\x00"+who.account+"\x00"+who.user, r, int(max(1, cost))); err != nil {
			return err
		}
	}
	return nil
}

// spent reports whether who's tenant has no token left at all: every
// request it sends but the renewal or release of a lease it holds would be
// refused. dispatch refuses those at once, before a place, a goroutine or
// a decode is spent on them, so that a tenant flooding far beyond its rate
// costs the others as little as possible. The answer is the one allow
// would give.
func (l *limits) spent(who origin) error {
	if who.tenant() == "" {
		return nil
	}
	r := l.userRate(who)
	if r <= 0 {
		return nil
	}
	now := time.Now()
	key := "u\x00" + who.account + "\x00" + who.user
	l.mu.Lock()
	e, ok := l.byKey[key]
	var tokens float64
	if ok {
		tokens = e.Value.(*limited).lim.TokensAt(now)
	}
	l.mu.Unlock()
	if !ok || tokens >= 1 {
		return nil
	}
	l.refused("user")
	delay := time.Duration((1 - tokens) / r * float64(time.Second))
	return &opError{code: streams.CodeUnavailable, retryAfter: max(delay, time.Millisecond),
		msg: fmt.Sprintf("fair use: this user sends operations (weighted by cost) faster than %g a second; retry after %v", r, delay.Round(time.Millisecond))}
}

func (l *limits) take(scope, key string, r float64, n int) error {
	now := time.Now()
	l.mu.Lock()
	lim := l.limiter(key, r)
	res := lim.ReserveN(now, min(n, lim.Burst())) // a cost over the burst could never be paid
	delay := res.DelayFrom(now)
	if delay > 0 {
		res.CancelAt(now) // a refused request costs no token
	}
	l.mu.Unlock()
	if delay <= 0 {
		return nil
	}
	l.refused(scope)
	what := "operations (weighted by cost)"
	if scope == "owner" {
		what = "acquires"
	}
	return &opError{code: streams.CodeUnavailable, retryAfter: max(delay, time.Millisecond),
		msg: fmt.Sprintf("fair use: this %s sends %s faster than %g a second; retry after %v", scope, what, r, delay.Round(time.Millisecond))}
}

// limiter returns key's bucket, making it the most recent; l.mu is held.
func (l *limits) limiter(key string, r float64) *rate.Limiter {
	if e, ok := l.byKey[key]; ok {
		l.lru.MoveToFront(e)
		return e.Value.(*limited).lim
	}
	if l.lru.Len() >= maxLimited {
		old := l.lru.Back()
		l.lru.Remove(old)
		delete(l.byKey, old.Value.(*limited).key)
	}
	it := &limited{key: key, lim: rate.NewLimiter(rate.Limit(r), max(1, int(2*r)))}
	l.byKey[key] = l.lru.PushFront(it)
	return it.lim
}
