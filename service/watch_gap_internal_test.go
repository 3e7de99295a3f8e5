package service

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// grantInGap writes a lease of g's session, as a grant that commits in
// stream order does, and returns its revision.
func grantInGap(ctx context.Context, t *testing.T, s *Service, g *grantReq) uint64 {
	t.Helper()
	rec := newLease(time.Now(), g.requestID, g.owner, "", time.Hour, time.Time{})
	sessionLease(rec, time.Now(), g.session, time.Time{})
	seq, _, err := s.locks.store.put(ctx, g.key, rec, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// A watcher that resumes from a revision (as nats.go's ordered consumer
// does after it lost its consumer: it makes a new one from the stream
// sequence after the last it delivered) delivers only the records the
// bucket still holds, the last of each key: a session opened and kept
// alive meanwhile is delivered at its keepalive, not at its open. Fed to
// the view as the follower feeds it, a grant in that session delivered
// in between finds the session not live at its revision, though it was:
// the soak's "watcher-fed view that lacked a live session". The proof on
// the stream leader (notLiveAt) answers it right.
func TestAResumedWatcherShowsASessionOnlyAtItsLastWrite(t *testing.T) {
	cl := startCluster(t)
	s := following(t, cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	g := openIn(t, s, "gap", "gap/res")
	opened, _ := lastWrite(t, cl, streams.SessionKey(g.session))
	granted := grantInGap(ctx, t, s, g)
	if _, err := s.locks.sessions.keepalive(ctx, g.session+g.secret, 0, origin{}); err != nil {
		t.Fatal(err)
	}
	kept, _ := lastWrite(t, cl, streams.SessionKey(g.session))
	if !(opened < granted && granted < kept) {
		t.Fatalf("open at %d, grant at %d, keepalive at %d: want them in that order", opened, granted, kept)
	}

	// The view of a follower that had delivered every write before the
	// open, and resumes there.
	f := &follower{tracker: newTracker(time.Second, time.Minute, time.Minute), decode: s.follow.decode}
	f.deliveries.restart()
	f.deliveries.caughtUp()
	f.deliveries.delivered(opened - 1)
	w, err := watchAfter(ctx, storeBucket(t, cl), opened-1)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	var revs []uint64
	for len(revs) < 2 {
		var kve jetstream.KeyValueEntry
		select {
		case kve = <-w.Updates():
		case <-ctx.Done():
			t.Fatalf("delivered %v; want the grant and the keepalive", revs)
		}
		if kve == nil {
			continue
		}
		f.deliver(kve.Key(), kve.Revision(), kve.Operation() != jetstream.KeyValuePut, kve.Value(), false)
		revs = append(revs, kve.Revision())
		if kve.Revision() == granted {
			if live, known := f.deliveries.liveAt(g.session, g.secret, granted); live || !known {
				t.Fatalf("after the grant's delivery: live %v known %v; want the session shown not live (its open was never delivered)", live, known)
			}
		}
	}
	if revs[0] != granted || revs[1] != kept {
		t.Fatalf("a watcher resumed at the open (%d) delivered %v; want the grant %d and the keepalive %d, the open superseded", opened, revs, granted, kept)
	}
	if live, known := f.deliveries.liveAt(g.session, g.secret, granted); !live || !known {
		t.Fatalf("after the keepalive's delivery: live %v known %v; want live", live, known)
	}
	if err := s.locks.sessions.notLiveAt(ctx, g.session, granted); err != nil {
		t.Fatalf("the proof on the stream leader of a live session: %v; want it live at %d", err, granted)
	}
}

// The same gap on a real follower: its watcher's consumer is deleted on
// the server, as one is lost when its server leaves or the cluster
// settles after a heal; nats.go notices two heartbeats later and makes a
// new one from the sequence after the last it delivered (while JetStream
// answers "temporarily unavailable", it tries again at every check, ten
// seconds apart: the soak's findings came 30 to 40 s after a watcher
// started). A session opened, used, kept alive and closed in the gap is
// never shown live: its end is delivered, its open and keepalive are not,
// so the view judges a grant made while it lived as made outside it.
func TestAWatcherGapHidesASessionFromTheView(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for nats.go to notice a lost consumer")
	}
	cl := startCluster(t)
	s := following(t, cl)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	st := bucketStream(ctx, t, cl)
	names := st.ConsumerNames(ctx)
	var lost []string
	for name := range names.Name() {
		lost = append(lost, name)
	}
	if len(lost) != 1 {
		t.Fatalf("consumers of the bucket %v; want the watcher's alone", lost)
	}
	before := s.locks.delivered()
	if err := st.DeleteConsumer(ctx, lost[0]); err != nil {
		t.Fatal(err)
	}

	g := openIn(t, s, "gap", "gap/res")
	opened, _ := lastWrite(t, cl, streams.SessionKey(g.session))
	granted := grantInGap(ctx, t, s, g)
	if _, err := s.locks.sessions.keepalive(ctx, g.session+g.secret, 0, origin{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.locks.sessions.closeSession(ctx, g.session+g.secret, origin{}); err != nil {
		t.Fatal(err)
	}
	ended, _ := lastWrite(t, cl, streams.SessionKey(g.session))
	if d := s.locks.delivered(); d >= opened {
		t.Fatalf("the watcher delivered %d with its consumer deleted; want it stalled before %d", d, opened)
	}
	waitFor(t, 60*time.Second, func() bool { return s.locks.delivered() >= ended }, "the watcher resumed past the session's end")
	resumed := consumersOf(ctx, t, st)
	if len(resumed) != 1 || resumed[0].DeliverPolicy != jetstream.DeliverByStartSequencePolicy || resumed[0].OptStartSeq <= before || resumed[0].OptStartSeq > opened {
		t.Fatalf("the watcher's consumer after the gap: %+v; want one by start sequence from after %d, at most %d (the ordered consumer's reset, not a new watcher)", resumed, before, opened)
	}
	live, known := s.follow.deliveries.liveAt(g.session, g.secret, granted)
	if live || !known {
		t.Fatalf("a grant at %d to a session opened at %d and ended at %d: live %v known %v; want it shown not live (the gap's mark)", granted, opened, ended, live, known)
	}
}

// consumersOf returns the configurations of the consumers of st.
// bucketStream is the default bucket's stream, seen by an administrator.
func bucketStream(ctx context.Context, t *testing.T, cl *devcluster.Cluster) jetstream.Stream {
	t.Helper()
	js, err := jetstream.New(connectAs(t, cl, devcluster.Admin))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, streams.StreamName(streams.DefaultBucket))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func consumersOf(ctx context.Context, t *testing.T, st jetstream.Stream) []jetstream.ConsumerConfig {
	t.Helper()
	var cfgs []jetstream.ConsumerConfig
	infos := st.ListConsumers(ctx)
	for ci := range infos.Info() {
		cfgs = append(cfgs, ci.Config)
	}
	if err := infos.Err(); err != nil {
		t.Fatal(err)
	}
	return cfgs
}
