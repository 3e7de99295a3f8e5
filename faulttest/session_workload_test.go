package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Session actors. Each opens a session (raw session.open, its reply
// sometimes dropped and the open retried with the same request id), keeps
// it alive at about a third of its TTL from a goroutine of its own, and
// acquires several things in it at once (some waiting in the queue): hot
// and cold resources shared with the other actors, now and then a lock
// set of 2 to 4 resources (out of the set actors' pool, or of the hot and
// cold ones) and a permit of a semaphore (the semaphore actors' own, of
// the same limit). It writes through the fenced register with each
// lease's token (each resource of a set with its own, a permit on its key
// "<sem>#<k>") while its own deadline for the session has not passed,
// releases or cancels some leases (a set whole, a permit by its number),
// and ends the session: by a close (sometimes while its acquires are
// still in flight), by releasing everything first, or by no longer keeping
// it alive and letting it expire. After an acknowledged close it sometimes
// probes the closed session (a keepalive, an acquire in it of a resource,
// a set or a permit, a release of one of its leases, a status read), all
// of which must find it ended; and it sometimes writes once more, late,
// with the tokens of leases that have ended. A client paused through its
// proxy past the TTL loses its session as a crashed one would.

// sessionStats counts what the session actors did.
type sessionStats struct {
	opened, closed, closedInFlight, abandoned, lost, grants, sets, permits, probes atomic.Int64
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

// sessLease is a lease held in a session, or what an acquire in the
// session asks for: one resource (res); a lock set (set, as named, with
// each resource's token in members once granted); or a permit of the
// semaphore res of limit permits (permit, once granted).
type sessLease struct {
	res, rid, lease string
	token           uint64
	set             []string
	members         []streams.SetMember
	limit, permit   int
}

// fenced returns the keys of the register that l's holder writes to, each
// with its token: the resource, each resource of a set, or the permit's
// key "<sem>#<k>".
func (l sessLease) fenced() []resToken {
	switch {
	case len(l.set) > 0:
		out := make([]resToken, 0, len(l.members))
		for _, m := range l.members {
			out = append(out, resToken{m.Resource, m.Token})
		}
		return out
	case l.limit > 0:
		return []resToken{{streams.PermitResource(l.res, l.permit), l.token}}
	}
	return []resToken{{l.res, l.token}}
}

// what names l's kind in the register's notes.
func (l sessLease) what() string {
	switch {
	case len(l.set) > 0:
		return "session set"
	case l.limit > 0:
		return "session permit"
	}
	return "session"
}

// write writes through the register with l's tokens, to each of its keys
// with probability p.
func (l sessLease) write(a *actor, p float64, note string) {
	for _, k := range l.fenced() {
		if a.rng.Float64() < p {
			a.w.Reg.Write(a.id, k.res, k.token, note)
		}
	}
}

// shuffledBy returns res in a random order drawn from rng.
func shuffledBy(rng *rand.Rand, res []string) []string {
	out := slices.Clone(res)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// release sends the release of l once: a set's names it whole (in a random
// order), a permit's names its permit.
func (l sessLease) release(c *Caller, rng *rand.Rand) Op {
	switch {
	case len(l.set) > 0:
		return c.ReleaseSet(shuffledBy(rng, l.set), l.lease)
	case l.limit > 0:
		return c.ReleasePermit(l.res, l.permit, l.lease)
	}
	return c.Release(l.res, l.lease)
}

// cancel sends the cancel of l's acquire once.
func (l sessLease) cancel(c *Caller, rng *rand.Rand) Op {
	switch {
	case len(l.set) > 0:
		return c.CancelSet(shuffledBy(rng, l.set), l.rid)
	case l.limit > 0:
		return c.CancelPermit(l.res, l.limit, l.rid)
	}
	return c.Cancel(l.res, l.rid)
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

// acquireOnce sends l's acquire in s once (a set named in a random
// order).
func (s *session) acquireOnce(rng *rand.Rand, l sessLease, wait time.Duration, retry bool) Op {
	c := s.a.c
	switch {
	case len(l.set) > 0:
		return c.AcquireSetIn(shuffledBy(rng, l.set), l.rid, s.id, wait, retry)
	case l.limit > 0:
		return c.AcquirePermitIn(l.res, l.limit, l.rid, s.id, wait, retry)
	}
	return c.AcquireIn(l.res, l.rid, s.id, wait, retry)
}

// acquireDropReply sends l's acquire in s with its reply dropped.
func (s *session) acquireDropReply(l sessLease) {
	c := s.a.c
	switch {
	case len(l.set) > 0:
		c.AcquireSetInDropReply(l.set, l.rid, s.id)
	case l.limit > 0:
		c.AcquirePermitInDropReply(l.res, l.limit, l.rid, s.id)
	default:
		c.AcquireInDropReply(l.res, l.rid, s.id)
	}
}

// acquire makes one logical acquire of l in s: its first reply maybe
// dropped, retried with the same request id while the outcome is unknown
// and the session is not lost, and cancelled if it stays unknown. It
// returns l with what the grant answered, and whether it was granted.
func (s *session) acquire(rng *rand.Rand, l sessLease, wait time.Duration) (sessLease, bool) {
	c, w := s.a.c, s.a.w
	retry := false
	if rng.Float64() < w.DropReply {
		s.acquireDropReply(l)
		time.Sleep(randBetween(rng, 10*time.Millisecond, 400*time.Millisecond))
		retry = true
	}
	backoff := 100 * time.Millisecond
	for attempt := 0; attempt < 4 && s.valid(0); attempt++ {
		op := s.acquireOnce(rng, l, wait, retry)
		switch op.Result {
		case OK:
			l.lease, l.token, l.members, l.permit = op.LeaseID, op.Token, op.Members, op.Permit
			return l, true
		case Fail:
			return l, false
		}
		retry = true
		time.Sleep(randBetween(rng, backoff/2, backoff))
		backoff *= 2
	}
	cancelRetry(c, rng, l)
	return l, false
}

// cancelRetry sends the cancel of l's acquire until it is answered (at
// most 4 times).
func cancelRetry(c *Caller, rng *rand.Rand, l sessLease) Op {
	var op Op
	for attempt := 0; attempt < 4; attempt++ {
		if op = l.cancel(c, rng); op.Result != Unknown {
			break
		}
		time.Sleep(randBetween(rng, 50*time.Millisecond, 200*time.Millisecond))
	}
	return op
}

// releaseRetry sends the release of l until it is answered (at most 3
// times).
func releaseRetry(c *Caller, rng *rand.Rand, l sessLease) Op {
	var op Op
	for attempt := 0; attempt < 3; attempt++ {
		if op = l.release(c, rng); op.Result != Unknown {
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

// pickSessionSet draws the 2 to 4 resources of a lock set for a session:
// half the time out of the set actors' pool, else out of the hot and cold
// resources that the other actors (and sessions) take one by one, mostly
// cold ones (a set of hot ones is hardly ever free).
func (a *actor) pickSessionSet() []string {
	w := a.w
	if a.rng.Float64() < 0.5 {
		return a.pickSet()
	}
	n := 2 + a.rng.IntN(3)
	seen := map[string]bool{}
	var out []string
	for tries := 0; len(out) < n && tries < 40; tries++ {
		res := fmt.Sprintf("%s/cold/%d", w.Prefix, a.rng.IntN(w.Cold))
		if a.rng.Float64() < 0.2 {
			res = fmt.Sprintf("%s/hot/%d", w.Prefix, a.rng.IntN(w.Hot))
		}
		if !seen[res] {
			seen[res] = true
			out = append(out, res)
		}
	}
	if len(out) < 2 {
		return a.pickSet()
	}
	return out
}

// pickSession draws what a session acquires: one to four leases, each
// one resource, or (SessionSets of them) a lock set, or (SessionPermits
// of them) a permit of a semaphore, the one the semaphore actors use, of
// the same limit. No resource is asked for twice in one session (a
// semaphore may be: a session may hold two of its permits).
func (a *actor) pickSession() []sessLease {
	w := a.w
	n := 1 + a.rng.IntN(4)
	picked := map[string]bool{}
	var out []sessLease
	for i := 0; i < n; i++ {
		l := sessLease{rid: fmt.Sprintf("%s-s%d-%d-%d", w.Prefix, a.id, a.n, i)}
		keys := []string{}
		switch p := a.rng.Float64(); {
		case p < w.SessionSets:
			l.set = a.pickSessionSet()
			keys = l.set
		case p < w.SessionSets+w.SessionPermits:
			l.res, l.limit = w.pickSem(a.rng)
		default:
			l.res = a.pick()
			keys = []string{l.res}
		}
		if slices.ContainsFunc(keys, func(k string) bool { return picked[k] }) {
			continue
		}
		for _, k := range keys {
			picked[k] = true
		}
		out = append(out, l)
	}
	return out
}

// startAcquires makes the acquires of picks in s at once (some waiting),
// each from a goroutine of its own, and returns the function that waits
// for all of them and returns what was granted.
func (a *actor) startAcquires(s *session, picks []sessLease) func() []sessLease {
	w := a.w
	results := make(chan sessLease, len(picks))
	for _, l := range picks {
		// Sets and permits wait more often, as their actors do: they are
		// seldom free at once.
		share := w.WaitShare * 1.5
		if len(l.set) > 0 || l.limit > 0 {
			share = 0.6
		}
		var wait time.Duration
		if a.rng.Float64() < share {
			wait = a.between(300*time.Millisecond, 2*time.Second)
		}
		rng := a.fork()
		go func() {
			got, ok := s.acquire(rng, l, wait)
			if !ok {
				got.lease = ""
			}
			results <- got
		}()
	}
	return func() []sessLease {
		var held []sessLease
		for range picks {
			l := <-results
			if l.lease == "" {
				continue
			}
			held = append(held, l)
			switch {
			case len(l.set) > 0:
				w.sessStats.sets.Add(1)
			case l.limit > 0:
				w.sessStats.permits.Add(1)
			}
		}
		w.sessStats.grants.Add(int64(len(held)))
		return held
	}
}

// useSession acquires a few resources, sets and permits in s at once,
// holds what it got, and ends the session.
func (a *actor) useSession(ctx context.Context, s *session) {
	w := a.w
	defer s.stopKeepalives()
	collect := a.startAcquires(s, a.pickSession())

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
	a.endSession(s, held)
	a.lateWrites(held)
}

// endSession ends s, whose leases held are still held: by a close (then
// sometimes probed), by releasing each first and closing, or by no longer
// keeping it alive.
func (a *actor) endSession(s *session, held []sessLease) {
	w, h := a.w, a.w.Hist
	switch p := a.rng.Float64(); {
	case p < 0.6:
		if s.close() {
			w.sessStats.closed.Add(1)
			a.probeClosed(s, held)
		}
	case p < 0.75:
		for _, l := range held {
			releaseRetry(a.c, a.rng, l)
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
				if s.valid(100 * time.Millisecond) {
					l.write(a, 0.5, l.what()+", no longer kept alive")
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
}

// holdSession keeps the leases of s for a while: writes with each token
// while the session's client deadline has not passed, and releases or
// cancels some of them. It returns the leases still held.
func (a *actor) holdSession(ctx context.Context, s *session, held []sessLease) []sessLease {
	h := a.w.Hist
	until := h.Now() + a.between(0, 2*s.ttl)
	var ended []sessLease
	for ctx.Err() == nil && h.Now() < until && s.valid(0) && len(held) > 0 {
		for _, l := range held {
			if s.valid(100 * time.Millisecond) {
				l.write(a, 0.8, l.what())
			}
		}
		sleepCtx(ctx, min(a.between(s.ttl/4, s.ttl/3), max(0, until-h.Now())))
		if a.rng.Float64() < 0.25 {
			i := a.rng.IntN(len(held))
			l := held[i]
			if a.rng.Float64() < 0.8 {
				releaseRetry(a.c, a.rng, l)
			} else {
				cancelRetry(a.c, a.rng, l)
			}
			held = append(held[:i:i], held[i+1:]...)
			ended = append(ended, l)
		}
	}
	a.lateWrites(ended)
	return held
}

// probeClosed probes a session whose close was acknowledged: a keepalive
// and an acquire in it (of a resource, a set or a permit) must be answered
// lease_lost, a release of one of its leases released:false, and a status
// read of one of its resources (or its semaphore) must not show that
// lease (the checker decides).
func (a *actor) probeClosed(s *session, held []sessLease) {
	w := a.w
	if a.rng.Float64() < 0.3 {
		w.sessStats.probes.Add(1)
		a.c.Keepalive(s.id)
	}
	if a.rng.Float64() < 0.3 {
		w.sessStats.probes.Add(1)
		probe := sessLease{rid: fmt.Sprintf("%s-s%d-%d-probe", w.Prefix, a.id, a.n)}
		switch a.rng.IntN(3) {
		case 0:
			probe.set = a.pickSessionSet()
		case 1:
			probe.res, probe.limit = w.pickSem(a.rng)
		default:
			probe.res = a.pick()
		}
		s.acquireOnce(a.rng, probe, 0, false)
	}
	if len(held) > 0 && a.rng.Float64() < 0.3 {
		w.sessStats.probes.Add(1)
		held[a.rng.IntN(len(held))].release(a.c, a.rng)
	}
	if len(held) > 0 && a.rng.Float64() < 0.3 {
		w.sessStats.probes.Add(1)
		switch l := held[a.rng.IntN(len(held))]; {
		case len(l.set) > 0:
			a.c.Status(l.set[a.rng.IntN(len(l.set))])
		case l.limit > 0:
			a.c.SemaphoreStatus(l.res, l.limit)
		default:
			a.c.Status(l.res)
		}
	}
}

// lateWrites writes once more, late, with the tokens of some ended
// leases (to every key of a set).
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
			for _, k := range l.fenced() {
				w.Reg.Write(a.id, k.res, k.token, "late write of an ended "+l.what()+" lease")
			}
		}()
	}
}
