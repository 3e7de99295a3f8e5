package service

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// twoFollowing starts a cluster and two instances that follow the bucket
// (each hears the other), so that releases in sessions are judged in
// stream order.
func twoFollowing(t *testing.T) (a, b *Service, cl *devcluster.Cluster) {
	t.Helper()
	cl = startCluster(t)
	a, _ = startInstance(t, cl, DefaultConfig(), 0)
	b, _ = startInstance(t, cl, DefaultConfig(), 0)
	waitFor(t, 30*time.Second, func() bool { return a.locks.sessions.inStreamOrder() && b.locks.sessions.inStreamOrder() },
		"both instances follow the bucket with a synced watcher")
	return a, b, cl
}

// following starts an instance that follows the bucket throughout (alone,
// it lingers for ten minutes), once it judges releases in sessions in
// stream order.
func following(t *testing.T, cl *devcluster.Cluster) *Service {
	t.Helper()
	s, _ := startInstance(t, cl, DefaultConfig(), 10*time.Minute)
	waitFor(t, 30*time.Second, s.locks.sessions.inStreamOrder, "the instance follows the bucket")
	return s
}

// openIn opens a session through s and returns a request to acquire res
// in it.
func openIn(t *testing.T, s *Service, requestID, res string) *grantReq {
	t.Helper()
	resp, err := s.locks.sessions.openSession(t.Context(), newSessionReq(requestID, "owner", 30*time.Second, origin{}))
	if err != nil {
		t.Fatal(err)
	}
	hash, secret, err := streams.SplitSessionID(resp.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	return &grantReq{resource: res, requestID: "r-" + res, owner: "owner", key: streams.LeaseKey(res),
		hash: requestHash(res, "r-"+res, ""), ttl: 30 * time.Second, session: hash, secret: secret}
}

// grantIn grants g, a request in a live session, through s's decision on
// fresh reads, and returns the lease and the session as it was read.
func grantIn(ctx context.Context, t *testing.T, s *Service, g *grantReq) (*streams.LeaseResponse, observation) {
	t.Helper()
	sess, err := s.locks.sessions.session(ctx, g, true)
	if err != nil {
		t.Fatal(err)
	}
	free, err := s.locks.current(ctx, g.key, true)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := s.locks.leases.grant(ctx, g, free, sess)
	if err != nil || lease.Token == 0 {
		t.Fatalf("grant in a live session: %v %v", lease, err)
	}
	return lease, sess
}

// connectAs connects to cl as a user of role, until the test ends.
func connectAs(t *testing.T, cl *devcluster.Cluster, role devcluster.Role) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(cl.URLs(), cl.ConnectOptions(role)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// storeBucket returns the lock bucket as the store user reaches it.
func storeBucket(t *testing.T, cl *devcluster.Cluster) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(connectAs(t, cl, devcluster.Store))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), streams.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// lastWrite returns the revision of the last write at key and, when it
// is a delete, the end mark it carries.
func lastWrite(t *testing.T, cl *devcluster.Cluster, key string) (uint64, *streams.EndMark) {
	t.Helper()
	js, err := jetstream.New(connectAs(t, cl, devcluster.Store))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(t.Context(), streams.StreamName(streams.DefaultBucket))
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(t.Context(), "$KV."+streams.DefaultBucket+"."+key)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get("KV-Operation") == "" {
		return m.Sequence, nil
	}
	return m.Sequence, streams.DecodeEndMark(m.Data)
}

// A grant to a session is never written after the session's end, on
// instances that follow the bucket as on a lone one: its commit checks the
// session's record at the revision read. The race is played
// deterministically: the grant is decided on a view of the session taken
// before its close, and written after it, as when an acquire and a close
// of the same session are served by two instances at once. The write is
// refused (a conflict; the decision on fresh reads then answers
// lease_lost) and the key is never written. A grant decided and written
// before the end counts, and the close ends it.
func TestAGrantAfterItsSessionEndedIsNeverWritten(t *testing.T) {
	a, b, _ := twoFollowing(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	before := openIn(t, a, "counted", "order/before")
	grantIn(ctx, t, a, before)
	if _, err := b.locks.sessions.closeSession(ctx, before.session+before.secret, origin{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { o, _ := b.locks.current(ctx, before.key, true); return !o.held() },
		"the grant made before the close is ended by it")

	late := openIn(t, a, "late", "order/after")
	sess, err := a.locks.sessions.session(ctx, late, true) // the session as the acquire saw it: live
	if err != nil {
		t.Fatal(err)
	}
	free, err := a.locks.current(ctx, late.key, true)
	if err != nil {
		t.Fatal(err)
	}
	closed, err := b.locks.sessions.closeSession(ctx, late.session+late.secret, origin{})
	if err != nil || !closed.Closed {
		t.Fatalf("close: %+v %v", closed, err)
	}
	if resp, err := a.locks.leases.grant(ctx, late, free, sess); !isConflict(err) || resp != nil {
		t.Fatalf("a grant written after its session's close answered %+v, %v; want a conflict", resp, err)
	}
	if e, err := a.locks.store.read(ctx, late.key); err != nil || e.rev != 0 {
		t.Fatalf("the grant refused by its session's check wrote %s at %d (%v)", late.key, e.rev, err)
	}
	if resp, err := a.locks.leases.acquire(ctx, late); !isCode(err, streams.CodeLeaseLost) || resp != nil {
		t.Fatalf("the acquire decided again: %+v, %v; want lease_lost", resp, err)
	}
}

// An orphan that its instance died before ending (written here behind
// every instance's back, after its session's close) is ended by the
// instances that follow the bucket, long before its hold limit: a lease of
// an ended session counts as ended wherever it is seen.
func TestAnOrphanIsEndedOnSight(t *testing.T) {
	a, b, cl := twoFollowing(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := openIn(t, a, "dies", "order/died")
	if _, err := a.locks.sessions.closeSession(ctx, g.session+g.secret, origin{}); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rec := newLease(now, g.requestID, g.owner, "", time.Hour, time.Time{})
	sessionLease(rec, now, g.session, time.Time{})
	if _, err := storeBucket(t, cl).Create(ctx, g.key, rec.AppendJSON(nil)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() bool {
		o, _ := b.locks.current(ctx, g.key, true)
		return !o.held()
	}, "the orphan written after its session's close is ended")
	// And a retry of the request that would have held it is not told it
	// does: its session has ended.
	if _, err := a.locks.sessions.session(ctx, g, true); !isCode(err, streams.CodeLeaseLost) {
		t.Fatalf("the ended session as a retry sees it: %v", err)
	}
}

// A release of a lease of a session that this instance does not know (it
// restarted, or forgot the session after a write of unknown outcome), and
// that ended meanwhile, is answered as for any lease that has ended,
// released:false, on a fresh read of the session's record, and the lease
// is ended with its session.
func TestAReleaseInASessionEndedUnseenIsNotReleasedAgain(t *testing.T) {
	cl := startCluster(t)
	s, _ := startInstance(t, cl, DefaultConfig(), 200*time.Millisecond)
	waitFor(t, 30*time.Second, func() bool { return !s.Following() }, "the lone instance stops following")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := openIn(t, s, "unseen", "order/unseen")
	lease, _ := grantIn(ctx, t, s, g)
	if err := storeBucket(t, cl).Delete(ctx, streams.SessionKey(g.session)); err != nil {
		t.Fatal(err)
	}
	s.tracker.forget(streams.SessionKey(g.session))
	resp, err := s.locks.leases.release(ctx, g.resource, lease.LeaseID, origin{})
	if err != nil || resp.Released {
		t.Fatalf("release of a lease whose session ended: %+v %v; want released:false", resp, err)
	}
	if o, _ := s.locks.current(ctx, g.key, true); o.held() {
		t.Fatalf("the lease of the ended session is still held: %+v", o.rec)
	}
}

// A release of a lease of a session counts, like a grant, only if the
// session had not ended before it in the stream: an instance whose view
// of the session lags (here its tracker is set back to the live session
// after its watcher delivered the end) ends the lease it is asked to, and
// answers released:false, as for a lease that had ended with its session.
func TestAReleaseAfterItsSessionEndedIsNotAReleaseInStreamOrder(t *testing.T) {
	cl := startCluster(t)
	s := following(t, cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := openIn(t, s, "lagging", "order/lagging")
	lease, sess := grantIn(ctx, t, s, g)
	endBehindItsBack(ctx, t, s, cl, g.session, &sess)
	resp, err := s.locks.leases.release(ctx, g.resource, lease.LeaseID, origin{})
	if err != nil || resp.Released {
		t.Fatalf("release after the session's end: %+v %v; want released:false", resp, err)
	}
	if _, mark := lastWrite(t, cl, g.key); mark == nil || mark.Why != string(endRelease) {
		t.Fatalf("the lease's end: %+v; want this release's (the check is of the release's own write)", mark)
	}
}

// setIn grants the set of resources to a request in g's session (g from
// openIn), through s's decision on fresh reads.
func setIn(ctx context.Context, t *testing.T, s *Service, g *grantReq, resources ...string) *streams.SetLeaseResponse {
	t.Helper()
	r := newSetReq(resources, "set-"+g.requestID, g.owner, origin{})
	r.ttl, r.session, r.secret = 30*time.Second, g.session, g.secret
	resp, err := s.locks.sets.acquireSet(ctx, r)
	if err != nil || resp.LeaseID == "" {
		t.Fatalf("set in a live session: %+v %v", resp, err)
	}
	return resp
}

// The same for a lock set held in a session (found by the soak: a set's
// release answered released:true just after its session's close had been
// answered): by stream order on an instance that follows the bucket, and
// on a fresh read of the session on one that does not know it.
func TestASetReleaseAfterItsSessionEndedIsNotARelease(t *testing.T) {
	cl := startCluster(t)
	s := following(t, cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, lagging := range []bool{true, false} {
		name := map[bool]string{true: "lagging", false: "unseen"}[lagging]
		g := openIn(t, s, "set-"+name, "order/set-"+name+"/a")
		sess, err := s.locks.sessions.session(ctx, g, true)
		if err != nil {
			t.Fatal(err)
		}
		resources := []string{"order/set-" + name + "/a", "order/set-" + name + "/b"}
		set := setIn(ctx, t, s, g, resources...)
		view := &sess
		if !lagging {
			view = nil
		}
		endBehindItsBack(ctx, t, s, cl, g.session, view)
		resp, err := s.locks.sets.releaseSet(ctx, resources, set.LeaseID, origin{})
		if err != nil || resp.Released {
			t.Fatalf("%s: release of a set after its session's end: %+v %v; want released:false", name, resp, err)
		}
		for _, res := range resources {
			if o, _ := s.locks.current(ctx, streams.LeaseKey(res), true); o.held() {
				t.Fatalf("%s: %s of the ended session's set is still held: %+v", name, res, o.rec)
			}
		}
	}
}

// endBehindItsBack deletes session hash's record behind s's back, waits
// until s's watcher has delivered that, and sets s's tracker to know
// nothing of the session, or, given lagging, to that view of it.
func endBehindItsBack(ctx context.Context, t *testing.T, s *Service, cl *devcluster.Cluster, hash string, lagging *observation) {
	t.Helper()
	if err := storeBucket(t, cl).Delete(ctx, streams.SessionKey(hash)); err != nil {
		t.Fatal(err)
	}
	end, _ := lastWrite(t, cl, streams.SessionKey(hash))
	waitFor(t, 10*time.Second, func() bool { return s.locks.delivered() >= end }, "the watcher delivered the session's end")
	s.tracker.forget(streams.SessionKey(hash))
	if lagging != nil {
		s.tracker.observe(streams.SessionKey(hash), lagging.entry)
	}
}

// A due item of one key of a set of a session that has ended (an orphan
// the tracker made due without knowing the session) ends the set whole,
// never that key alone (found by the soak: "set-partial").
func TestADueKeyOfAnOrphanSetEndsTheSetWhole(t *testing.T) {
	cl := startCluster(t)
	s := following(t, cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := openIn(t, s, "due-set", "order/due-set/a")
	resources := []string{"order/due-set/a", "order/due-set/b"}
	setIn(ctx, t, s, g, resources...)
	endBehindItsBack(ctx, t, s, cl, g.session, nil)
	key := streams.LeaseKey(resources[0])
	o, ok := s.tracker.get(key)
	if !ok || !o.held() {
		t.Fatalf("the set's first key: %+v %v", o, ok)
	}
	s.locks.handover.expire(ctx, dueItem{key: key, rev: o.rev})
	for _, res := range resources {
		if cur, _ := s.locks.current(ctx, streams.LeaseKey(res), true); cur.held() {
			t.Fatalf("%s of the orphan set is still held after its key %s came due: %+v", res, key, cur.rec)
		}
	}
}

// A retry of an acquire in a session, answered from the lease its first
// attempt was granted, is answered held only if the lease is still
// current and its session still live, proven on the stream leader: found
// by the soak ("session-closed"), a retry sent after the session's close
// was told it held the lease the close had ended, on an instance that
// read it from old state. Played here by ending the session and its
// lease behind the instance's back and setting its view back: on a lone
// instance and on one that follows the bucket (the grant committed while
// its session lived: only the proof of now refuses it).
func TestARetryAfterItsSessionClosedIsNotHeld(t *testing.T) {
	cl := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	retry := func(name string, s *Service) {
		kv := storeBucket(t, cl)
		g := openIn(t, s, "retry-"+name, "order/retry-"+name)
		lease, sess := grantIn(ctx, t, s, g)
		held, _ := s.locks.tracker.get(g.key)
		if err := kv.Delete(ctx, g.key, jetstream.LastRevision(lease.Token)); err != nil {
			t.Fatal(err)
		}
		if err := kv.Delete(ctx, streams.SessionKey(g.session)); err != nil {
			t.Fatal(err)
		}
		end, _ := lastWrite(t, cl, streams.SessionKey(g.session))
		if s.locks.sessions.inStreamOrder() {
			waitFor(t, 10*time.Second, func() bool { return s.locks.delivered() >= end }, "the watcher delivered the session's end")
		}
		s.tracker.observe(g.key, held.entry) // the view of a node behind
		s.tracker.observe(streams.SessionKey(g.session), sess.entry)
		resp, err := s.locks.leases.acquire(ctx, g)
		if !isCode(err, streams.CodeLeaseLost) || resp != nil {
			t.Fatalf("%s: a retry after its session ended answered %+v, %v; want lease_lost", name, resp, err)
		}
		if o, _ := s.locks.current(ctx, g.key, true); o.held() {
			t.Fatalf("%s: the retry left a lease of the ended session: %+v", name, o.rec)
		}
	}
	lone, _ := startInstance(t, cl, DefaultConfig(), 200*time.Millisecond)
	waitFor(t, 30*time.Second, func() bool { return !lone.Following() }, "the lone instance stops following")
	retry("lone", lone)
	ordered := following(t, cl)
	retry("ordered", ordered)
}

// A release of a lease of a session, on an instance that follows the
// bucket, counts only if the session had not ended before it in the
// stream, judged at the release's own revision (liveInStream): a session
// that the watcher's deliveries do not show live (the soak found a live
// session missing there) is live once a fresh, proven read of its record
// shows it so; a session that ended after the revision was live there,
// and one that ended before it was not, decided on the deliveries alone
// when they show that end.
func TestAReleaseIsJudgedAtItsOwnRevision(t *testing.T) {
	a, b, cl := twoFollowing(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	missed := openIn(t, a, "missed", "order/missed")
	opened, _ := lastWrite(t, cl, streams.SessionKey(missed.session))
	waitFor(t, 10*time.Second, func() bool { return a.locks.delivered() >= opened }, "the watcher delivered the session's open")
	a.follow.deliveries.mu.Lock()
	delete(a.follow.deliveries.sessions, missed.session)
	a.follow.deliveries.mu.Unlock()
	if err := a.locks.sessions.liveInStream(ctx, opened, missed.session); err != nil {
		t.Fatalf("a live session missing from the deliveries: %v; want it live", err)
	}

	later := openIn(t, a, "ended-later", "order/ended-later")
	live, _ := lastWrite(t, cl, streams.SessionKey(later.session))
	if _, err := b.locks.sessions.closeSession(ctx, later.session+later.secret, origin{}); err != nil {
		t.Fatal(err)
	}
	end, _ := lastWrite(t, cl, streams.SessionKey(later.session))
	after, _, err := a.locks.store.put(ctx, streams.LeaseKey("order/after-the-end"), newLease(time.Now(), "x", "o", "", time.Minute, time.Time{}), 0, "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return a.locks.delivered() >= after }, "the watcher delivered the session's end and a write after it")
	if err := a.locks.sessions.liveInStream(ctx, live, later.session); err != nil {
		t.Fatalf("at %d, a session ended at %d: %v; want it live there", live, end, err)
	}
	if err := a.locks.sessions.liveInStream(ctx, after, later.session); !isCode(err, streams.CodeLeaseLost) {
		t.Fatalf("at %d, after its session's end at %d: %v; want lease_lost", after, end, err)
	}
	// Decided on the watcher's deliveries alone, with no read (a stream
	// leader cut off by a partition could answer one from old state): so
	// even a request whose context has ended gets its answer.
	gone, stop := context.WithCancel(ctx)
	stop()
	if err := a.locks.sessions.liveInStream(gone, after, later.session); !isCode(err, streams.CodeLeaseLost) {
		t.Fatalf("after its session's delivered end at %d, judged without a read: %v; want lease_lost", end, err)
	}
}

// A session's end never ends a set of it in part: an instance that does
// not know every key of the set (it forgot one after a write of unknown
// outcome) ends none of them, and an instance that knows them all (the
// other one here, through its sweep) ends the set whole, every key in one
// atomic batch (found by the soak: "set-partial", two keys of three ended
// in one batch by the session's end and the third later).
func TestASessionEndNeverEndsASetInPart(t *testing.T) {
	a, b, cl := twoFollowing(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := openIn(t, a, "set-whole", "order/whole/a")
	resources := []string{"order/whole/a", "order/whole/b", "order/whole/c"}
	setIn(ctx, t, a, g, resources...)
	a.tracker.forget(streams.LeaseKey(resources[2]))
	if _, err := a.locks.sessions.closeSession(ctx, g.session+g.secret, origin{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() bool {
		for _, res := range resources {
			if o, _ := b.locks.current(ctx, streams.LeaseKey(res), true); o.held() { // b knows every key
				return false
			}
		}
		return true
	}, "the set of the closed session is ended")
	var revs []uint64
	var at []string
	for _, res := range resources {
		rev, mark := lastWrite(t, cl, streams.LeaseKey(res))
		if mark == nil {
			t.Fatalf("%s: last write at %d is not an end", res, rev)
		}
		revs, at = append(revs, rev), append(at, mark.EndedAt)
	}
	slices.Sort(revs)
	if revs[2]-revs[0] != 2 || at[0] != at[1] || at[1] != at[2] {
		t.Fatalf("the set's keys ended at revisions %v, at %v; want one batch (three consecutive revisions, one time)", revs, at)
	}
}
