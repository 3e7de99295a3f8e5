package streams_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

func startCluster(t *testing.T) (*devcluster.Cluster, jetstream.JetStream) {
	t.Helper()
	c, err := devcluster.Start(devcluster.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	nc, err := nats.Connect(c.URLs(), c.ConnectOptions(devcluster.Store)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return c, js
}

func TestEnsureCreatesSafeBucketAndIsIdempotent(t *testing.T) {
	_, js := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := streams.Ensure(ctx, js, streams.BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := b.Stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Config.MaxMsgsPerSubject != 1 || info.Config.Storage != jetstream.FileStorage {
		t.Fatalf("unsafe config: %+v", info.Config)
	}
	if len(info.Cluster.Replicas)+1 != 3 {
		t.Fatalf("want 3 replicas placed, got cluster info %+v", info.Cluster)
	}
	if _, err := streams.Ensure(ctx, js, streams.BucketConfig{}); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
}

func TestEnsureRefusesUnsafeBuckets(t *testing.T) {
	_, js := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := streams.Ensure(ctx, js, streams.BucketConfig{Bucket: "r1", Replicas: 1}); !errors.Is(err, streams.ErrBucketConfig) {
		t.Fatalf("R1 without AllowSingleReplica: got %v", err)
	}
	// A bucket someone made with history 5 is refused, not silently used.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "hist", History: 5, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := streams.Ensure(ctx, js, streams.BucketConfig{Bucket: "hist"}); !errors.Is(err, streams.ErrBucketConfig) {
		t.Fatalf("history 5: got %v", err)
	}
}

func TestRecreatedBucketNeverRestartsBelowHighWater(t *testing.T) {
	_, js := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := streams.Ensure(ctx, js, streams.BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := 0; i < 20; i++ {
		if last, err = b.KV.Put(ctx, "lease.x", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.RecordHighWater(ctx, last); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, streams.StreamName(streams.DefaultBucket)); err != nil {
		t.Fatal(err)
	}
	b2, err := streams.Ensure(ctx, js, streams.BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := b2.KV.Put(ctx, "lease.x", []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if rev <= last {
		t.Fatalf("recreated bucket wrote revision %d, not above the old %d", rev, last)
	}
	// A stream recreated behind jetlock's back at sequence 1 is refused.
	if err := js.DeleteStream(ctx, streams.StreamName(streams.DefaultBucket)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, streams.BucketConfig{}.StreamConfig(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := streams.Ensure(ctx, js, streams.BucketConfig{}); !errors.Is(err, streams.ErrBelowHighWater) {
		t.Fatalf("stream restarted at 1: got %v", err)
	}
}
