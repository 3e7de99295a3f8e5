package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Session actors. Each opens a session (raw session.open, its reply
// sometimes dropped and the open retried with the same request id), keeps
// it alive at about a third of its TTL from a goroutine of its own, and
// acquires several resources in it at once (some waiting in the queue),
// hot and cold ones shared with the other actors. It writes through the
// fenced register with each lease's token while its own deadline for the
// session has not passed, releases or cancels some leases, and ends the
// session: by a close (sometimes while its acquires are still in flight),
// by releasing everything first, or by no longer keeping it alive and
// letting it expire. After an acknowledged close it sometimes probes the
// closed session (a keepalive, an acquire in it, a release of one of its
// leases, a status read), all of which must find it ended; and it
// sometimes writes once more, late, with the tokens of leases that have
// ended. A client paused through its proxy past the TTL loses its session
// as a crashed one would.

// sessionStats counts what the session actors did.
type sessionStats struct {
	opened, closed, closedInFlight, abandoned, lost, grants, probes atomic.Int64
}

// session is one session an actor holds.
type session struct {
	a   *actor
	id  string
	ttl time.Duration

	mu       sync.Mutex
	deadline time.Duration // the client's deadline: latest send time of an acknowledged open or keepalive, plus the TTL
	lost     string        // why the session counts as lost, if it does

	stop     chan struct{} // closed to stop the keepalives
	stopOnce sync.Once
	done     chan struct{} // closed when the keepalives have stopped
}

// sessLease is a lease held in a session.
type sessLease struct {
	res, rid, lease string
	token           uint64
}

// randBetween draws a duration in [lo, hi] from r.
func randBetween(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// fork returns a random source of its own for a goroutine of a.
func (a *actor) fork() *rand.Rand { return rand.New(rand.NewPCG(a.rng.Uint64(), a.rng.Uint64())) }

func (a *actor) runSession(ctx context.Context) {
	w := a.w
	for ctx.Err() == nil && w.next() {
		a.n++
		s := a.openSession(ctx, fmt.Sprintf("%s-s%d-%d", w.Prefix, a.id, a.n))
		if s == nil {
			sleepCtx(ctx, a.between(50*time.Millisecond, 300*time.Millisecond))
			continue
		}
		w.sessStats.opened.Add(1)
		a.useSession(ctx, s)
	}
}

// openSession opens a session, retrying with the same request id while
// the outcome is unknown, and starts its keepalives. It returns nil when
// no open was acknowledged (one that took effect unseen expires).
func (a *actor) openSession(ctx context.Context, rid string) *session {
	w := a.w
	ttl := a.between(w.MinSessionTTL, w.MaxSessionTTL).Round(time.Millisecond)
	retry := false
	if a.rng.Float64() < w.DropReply {
		a.c.OpenDropReply(rid, ttl)
		time.Sleep(a.between(10*time.Millisecond, 400*time.Millisecond))
		retry = true
	}
	backoff := 100 * time.Millisecond
	for attempt := 0; attempt < 4; attempt++ {
		op := a.c.OpenSession(rid, ttl, retry)
		switch op.Result {
		case OK:
			s := &session{a: a, id: op.Session, ttl: op.TTL, deadline: op.Deadline, stop: make(chan struct{}), done: make(chan struct{})}
			go s.keepAlive(a.fork())
			return s
		case Fail:
			return nil
		}
		retry = true
		if ctx.Err() != nil {
			break
		}
		time.Sleep(a.between(backoff/2, backoff))
		backoff *= 2
	}
	return nil
}

// keepAlive sends a keepalive about every third of the TTL, retrying one
// whose outcome is unknown quickly until the client's deadline; the
// session is lost at that deadline or on lease_lost.
func (s *session) keepAlive(rng *rand.Rand) {
	defer close(s.done)
	h := s.a.w.Hist
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(randBetween(rng, s.ttl/4, s.ttl/3)):
		}
		for {
			if d := s.clientDeadline(); h.Now() >= d {
				s.markLost("deadline passed without a keepalive")
				return
			}
			op := s.a.c.Keepalive(s.id)
			if op.Result == OK {
				s.extend(op.Deadline)
				break
			}
			if op.Result == Fail {
				s.markLost("keepalive answered " + op.Code)
				return
			}
			select {
			case <-s.stop:
				return
			case <-time.After(randBetween(rng, 50*time.Millisecond, 150*time.Millisecond)):
			}
		}
	}
}

func (s *session) clientDeadline() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

func (s *session) extend(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost == "" && d > s.deadline {
		s.deadline = d
	}
}

func (s *session) markLost(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost == "" {
		s.lost = why
		s.a.w.sessStats.lost.Add(1)
	}
}

// valid reports whether the client may still count on the session for
// margin more.
func (s *session) valid(margin time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lost == "" && s.a.w.Hist.Now() < s.deadline-margin
}

// stopKeepalives stops the keepalives and waits until none is in flight.
func (s *session) stopKeepalives() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
}

// acquire makes one logical acquire in s: its first reply maybe dropped,
// retried with the same request id while the outcome is unknown and the
// session is not lost, and cancelled if it stays unknown.
func (s *session) acquire(rng *rand.Rand, res, rid string, wait time.Duration) (Op, bool) {
	c, w := s.a.c, s.a.w
	retry := false
	if rng.Float64() < w.DropReply {
		c.AcquireInDropReply(res, rid, s.id)
		time.Sleep(randBetween(rng, 10*time.Millisecond, 400*time.Millisecond))
		retry = true
	}
	backoff := 100 * time.Millisecond
	for attempt := 0; attempt < 4 && s.valid(0); attempt++ {
		op := c.AcquireIn(res, rid, s.id, wait, retry)
		switch op.Result {
		case OK:
			return op, true
		case Fail:
			return op, false
		}
		retry = true
		time.Sleep(randBetween(rng, backoff/2, backoff))
		backoff *= 2
	}
	cancelRetry(c, rng, res, rid)
	return Op{}, false
}

// cancelRetry sends cancel until it is answered (at most 4 times).
func cancelRetry(c *Caller, rng *rand.Rand, res, rid string) Op {
	var op Op
	for attempt := 0; attempt < 4; attempt++ {
		if op = c.Cancel(res, rid); op.Result != Unknown {
			break
		}
		time.Sleep(randBetween(rng, 50*time.Millisecond, 200*time.Millisecond))
	}
	return op
}

// releaseRetry sends release until it is answered (at most 3 times).
func releaseRetry(c *Caller, rng *rand.Rand, res, lease string) Op {
	var op Op
	for attempt := 0; attempt < 3; attempt++ {
		if op = c.Release(res, lease); op.Result != Unknown {
			break
		}
		time.Sleep(randBetween(rng, 50*time.Millisecond, 200*time.Millisecond))
	}
	return op
}

// close closes s, retrying while the outcome is unknown (at most 4
// times), and reports whether a close was acknowledged.
func (s *session) close() bool {
	for attempt := 0; attempt < 4; attempt++ {
		if op := s.a.c.CloseSession(s.id); op.Result == OK {
			return true
		} else if op.Result == Fail {
			return false
		}
		time.Sleep(s.a.between(50*time.Millisecond, 200*time.Millisecond))
	}
	return false
}

// useSession acquires a few resources in s at once, holds what it got,
// and ends the session.
func (a *actor) useSession(ctx context.Context, s *session) {
	w, h := a.w, a.w.Hist
	defer s.stopKeepalives()

	n := 1 + a.rng.IntN(4)
	picked := map[string]bool{}
	results := make(chan sessLease, n)
	for i := 0; i < n; i++ {
		res := a.pick()
		if picked[res] {
			continue
		}
		picked[res] = true
		rid := fmt.Sprintf("%s-s%d-%d-%d", w.Prefix, a.id, a.n, i)
		var wait time.Duration
		if a.rng.Float64() < w.WaitShare*1.5 {
			wait = a.between(300*time.Millisecond, 2*time.Second)
		}
		rng := a.fork()
		go func() {
			op, ok := s.acquire(rng, res, rid, wait)
			if !ok {
				results <- sessLease{res: res, rid: rid}
				return
			}
			results <- sessLease{res: res, rid: rid, lease: op.LeaseID, token: op.Token}
		}()
	}
	collect := func() []sessLease {
		var held []sessLease
		for range picked {
			if l := <-results; l.lease != "" {
				held = append(held, l)
			}
		}
		w.sessStats.grants.Add(int64(len(held)))
		return held
	}

	// Sometimes the session is closed while its acquires are in flight.
	if a.rng.Float64() < 0.15 {
		sleepCtx(ctx, a.between(0, 300*time.Millisecond))
		closed := s.close()
		held := collect()
		if closed {
			w.sessStats.closedInFlight.Add(1)
			a.probeClosed(s, held)
		}
		a.lateWrites(held)
		return
	}

	held := a.holdSession(ctx, s, collect())
	var ended []sessLease
	switch p := a.rng.Float64(); {
	case p < 0.6:
		if s.close() {
			w.sessStats.closed.Add(1)
			a.probeClosed(s, held)
		}
	case p < 0.75:
		for _, l := range held {
			releaseRetry(a.c, a.rng, l.res, l.lease)
		}
		if s.close() {
			w.sessStats.closed.Add(1)
		}
	default:
		// No longer kept alive: the session expires. Its holder counts it
		// lost at its deadline and stops writing then; a keepalive sent
		// later may still find it, if the service has not ended it yet,
		// which the holder then closes.
		w.sessStats.abandoned.Add(1)
		s.stopKeepalives()
		for h.Now() < s.clientDeadline() {
			for _, l := range held {
				if s.valid(100*time.Millisecond) && a.rng.Float64() < 0.5 {
					w.Reg.Write(a.id, l.res, l.token, "session, no longer kept alive")
				}
			}
			time.Sleep(a.between(s.ttl/8, s.ttl/4))
		}
		time.Sleep(a.between(0, s.ttl))
		if a.rng.Float64() < 0.5 {
			w.sessStats.probes.Add(1)
			if a.c.Keepalive(s.id).Result == OK {
				s.close()
			}
		}
	}
	ended = append(ended, held...)
	a.lateWrites(ended)
}

// holdSession keeps the leases of s for a while: writes with each token
// while the session's client deadline has not passed, and releases or
// cancels some of them. It returns the leases still held.
func (a *actor) holdSession(ctx context.Context, s *session, held []sessLease) []sessLease {
	w, h := a.w, a.w.Hist
	until := h.Now() + a.between(0, 2*s.ttl)
	var ended []sessLease
	for ctx.Err() == nil && h.Now() < until && s.valid(0) && len(held) > 0 {
		for _, l := range held {
			if s.valid(100*time.Millisecond) && a.rng.Float64() < 0.8 {
				w.Reg.Write(a.id, l.res, l.token, "session")
			}
		}
		sleepCtx(ctx, min(a.between(s.ttl/4, s.ttl/3), max(0, until-h.Now())))
		if a.rng.Float64() < 0.25 {
			i := a.rng.IntN(len(held))
			l := held[i]
			if a.rng.Float64() < 0.8 {
				releaseRetry(a.c, a.rng, l.res, l.lease)
			} else {
				cancelRetry(a.c, a.rng, l.res, l.rid)
			}
			held = append(held[:i:i], held[i+1:]...)
			ended = append(ended, l)
		}
	}
	a.lateWrites(ended)
	return held
}

// probeClosed probes a session whose close was acknowledged: a keepalive
// and an acquire in it must be answered lease_lost, a release of one of
// its leases released:false, and a status read of one of its resources
// must not show that lease (the checker decides).
func (a *actor) probeClosed(s *session, held []sessLease) {
	if a.rng.Float64() < 0.3 {
		a.w.sessStats.probes.Add(1)
		a.c.Keepalive(s.id)
	}
	if a.rng.Float64() < 0.3 {
		a.w.sessStats.probes.Add(1)
		a.c.AcquireIn(a.pick(), fmt.Sprintf("%s-s%d-%d-probe", a.w.Prefix, a.id, a.n), s.id, 0, false)
	}
	if len(held) > 0 && a.rng.Float64() < 0.3 {
		a.w.sessStats.probes.Add(1)
		l := held[a.rng.IntN(len(held))]
		a.c.Release(l.res, l.lease)
	}
	if len(held) > 0 && a.rng.Float64() < 0.3 {
		a.w.sessStats.probes.Add(1)
		a.c.Status(held[a.rng.IntN(len(held))].res)
	}
}

// lateWrites writes once more, late, with the tokens of some ended
// leases.
func (a *actor) lateWrites(ended []sessLease) {
	w := a.w
	for _, l := range ended {
		if a.rng.Float64() >= w.StaleWrite {
			continue
		}
		w.wg.Add(1)
		delay := a.between(0, w.MaxSessionTTL)
		go func() {
			defer w.wg.Done()
			time.Sleep(delay)
			w.Reg.Write(a.id, l.res, l.token, "late write of an ended session lease")
		}()
	}
}
