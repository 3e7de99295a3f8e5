package service

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/jetlock/jetlock/streams"
)

// sessionGrants is a lone instance with one session open, its grants sent
// over the wire while the test holds the session's gate.
type sessionGrants struct {
	t          *testing.T
	s          *Service
	request    func(op string, body any) *nats.Msg // one request, as runInternal sends it
	id, hash   string
	gate       *keyLock
	wg         sync.WaitGroup
	mu         sync.Mutex
	answers    map[string]*nats.Msg // by request id
	batchesAt0 uint64               // batches of two or more before the test's
}

func newSessionGrants(t *testing.T) *sessionGrants {
	return newSessionGrantsWith(t, DefaultConfig())
}

func newSessionGrantsWith(t *testing.T, cfg Config) *sessionGrants {
	s, request := runInternal(t, cfg)
	sg := &sessionGrants{t: t, s: s, request: request, answers: map[string]*nats.Msg{}}
	var open streams.SessionResponse
	sg.decode(sg.request(streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: "open", Owner: "o", TTLms: 30_000}), &open)
	sg.id = open.SessionID
	var err error
	if sg.hash, _, err = streams.SplitSessionID(open.SessionID); err != nil {
		t.Fatal(err)
	}
	sg.batchesAt0, _ = sg.batches()
	return sg
}

func (sg *sessionGrants) decode(m *nats.Msg, v any) {
	sg.t.Helper()
	if code := m.Header.Get(streams.HeaderErrorCode); code != "" {
		sg.t.Fatalf("answered %s: %s", code, m.Data)
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		sg.t.Fatal(err)
	}
}

// holdGate takes the session's gate, as a commit of the session in
// flight does.
func (sg *sessionGrants) holdGate() {
	var err error
	if sg.gate, err = sg.s.locks.sessions.sessionGate(sg.t.Context(), sg.hash); err != nil {
		sg.t.Fatal(err)
	}
}

// acquire sends req in the session in the background.
func (sg *sessionGrants) acquire(req streams.AcquireRequest) {
	req.SessionID = sg.id
	sg.wg.Go(func() {
		data, _ := json.Marshal(req)
		m, err := sg.s.nc.Request(streams.Subject(streams.DefaultPrefix, streams.OpAcquire), data, 30*time.Second)
		if err != nil {
			sg.t.Errorf("acquire %s: %v", req.RequestID, err)
			return
		}
		sg.mu.Lock()
		sg.answers[req.RequestID] = m
		sg.mu.Unlock()
	})
}

// queueLocks holds the session's gate and sends n acquires of locks
// named prefix-0 to prefix-(n-1) (each its own request id), then waits
// until they all wait for the session's commit.
func (sg *sessionGrants) queueLocks(prefix string, n int) {
	sg.t.Helper()
	sg.holdGate()
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		sg.acquire(streams.AcquireRequest{Resource: name, RequestID: name, Owner: "o"})
	}
	sg.waitQueued(n)
}

// waitQueued waits until n grants wait for the session's commit.
func (sg *sessionGrants) waitQueued(n int) {
	sg.t.Helper()
	waitFor(sg.t, 20*time.Second, func() bool { return sg.queued() == n }, fmt.Sprintf("%d grants wait for the session's commit", n))
}

// queued returns the grants waiting to commit in the session.
func (sg *sessionGrants) queued() int {
	c := sg.s.locks.sessions.commits
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := c.groups[sg.hash]; g != nil {
		return len(g.queue)
	}
	return 0
}

// release lets the queued grants commit, and waits for every answer.
func (sg *sessionGrants) release() {
	sg.gate.unlock()
	sg.wg.Wait()
}

// batches returns how many batches of two or more grants committed, and
// the grants they carried.
func (sg *sessionGrants) batches() (count uint64, grants float64) {
	var m dto.Metric
	if err := sg.s.metrics.sessionBatch.Write(&m); err != nil {
		sg.t.Fatal(err)
	}
	return m.Histogram.GetSampleCount() - sg.batchesAt0, m.Histogram.GetSampleSum()
}

// conflicts returns the commits that lost a race so far.
func (sg *sessionGrants) conflicts() float64 {
	var m dto.Metric
	if err := sg.s.metrics.conflicts.Write(&m); err != nil {
		sg.t.Fatal(err)
	}
	return m.Counter.GetValue()
}

// grantCommits returns the commits of grants so far, failed ones too.
func (sg *sessionGrants) grantCommits() uint64 {
	var m dto.Metric
	h, err := sg.s.metrics.commitTime.GetMetricWithLabelValues("grant")
	if err != nil {
		sg.t.Fatal(err)
	}
	if err := h.(prometheus.Histogram).Write(&m); err != nil {
		sg.t.Fatal(err)
	}
	return m.Histogram.GetSampleCount()
}

// granted returns the token of request id's answer, failing the test if
// it was not a grant.
func (sg *sessionGrants) granted(id string) uint64 {
	sg.t.Helper()
	var r struct {
		Token  uint64                  `json:"token"`
		Leases []streams.LeaseResponse `json:"resources"`
	}
	sg.decode(sg.answers[id], &r)
	if r.Token == 0 && len(r.Leases) > 0 {
		r.Token = r.Leases[0].Token
	}
	if r.Token == 0 {
		sg.t.Fatalf("%s: no token in %s", id, sg.answers[id].Data)
	}
	return r.Token
}

// inBucket checks that resource's key holds a lease of the session, and
// returns what it holds.
func (sg *sessionGrants) inBucket(resource string) observation {
	sg.t.Helper()
	o, err := sg.s.locks.current(sg.t.Context(), streams.LeaseKey(resource), true)
	if err != nil {
		sg.t.Fatal(err)
	}
	if !o.held() || o.rec.Session != sg.hash {
		sg.t.Fatalf("%s: the bucket holds %+v, not a lease of the session", resource, o.entry)
	}
	return o
}

// The grants to one session that arrive while its gate is taken commit
// together, in one atomic batch with one check of the session: locks, a
// permit and a lock set alike, each answered with its own revision, each
// lease in the bucket.
func TestGrantsToOneSessionCommitTogether(t *testing.T) {
	sg := newSessionGrants(t)
	sg.holdGate()
	for i := range 5 {
		sg.acquire(streams.AcquireRequest{Resource: fmt.Sprintf("lock-%d", i), RequestID: fmt.Sprintf("lock-%d", i), Owner: "o"})
	}
	sg.acquire(streams.AcquireRequest{Resource: "sem", RequestID: "permit", Owner: "o", Limit: 3})
	sg.acquire(streams.AcquireRequest{Resources: []string{"set-a", "set-b"}, RequestID: "set", Owner: "o"})
	sg.waitQueued(7)
	sg.release()

	if n, sum := sg.batches(); n != 1 || sum != 7 {
		t.Fatalf("%d batches of two or more carried %v grants: want one batch of 7", n, sum)
	}
	tokens := map[uint64]string{}
	for _, id := range []string{"lock-0", "lock-1", "lock-2", "lock-3", "lock-4", "permit", "set"} {
		tok := sg.granted(id)
		if other, ok := tokens[tok]; ok {
			t.Fatalf("%s and %s were answered the same token %d", id, other, tok)
		}
		tokens[tok] = id
	}
	for i := range 5 {
		id := fmt.Sprintf("lock-%d", i)
		if o := sg.inBucket(id); o.rev != sg.granted(id) {
			t.Fatalf("%s was answered token %d, and its lease is at revision %d", id, sg.granted(id), o.rev)
		}
	}
	var set streams.SetLeaseResponse
	sg.decode(sg.answers["set"], &set)
	for _, l := range set.Resources {
		if o := sg.inBucket(l.Resource); o.rev != l.Token {
			t.Fatalf("%s of the set was answered token %d, and its lease is at revision %d", l.Resource, l.Token, o.rev)
		}
	}
	var closed streams.SessionCloseResponse
	sg.decode(sg.request(streams.OpSessionClose, streams.SessionCloseRequest{SessionID: sg.id}), &closed)
	if !closed.Closed {
		t.Fatalf("close: %+v", closed)
	}
	for _, res := range []string{"lock-0", "lock-4", "set-a", "set-b"} {
		if o, err := sg.s.locks.current(t.Context(), streams.LeaseKey(res), true); err != nil || o.held() {
			t.Fatalf("%s after the session's close: %+v %v", res, o.entry, err)
		}
	}
}

// A batch that fails on one member's compare-and-set writes nothing, and
// each member is then committed alone: the others are granted as they
// would have been alone, and the one whose key moved is decided again.
func TestAGroupedGrantThatLostItsKeyFailsAlone(t *testing.T) {
	sg := newSessionGrants(t)
	sg.queueLocks("r", 4)
	conflicts := sg.conflicts()
	// Another holder takes r-2 behind the instance's back, after its grant
	// was decided.
	now := time.Now()
	rival := newLease(now, "rival", "rival", "", time.Minute, now.Add(time.Hour))
	if _, _, err := sg.s.store.put(t.Context(), streams.LeaseKey("r-2"), rival, 0, ""); err != nil {
		t.Fatal(err)
	}
	sg.release()

	for _, id := range []string{"r-0", "r-1", "r-3"} {
		sg.granted(id)
		sg.inBucket(id)
	}
	if code := sg.answers["r-2"].Header.Get(streams.HeaderErrorCode); code == "" {
		t.Fatalf("r-2 answered %s, though another holder took it first", sg.answers["r-2"].Data)
	}
	if o, _ := sg.s.locks.current(t.Context(), streams.LeaseKey("r-2"), true); !o.held() || o.rec.Owner != "rival" {
		t.Fatalf("r-2 holds %+v: want the rival's lease", o.entry)
	}
	if n := sg.conflicts() - conflicts; n != 1 {
		t.Fatalf("%v grants lost a race: want only r-2's, the others committed alone after the batch failed", n)
	}
}

// A keepalive that lands while a session's grants wait fails their
// batch's check of the session: nothing of it is written, and each grant
// is decided again on the session's new revision and granted, without
// first failing alone (a fresh read shows the session moved on).
func TestGroupedGrantsAfterAKeepaliveAreDecidedAgain(t *testing.T) {
	sg := newSessionGrants(t)
	sg.queueLocks("k", 4)
	// A keepalive from another instance: the session's record rewritten
	// by compare-and-set, past this instance's gate.
	key := streams.SessionKey(sg.hash)
	o, err := sg.s.locks.current(t.Context(), key, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := sg.s.locks.sessions.extend(ctx, "", key, o, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	commits := sg.grantCommits()
	sg.release()

	for i := range 4 {
		id := fmt.Sprintf("k-%d", i)
		sg.granted(id)
		sg.inBucket(id)
	}
	// The failed batch, then one to four batches of the grants decided
	// again; committed alone first, the four would have failed four more.
	if n := sg.grantCommits() - commits; n < 2 || n > 5 {
		t.Fatalf("%d commits of grants: want the failed batch and at most four more", n)
	}
}

// One session's grants waiting on an instance are bounded: beyond
// four times MaxPerKey, a grant is answered unavailable at once, and the
// waiting ones are all granted.
func TestASessionsWaitingGrantsAreBounded(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxPerKey = 10
	sg := newSessionGrantsWith(t, cfg)
	const bound = 40
	sg.queueLocks("q", bound)
	m := sg.request(streams.OpAcquire, streams.AcquireRequest{Resource: "one-more", RequestID: "one-more", Owner: "o", SessionID: sg.id})
	if code := m.Header.Get(streams.HeaderErrorCode); code != strconv.Itoa(streams.StatusCode(streams.CodeUnavailable)) {
		t.Fatalf("a grant beyond the bound answered %q %s: want unavailable", code, m.Data)
	}
	sg.release()
	for i := range bound {
		sg.granted(fmt.Sprintf("q-%d", i))
	}
	if o, _ := sg.s.locks.current(t.Context(), streams.LeaseKey("one-more"), true); o.rev != 0 {
		t.Fatalf("the refused grant wrote %+v", o.entry)
	}
}

// Many grants to two sessions at once, some racing for the same keys and
// some whose callers give up within milliseconds: every call returns, the
// groups empty, and every answer is the bucket's: a grant answered
// committed holds its key at the revision it was given, at most one per
// key, and a grant answered a conflict or a duplicate wrote nothing.
func TestGroupedCommitsUnderRacingAndImpatientCallers(t *testing.T) {
	sg := newSessionGrants(t)
	s := sg.s
	var hashes []string
	for i := range 2 {
		var open streams.SessionResponse
		sg.decode(sg.request(streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: fmt.Sprintf("race-%d", i), Owner: "o", TTLms: 60_000}), &open)
		hash, _, err := streams.SplitSessionID(open.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, hash)
	}
	type result struct {
		key, id string
		revs    []uint64
		dup     bool
		err     error
	}
	const grants = 240
	results := make([]result, grants)
	var wg sync.WaitGroup
	for i := range grants {
		hash := hashes[i%2]
		o, err := s.locks.current(t.Context(), streams.SessionKey(hash), true)
		if err != nil {
			t.Fatal(err)
		}
		key := streams.LeaseKey(fmt.Sprintf("race-%d", i%60)) // four grants race for each key
		id := fmt.Sprintf("g-%d", i)
		now := time.Now()
		rec := newLease(now, id, "o", "", time.Minute, now.Add(time.Hour))
		sessionLease(rec, now, hash, now.Add(time.Hour))
		ws := leaseWrites(key, rec, 0, grantMsgID(requestHash(key, id, "")), check{key: streams.SessionKey(hash), rev: o.rev})
		wait := time.Duration(i%7) * 3 * time.Millisecond // 0 to 18 ms; 0: no deadline but the test's
		wg.Go(func() {
			ctx := t.Context()
			if wait > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, wait)
				defer cancel()
			}
			revs, dup, err := s.locks.sessions.commits.commit(ctx, "grant", hash, ws)
			results[i] = result{key: key, id: id, revs: revs, dup: dup, err: err}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("grouped commits did not all return in 60s")
	}
	c := s.locks.sessions.commits
	c.mu.Lock()
	left := len(c.groups)
	c.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d groups left after every commit returned", left)
	}
	won := map[string]result{}
	for _, r := range results {
		o, err := s.locks.current(t.Context(), r.key, true)
		if err != nil {
			t.Fatal(err)
		}
		holds := o.held() && o.rec.RequestID == r.id
		switch {
		case r.err == nil && !r.dup:
			if w, ok := won[r.key]; ok {
				t.Fatalf("%s and %s were both answered committed at %s", w.id, r.id, r.key)
			}
			won[r.key] = r
			if !holds || o.rev != r.revs[0] {
				t.Fatalf("%s was answered committed at revision %d of %s, which holds %+v", r.id, r.revs[0], r.key, o.entry)
			}
		case holds && (r.dup || isConflict(r.err)):
			t.Fatalf("%s was answered %v (dup %v), and %s holds its lease", r.id, r.err, r.dup, r.key)
		}
		// A grant answered unavailable (its caller gave up) may have
		// committed: its outcome is unknown, as any write's whose reply
		// came too late, and its retry finds it by its message id.
	}
	if len(won) == 0 {
		t.Fatal("no grant committed")
	}
	t.Logf("%d of %d keys granted; batches of two or more: %v", len(won), 60, func() uint64 { n, _ := sg.batches(); return n }())
}
