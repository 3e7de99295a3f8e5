package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Group commit of the grants to one session.
//
// Every grant to a session commits with the check that the session's
// record is still at the revision read (leaseWrites), and JetStream
// refuses a check of a key while another check of it is being proposed.
// Committed one at a time, a session's grants would be bounded by one
// commit's round trip, and its keepalives, which rewrite the record, would
// wait behind them until the session expired under its own load. So the
// grants to one session that arrive while one of its commits is in flight
// wait, and the next commit writes all of them in one atomic batch with a
// single check of the record: as many grants per round trip as arrived
// during the last one.
//
// A batch commits whole or not at all, so a combined batch commits
// exactly when each of its members would have committed alone at that
// point of the stream: every member's compare-and-set holds and the
// session is at the revision they all read. Members are therefore grouped
// only when they read the same revision of the record and write disjoint
// keys. When a combined batch fails on a conflict or on a message id seen
// before, nothing of it was written, and each member is then committed
// alone, so that each one's answer is the one it would have had alone.

// groupMaxMembers and groupMaxWrites bound one combined batch: well under
// JetStream's largest atomic batch (1,000 messages), so that one batch is
// one short commit, and the alone commits after a failed batch are few.
const (
	groupMaxMembers = 64
	groupMaxWrites  = 256
)

// sessionCommits groups the commits of each session's grants. The commit
// of a group runs through the session's gate (sessionGate), so that a
// keepalive or an end of the session waits at most for one batch.
//
// At most maxQueued grants of one session wait on the instance, so that
// one session's flood holds a bounded number of the in-flight places:
// four times MaxPerKey, the bound of one key's, since a session's grants
// leave its queue a batch at a time. Beyond, a grant is answered
// unavailable at once.
type sessionCommits struct {
	maxQueued int
	store     *store
	gate      func(ctx context.Context, hash string) (*keyLock, error)
	report    *reporter

	mu     sync.Mutex
	groups map[string]*commitGroup // by session hash, while one commits
}

// commitGroup is the commits of one session waiting for the next batch.
// The member at the head of queue leads the next batch; the others wait.
type commitGroup struct {
	queue []*groupMember
}

// groupMember is one grant's writes, waiting to be committed.
type groupMember struct {
	op       string
	ws       []write
	check    int       // the index in ws of the session's check
	deadline time.Time // the caller's: a batch lasts until its latest member's
	keys     []string  // the keys ws writes

	// Guarded by sessionCommits.mu; wake is sent to once the member is
	// committed, or when it is to lead the next batch (lead).
	wake  chan struct{}
	lead  bool
	taken bool // in a batch being committed

	revs []uint64
	dup  bool
	err  error
}

func newSessionCommits(maxPerKey int, s *store, gate func(context.Context, string) (*keyLock, error), report *reporter) *sessionCommits {
	return &sessionCommits{maxQueued: 4 * maxPerKey, store: s, gate: gate, report: report, groups: map[string]*commitGroup{}}
}

// commit commits ws, a grant's writes that include one check of session
// hash's record, as commitWrites would alone (the same revisions, dup and
// error), in a batch with the other grants to the session waiting then.
func (c *sessionCommits) commit(ctx context.Context, op, hash string, ws []write) ([]uint64, bool, error) {
	m := &groupMember{op: op, ws: ws, check: -1, wake: make(chan struct{}, 1)}
	skey := streams.SessionKey(hash)
	for i, w := range ws {
		if w.check && w.key == skey {
			m.check = i
		} else {
			m.keys = append(m.keys, w.key)
		}
	}
	if m.check < 0 {
		return nil, false, errors.New("internal: a session's grant without its session's check")
	}
	m.deadline, _ = ctx.Deadline()
	c.mu.Lock()
	g := c.groups[hash]
	switch {
	case g == nil:
		g = &commitGroup{}
		c.groups[hash] = g
		m.lead = true
	case len(g.queue) >= c.maxQueued:
		c.mu.Unlock()
		return nil, false, fmt.Errorf("%w: %w: %d grants to the session already wait for its commit; retry with backoff", errUnavailable, errBusy, c.maxQueued)
	}
	g.queue = append(g.queue, m)
	lead := m.lead
	c.mu.Unlock()
	if !lead {
		var ok bool
		if lead, ok = c.await(ctx, g, m); !ok {
			return nil, false, classify(ctx.Err())
		}
	}
	if lead {
		c.lead(ctx, hash, g, m)
	}
	return m.revs, m.dup, m.err
}

// await waits until m is committed, or is to lead (lead). It returns
// ok=false when ctx ended before m was taken into a batch: m is then out
// of the queue, and nothing of it is written.
func (c *sessionCommits) await(ctx context.Context, g *commitGroup, m *groupMember) (lead, ok bool) {
	select {
	case <-m.wake:
	case <-ctx.Done():
		c.mu.Lock()
		if !m.taken && !m.lead {
			g.queue = slices.DeleteFunc(g.queue, func(q *groupMember) bool { return q == m })
			c.mu.Unlock()
			return false, false
		}
		c.mu.Unlock()
		<-m.wake // the batch that took m ends by m's deadline; or m leads
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return m.lead, true
}

// lead commits the next batch of session hash's group g, led by m (the
// head of its queue): it takes the session's gate, then every waiting
// member that may join m's batch, commits them, and hands the lead to the
// head of what is still waiting.
func (c *sessionCommits) lead(ctx context.Context, hash string, g *commitGroup, m *groupMember) {
	gate, err := c.gate(ctx, hash)
	c.mu.Lock()
	var batch []*groupMember
	if err != nil {
		g.queue = g.queue[1:]
		m.err = err
	} else {
		batch = c.take(g)
	}
	c.mu.Unlock()
	if err == nil {
		latest := m.deadline
		for _, b := range batch {
			if latest.IsZero() || b.deadline.IsZero() {
				latest = time.Time{} // a member without a deadline: the leader's context
				break
			}
			if b.deadline.After(latest) {
				latest = b.deadline
			}
		}
		bctx, cancel := ctx, context.CancelFunc(func() {})
		if !latest.IsZero() {
			bctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), latest)
		}
		c.commitBatch(bctx, batch)
		cancel()
		gate.unlock()
	}
	c.mu.Lock()
	for _, b := range batch {
		if b != m {
			b.wake <- struct{}{}
		}
	}
	if len(g.queue) > 0 {
		next := g.queue[0]
		next.lead = true
		next.wake <- struct{}{}
	} else {
		delete(c.groups, hash)
	}
	c.mu.Unlock()
}

// take removes from g's queue the members of the next batch: its head,
// and those after it that read the session at the same revision and
// write none of the keys taken so far, within the batch's bounds.
// c.mu is held.
func (c *sessionCommits) take(g *commitGroup) []*groupMember {
	head := g.queue[0]
	rev := head.ws[head.check].expect
	batch := []*groupMember{head}
	writes := len(head.keys)
	taken := make(map[string]bool, len(head.keys))
	for _, k := range head.keys {
		taken[k] = true
	}
	head.taken = true
	rest := g.queue[:0]
	for _, q := range g.queue[1:] {
		if len(batch) < groupMaxMembers && writes+len(q.keys) < groupMaxWrites &&
			q.ws[q.check].expect == rev && !takenAny(taken, q.keys) {
			for _, k := range q.keys {
				taken[k] = true
			}
			writes += len(q.keys)
			q.taken = true
			batch = append(batch, q)
			continue
		}
		rest = append(rest, q)
	}
	clear(g.queue[len(rest):])
	g.queue = rest
	return batch
}

func takenAny(taken map[string]bool, keys []string) bool {
	for _, k := range keys {
		if taken[k] {
			return true
		}
	}
	return false
}

// commitBatch commits the members of batch: one alone as commitWrites
// would, several in one atomic batch with a single check of the session.
// If that batch fails on a conflict (not one with a write still in
// flight, which each would meet alone too) or on a message id seen
// before, nothing was written, and each member is committed alone;
// unless a fresh read finds that the session's record has moved on (a
// keepalive elsewhere), when every member's check would fail alone too:
// each is answered the conflict, and decides again.
func (c *sessionCommits) commitBatch(ctx context.Context, batch []*groupMember) {
	if len(batch) == 1 {
		m := batch[0]
		m.revs, m.dup, m.err = c.store.commitWrites(ctx, m.op, m.ws)
		return
	}
	var ws []write
	for _, m := range batch {
		for i, w := range m.ws {
			if i != m.check {
				ws = append(ws, w)
			}
		}
	}
	head := batch[0]
	ws = append(ws, head.ws[head.check])
	revs, dup, err := c.store.commitWrites(ctx, head.op, ws)
	if dup || (isConflict(err) && !errors.Is(err, errInFlight) && !c.moved(ctx, head.ws[head.check])) {
		for _, m := range batch {
			m.revs, m.dup, m.err = c.store.commitWrites(ctx, m.op, m.ws)
		}
		return
	}
	if err == nil {
		c.report.sessionBatch(len(batch))
	}
	at := 0
	for _, m := range batch {
		m.err = err
		if err != nil {
			continue
		}
		m.revs = make([]uint64, len(m.ws))
		for i := range m.ws {
			if i == m.check {
				m.revs[i] = revs[len(revs)-1]
				continue
			}
			m.revs[i] = revs[at]
			at++
		}
	}
}

// moved reports whether a fresh read finds the key of check w at another
// revision than w's. A revision once left never comes back, so a check of
// it can no longer commit.
func (c *sessionCommits) moved(ctx context.Context, w write) bool {
	e, err := c.store.read(ctx, w.key)
	return err == nil && e.rev != w.expect
}
