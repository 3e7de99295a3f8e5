package fence_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/client/fence"
	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/internal/testenv"
)

// startJS starts a three-node dev cluster for the test and returns a
// JetStream context on it.
func startJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(testenv.Start(t).ConnectAs(devcluster.App))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

var bucketSeq atomic.Int64

// newBucket creates a fresh R3 bucket on js.
func newBucket(t *testing.T, js jetstream.JetStream) jetstream.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := jetstream.KeyValueConfig{
		Bucket:   fmt.Sprintf("fence_%d", bucketSeq.Add(1)),
		History:  1,
		Storage:  jetstream.FileStorage,
		Replicas: 3,
	}
	// Just after the cluster starts, the meta leader may not yet count
	// every peer as online and refuses an R3 placement (10005).
	for {
		_, err := js.CreateKeyValue(ctx, cfg)
		if err == nil {
			break
		}
		if apiCode(err) != 10005 || ctx.Err() != nil {
			t.Fatalf("create bucket %s: %v", cfg.Bucket, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The tests read back what they have just written. A direct get may
	// be answered by a replica a moment behind the leader, so the test
	// buckets answer reads from the leader only; the guard's handling of
	// lagging reads is tested with laggingKV, which lags on purpose.
	stream, err := js.Stream(ctx, "KV_"+cfg.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	scfg := stream.CachedInfo().Config
	scfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, scfg); err != nil {
		t.Fatalf("bucket %s: leader-only reads: %v", cfg.Bucket, err)
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	// A new R3 stream answers reads only once its leader is up; until
	// then a read fails with "no responders".
	for {
		_, err := kv.Get(ctx, "probe")
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return kv
		}
		if ctx.Err() != nil {
			t.Fatalf("bucket %s not readable: %v", kv.Bucket(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func newKVGuard(t *testing.T, kv jetstream.KeyValue, opts ...fence.KVOption) *fence.KV {
	t.Helper()
	g, err := fence.NewKV(kv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// laggingKV serves chosen outdated entries from Get, as a replica that
// lags behind the stream leader would, and records the errors of
// compare-and-set writes. A nil stale entry answers "not found".
type laggingKV struct {
	jetstream.KeyValue
	sticky bool // serve the stale entry on every Get, not just once

	mu      sync.Mutex
	stale   map[string]jetstream.KeyValueEntry
	casErrs []error
}

func (l *laggingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	l.mu.Lock()
	e, ok := l.stale[key]
	if ok && !l.sticky {
		delete(l.stale, key)
	}
	l.mu.Unlock()
	switch {
	case !ok:
		return l.KeyValue.Get(ctx, key)
	case e == nil:
		return nil, jetstream.ErrKeyNotFound
	default:
		return e, nil
	}
}

func (l *laggingKV) record(err error) {
	if err != nil {
		l.mu.Lock()
		l.casErrs = append(l.casErrs, err)
		l.mu.Unlock()
	}
}

// takeCASErrs returns the CAS errors recorded so far and forgets them.
func (l *laggingKV) takeCASErrs() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	errs := l.casErrs
	l.casErrs = nil
	return errs
}

func (l *laggingKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := l.KeyValue.Create(ctx, key, value, opts...)
	l.record(err)
	return rev, err
}

func (l *laggingKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	rev, err := l.KeyValue.Update(ctx, key, value, revision)
	l.record(err)
	return rev, err
}

func apiCode(err error) jetstream.ErrorCode {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode
	}
	return 0
}

// isWrongLastSeq reports a CAS conflict. On a replicated stream the server
// answers 10071 when the expected revision is simply outdated and 10164
// when another write of the key is still being replicated.
func isWrongLastSeq(err error) bool {
	c := apiCode(err)
	return c == jetstream.JSErrCodeStreamWrongLastSequence || c == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}
