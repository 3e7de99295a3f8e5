package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jetlock/jetlock/client/fence"
	"github.com/nats-io/nats.go/jetstream"
)

func TestKVOptions(t *testing.T) {
	if _, err := fence.NewKV(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("NewKV(nil) = %v, want ErrInvalid", err)
	}
	kv := &laggingKV{} // never used for I/O here
	for _, c := range []struct {
		name string
		opt  fence.KVOption
	}{
		{"prefix with space", fence.KVKeyPrefix("a b")},
		{"prefix starting with dot", fence.KVKeyPrefix(".fence")},
		{"prefix with ..", fence.KVKeyPrefix("a..b")},
		{"prefix with wildcard", fence.KVKeyPrefix("a.*.")},
		{"zero attempts", fence.KVMaxAttempts(0)},
		{"zero backoff", fence.KVBackoff(0)},
	} {
		if _, err := fence.NewKV(kv, c.opt); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: NewKV = %v, want ErrInvalid", c.name, err)
		}
	}
	for _, c := range []struct {
		opts     []fence.KVOption
		resource string
		want     string
	}{
		{nil, "lock:backup:user123", "fence.lock=3Abackup=3Auser123"},
		{nil, "orders/123", "fence.orders/123"},
		{nil, "a.b@c=d", "fence.a=2Eb=40c=3Dd"},
		{[]fence.KVOption{fence.KVKeyPrefix("app.guards.")}, "orders/1", "app.guards.orders/1"},
		{[]fence.KVOption{fence.KVKeyPrefix("")}, "x.y", "x=2Ey"},
	} {
		g := newKVGuard(t, kv, c.opts...)
		if got := g.Key(c.resource); got != c.want {
			t.Errorf("Key(%q) = %q, want %q", c.resource, got, c.want)
		}
	}
}

// TestKV runs everything that needs the R3 cluster on one cluster.
func TestKV(t *testing.T) {
	js := startJS(t)
	// A safety net for the whole run, not a budget: a busy machine may
	// take minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	t.Run("Suite", func(t *testing.T) {
		runGuardSuite(t, func(t *testing.T) fence.Guard { return newKVGuard(t, newBucket(t, js)) },
			concurrency{goroutines: 8, ops: 15, maxToken: 4, allowConflict: true})
	})

	t.Run("RecordIsReadable", func(t *testing.T) {
		kv := newBucket(t, js)
		g := newKVGuard(t, kv)
		if err := g.Check(ctx, "lock:backup:user123", 7); err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, "fence.lock=3Abackup=3Auser123")
		if err != nil {
			t.Fatal(err)
		}
		if got := string(e.Value()); got != `{"token":7}` {
			t.Fatalf("record = %s, want {\"token\":7}", got)
		}
	})

	t.Run("PutGet", func(t *testing.T) {
		g := newKVGuard(t, newBucket(t, js))
		if _, err := g.Get(ctx, "r"); !errors.Is(err, fence.ErrNotFound) {
			t.Fatalf("Get of a new resource = %v, want ErrNotFound", err)
		}
		rev, err := g.Put(ctx, "r", 5, []byte("five"))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Check(ctx, "r", 6); err != nil { // Check keeps the value
			t.Fatal(err)
		}
		e, err := g.Get(ctx, "r")
		if err != nil || e.Token != 6 || string(e.Value) != "five" || e.Revision <= rev {
			t.Fatalf("Get = %+v, %v; want token 6, value five, revision above %d", e, err, rev)
		}
		if _, err := g.Put(ctx, "r", 5, []byte("old")); !errors.Is(err, fence.ErrStaleToken) {
			t.Fatalf("Put with a stale token = %v, want ErrStaleToken", err)
		}
		if _, err := g.Put(ctx, "r", 6, []byte("six")); err != nil {
			t.Fatalf("Put with the equal token = %v", err)
		}
		if e, _ := g.Get(ctx, "r"); string(e.Value) != "six" {
			t.Fatalf("value = %q, want six", e.Value)
		}
	})

	t.Run("Corrupt", func(t *testing.T) {
		kv := newBucket(t, js)
		g := newKVGuard(t, kv)
		for _, v := range []string{"not json", `{"token":0}`, `{}`} {
			if _, err := kv.Put(ctx, g.Key("r"), []byte(v)); err != nil {
				t.Fatal(err)
			}
			if err := g.Check(ctx, "r", 1); !errors.Is(err, fence.ErrCorrupt) {
				t.Errorf("Check on record %s = %v, want ErrCorrupt", v, err)
			}
		}
	})

	// A lagging read says "no record" while a newer token is stored: the
	// Create fails with the R3 conflict code, the guard reads again and
	// rejects.
	t.Run("LaggingReadCreate", func(t *testing.T) {
		kv := newBucket(t, js)
		g := newKVGuard(t, kv)
		if err := g.Check(ctx, "r", 20); err != nil {
			t.Fatal(err)
		}
		lag := &laggingKV{KeyValue: kv, stale: map[string]jetstream.KeyValueEntry{g.Key("r"): nil}}
		err := newKVGuard(t, lag).Check(ctx, "r", 10)
		var se *fence.StaleTokenError
		if !errors.As(err, &se) || se.Highest != 20 {
			t.Fatalf("Check after lagging read = %v, want StaleTokenError with highest 20", err)
		}
		if len(lag.casErrs) != 1 || !isWrongLastSeq(lag.casErrs[0]) || !errors.Is(lag.casErrs[0], jetstream.ErrKeyExists) {
			t.Fatalf("CAS errors = %v, want one ErrKeyExists with API code 10071 or 10164", lag.casErrs)
		}
	})

	// TestDelayedOldWrite for KV: A read the record (token t1) and prepared
	// its write before B's t2 was accepted; A's write is applied after.
	t.Run("DelayedOldWrite", func(t *testing.T) {
		kv := newBucket(t, js)
		g := newKVGuard(t, kv)
		const t1, t2 = 10, 20
		if _, err := g.Put(ctx, "lock:backup:user123", t1, []byte("A first")); err != nil {
			t.Fatal(err)
		}
		seenByA, err := kv.Get(ctx, g.Key("lock:backup:user123"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.Put(ctx, "lock:backup:user123", t2, []byte("B")); err != nil {
			t.Fatalf("B's write = %v", err)
		}
		lag := &laggingKV{KeyValue: kv, stale: map[string]jetstream.KeyValueEntry{g.Key("lock:backup:user123"): seenByA}}
		_, err = newKVGuard(t, lag).Put(ctx, "lock:backup:user123", t1, []byte("A late"))
		if !errors.Is(err, fence.ErrStaleToken) {
			t.Fatalf("A's delayed write = %v, want ErrStaleToken", err)
		}
		if len(lag.casErrs) != 1 || !isWrongLastSeq(lag.casErrs[0]) || !errors.Is(lag.casErrs[0], jetstream.ErrKeyRevisionMismatch) {
			t.Fatalf("CAS errors = %v, want one ErrKeyRevisionMismatch with API code 10071 or 10164", lag.casErrs)
		}
		if e, err := g.Get(ctx, "lock:backup:user123"); err != nil || e.Token != t2 || string(e.Value) != "B" {
			t.Fatalf("record = %+v, %v; want B's write with t2 intact", e, err)
		}
	})

	// A replica that never catches up makes every attempt lose: the guard
	// gives up with ErrConflict after its bounded attempts.
	t.Run("BoundedAttempts", func(t *testing.T) {
		kv := newBucket(t, js)
		g := newKVGuard(t, kv)
		if err := g.Check(ctx, "r", 1); err != nil {
			t.Fatal(err)
		}
		old, err := kv.Get(ctx, g.Key("r"))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Check(ctx, "r", 2); err != nil {
			t.Fatal(err)
		}
		lag := &laggingKV{KeyValue: kv, sticky: true, stale: map[string]jetstream.KeyValueEntry{g.Key("r"): old}}
		err = newKVGuard(t, lag, fence.KVMaxAttempts(3), fence.KVBackoff(time.Millisecond)).Check(ctx, "r", 5)
		if !errors.Is(err, fence.ErrConflict) || len(lag.casErrs) != 3 {
			t.Fatalf("Check = %v after %d CAS errors, want ErrConflict after 3", err, len(lag.casErrs))
		}
	})

	// Writers through Put on one bucket: sorted by the revision of each
	// accepted write, the tokens never go down, and the final record holds
	// the last accepted write. A round of writers races until one of them
	// meets a write still in flight (code 10164), the path the round is
	// for: how often writes overlap depends on how busy the machine is, so
	// rounds repeat, each checked whole, until one did.
	t.Run("ConcurrentOrderLog", func(t *testing.T) {
		rec := &laggingKV{KeyValue: newBucket(t, js)} // records CAS errors only
		g := newKVGuard(t, rec)
		codes := map[jetstream.ErrorCode]int{}
		for round := 0; codes[jetstream.JSErrCodeStreamWrongLastSequenceConstant] == 0; round++ {
			if round == 50 {
				t.Fatalf("no conflict with code 10164 (write in flight) in %d rounds: the test did not exercise that path (%v)", round, codes)
			}
			concurrentOrderLogRound(ctx, t, g, []string{fmt.Sprintf("a%d", round), fmt.Sprintf("lock:b%d", round)})
			for _, err := range rec.takeCASErrs() {
				if !isWrongLastSeq(err) {
					t.Fatalf("CAS write failed with %v, want a conflict", err)
				}
				codes[apiCode(err)]++
			}
		}
		t.Logf("CAS conflicts by API error code: %v", codes)
	})
}

// concurrentOrderLogRound runs 8 writers of 15 Puts each on resources and
// checks the order of what was accepted.
func concurrentOrderLogRound(ctx context.Context, t *testing.T, g *fence.KV, resources []string) {
	t.Helper()
	type write struct{ rev, token uint64 }
	var mu sync.Mutex
	log := map[string][]write{}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 15 {
				res, tok := resources[rand.IntN(len(resources))], 1+uint64(j)+rand.Uint64N(4)
				rev, err := g.Put(ctx, res, tok, []byte(strconv.FormatUint(tok, 10)))
				switch {
				case err == nil:
					mu.Lock()
					log[res] = append(log[res], write{rev, tok})
					mu.Unlock()
				case errors.Is(err, fence.ErrStaleToken), errors.Is(err, fence.ErrConflict):
				default:
					t.Errorf("writer %d: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, res := range resources {
		ws := log[res]
		sort.Slice(ws, func(i, j int) bool { return ws[i].rev < ws[j].rev })
		tokens := make([]uint64, len(ws))
		for i, w := range ws {
			tokens[i] = w.token
		}
		checkOrderLog(t, res, tokens)
		last := ws[len(ws)-1]
		e, err := g.Get(ctx, res)
		if err != nil || e.Revision != last.rev || e.Token != last.token || string(e.Value) != strconv.FormatUint(last.token, 10) {
			t.Fatalf("%s: record %+v, %v; want the last accepted write %+v", res, e, err, last)
		}
	}
}
