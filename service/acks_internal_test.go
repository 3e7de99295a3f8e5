package service

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// Right after a partition heals, the node that led the stream before it
// still takes the stream's writes until it hears of its successor, and
// answers a compare-and-set from its old state at once, while the current
// leader commits the same write. Here a subscriber on the bucket's subjects
// plays that node: it refuses every write at once, as the found old leader
// did (the soak saw a close answered closed:false for the session it had
// closed). The store must report what the current leader did.
func TestARefusalFromANodeThatNoLongerLeadsIsNotTheAnswer(t *testing.T) {
	cl := startCluster(t)
	nc := connectAs(t, cl, devcluster.Store)
	js, _ := jetstream.New(nc)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, streams.BucketConfig{Bucket: "stale", Replicas: 3, RetryWindow: time.Minute}.StreamConfig(1)); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "stale")
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string) uint64 {
		for try := 0; ; try++ {
			rev, err := kv.Put(ctx, key, []byte("v"))
			if err == nil {
				return rev
			}
			if try == 100 {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// The old leader: it answers every compare-and-set on the bucket with
	// answer.
	old := connectAs(t, cl, devcluster.Admin)
	var answer atomic.Value
	sub, err := old.Subscribe(streams.SubjectPrefix("stale")+">", func(m *nats.Msg) {
		if m.Reply != "" && m.Header.Get(jetstream.ExpectedLastSubjSeqHeader) != "" {
			_ = m.Respond([]byte(answer.Load().(string)))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := old.Flush(); err != nil {
		t.Fatal(err)
	}
	s := newStore(nc, "stale", time.Minute)
	end := &streams.EndMark{RequestID: "r", EndedAt: streams.FormatTime(time.Now()), Why: streams.EndRelease}
	const behind = `{"stream":"KV_stale","error":{"code":400,"err_code":10071,"description":"wrong last sequence: 0"}}`
	const inFlight = `{"stream":"KV_stale","error":{"code":400,"err_code":10164,"description":"wrong last sequence"}}`
	for _, tc := range []struct{ name, answer string }{{"behind", behind}, {"in flight", inFlight}} {
		answer.Store(tc.answer)
		key := "k-" + tc.name[:2]
		rev := put(key)
		seq, err := s.del(ctx, key, rev, end)
		if err != nil {
			t.Fatalf("%s: an end that the leader committed was answered %v", tc.name, err)
		}
		e, gerr := kv.Get(ctx, key)
		if !errors.Is(gerr, jetstream.ErrKeyNotFound) {
			t.Fatalf("%s: the key after its end: %v, %v", tc.name, e, gerr)
		}
		if seq <= rev {
			t.Fatalf("%s: the end answered revision %d, at or below the ended one %d", tc.name, seq, rev)
		}
	}
	// A true conflict is still one, whatever the old leader says first.
	answer.Store(behind)
	key := "k-moved"
	first := put(key)
	put(key)
	if _, err := s.del(ctx, key, first, end); !errors.Is(err, errConflict) {
		t.Fatalf("an end on a revision the key has moved past: %v, want a conflict", err)
	}
	// A refusal from behind that no other answer follows is the answer
	// (the key's last write may have expired, as a delete marker does:
	// TestAcquireAfterTheDeleteMarkerExpired); the caller decides again.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m := nats.NewMsg(streams.SubjectPrefix("elsewhere") + "k")
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "7")
	lone, err := old.Subscribe(m.Subject, func(m *nats.Msg) { _ = m.Respond([]byte(behind)) })
	if err != nil {
		t.Fatal(err)
	}
	defer lone.Unsubscribe()
	_ = old.Flush()
	if _, _, err := s.publish(sctx, "put", m); !errors.Is(err, errConflict) {
		t.Fatalf("a refusal from behind with no other answer: %v, want a conflict", err)
	}
}
