package service

import (
	"context"
	"testing"
	"time"
)

// A watcher started again (after an alone spell, or a failed start) in a
// quiet bucket knows, once it has delivered every record, the revision of
// the last of them: a write at that revision (here a grant to a session,
// as a release's would be) is judged at once, not after OpTimeout
// (unavailable) for want of a later write.
func TestARestartedWatcherKnowsWhatItsInitialDeliveryCovers(t *testing.T) {
	cl := startCluster(t)
	s, _ := startInstance(t, cl, DefaultConfig(), 500*time.Millisecond)
	waitFor(t, 30*time.Second, func() bool { return !s.Following() }, "the instance, alone, stopped following")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	g := openIn(t, s, "quiet", "quiet/res")
	granted := grantInGap(ctx, t, s, g)
	wctx, stop := context.WithCancel(ctx)
	synced := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.follow.watch(wctx, func() { close(synced) }) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("watcher: %v", err)
		}
	}()
	select {
	case <-synced:
	case <-ctx.Done():
		t.Fatal("the watcher never delivered every record")
	}
	if live, known := s.follow.deliveries.liveAt(g.session, g.secret, granted); !live || !known {
		t.Fatalf("a grant at %d, the last write, once the watcher delivered every record: live %v known %v; want known live", granted, live, known)
	}
	if d := s.locks.delivered(); d < granted {
		t.Fatalf("delivered %d once caught up; want at least the last record's %d", d, granted)
	}
	start := time.Now()
	if err := s.locks.sessions.liveInStream(ctx, granted, g.session); err != nil {
		t.Fatalf("the session at %d judged after %v: %v; want it live", granted, time.Since(start), err)
	}
}
