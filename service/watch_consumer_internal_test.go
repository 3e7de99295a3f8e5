package service

import (
	"context"
	"testing"
	"time"
)

// A following instance's watcher reads the stream in order: its consumer
// is filtered on the stream's one subject, every key of the bucket, and
// on nothing else. A consumer with several filters makes the server look
// up every subject of a message block for each message it delivers while
// it is behind, under the block's lock; after a node's restart, the
// watchers' consumers catching up so on the stream leader stopped its
// grants for many seconds (see watchAfter).
func TestTheWatchersConsumerReadsTheStreamInOrder(t *testing.T) {
	cl := startCluster(t)
	following(t, cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := bucketStream(ctx, t, cl)
	subjects := st.CachedInfo().Config.Subjects
	cfgs := consumersOf(ctx, t, st)
	if len(cfgs) != 1 {
		t.Fatalf("%d consumers on the bucket's stream; want the watcher's alone", len(cfgs))
	}
	if c := cfgs[0]; len(c.FilterSubjects) != 0 || len(subjects) != 1 || c.FilterSubject != subjects[0] {
		t.Fatalf("the watcher's consumer filters %q %q; want the stream's one subject %q alone", c.FilterSubject, c.FilterSubjects, subjects)
	}
}
