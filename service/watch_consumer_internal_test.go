package service

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
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
	js, err := jetstream.New(connectAs(t, cl, devcluster.Admin))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, streams.StreamName(streams.DefaultBucket))
	if err != nil {
		t.Fatal(err)
	}
	subjects := st.CachedInfo().Config.Subjects
	var seen int
	for info := range st.ListConsumers(ctx).Info() {
		seen++
		c := info.Config
		if len(c.FilterSubjects) != 0 || len(subjects) != 1 || c.FilterSubject != subjects[0] {
			t.Errorf("the watcher's consumer %s filters %q %q; want the stream's one subject %q alone", info.Name, c.FilterSubject, c.FilterSubjects, subjects)
		}
	}
	if seen != 1 {
		t.Fatalf("%d consumers on the bucket's stream; want the watcher's alone", seen)
	}
}
