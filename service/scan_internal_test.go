package service

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/streams"
)

// The first sync reads every record with batched direct gets and then
// watches from after the last: while writes go on (rewrites, deletes, new
// keys, keys the follower does not follow), the records read and then
// watched end as the bucket holds them, key for key.
func TestAScanThenAWatchFromItsEndIsTheBucket(t *testing.T) {
	cl := startCluster(t)
	_, store, err := cl.ConnectService()
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	js, _ := jetstream.New(store)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := streams.Ensure(ctx, js, streams.BucketConfig{})
	if err != nil {
		t.Fatal(err)
	}
	kv, bucket := b.KV, b.Config().Bucket
	// More keys than three batches hold, some of them in no followed
	// prefix, some deleted.
	key := func(i int) string {
		switch i % 4 {
		case 0:
			return fmt.Sprintf("wait.k%05d", i)
		case 1:
			return fmt.Sprintf("session.k%05d", i)
		case 2:
			return fmt.Sprintf("other.k%05d", i)
		}
		return fmt.Sprintf("lease.k%05d", i)
	}
	const n = 3*scanBatch + 500
	put := func(i int) error {
		_, err := kv.Put(ctx, key(i), fmt.Appendf(nil, `{"i":%d}`, rand.IntN(1000)))
		return err
	}
	var futs []jetstream.PubAckFuture
	for i := range n {
		f, err := js.PublishAsync("$KV."+bucket+"."+key(i), []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i += 7 {
		if err := kv.Delete(ctx, key(i)); err != nil {
			t.Fatal(err)
		}
	}

	// Writes beside the scan: rewrites, deletes and new keys.
	wctx, stopWrites := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var writeErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for j := 0; wctx.Err() == nil; j++ {
			i := rand.IntN(n + 200)
			var err error
			if j%5 == 0 {
				err = kv.Delete(wctx, key(i))
			} else {
				err = put(i)
			}
			if err != nil && wctx.Err() == nil {
				writeErr = err
				return
			}
		}
	}()

	type rec struct {
		rev     uint64
		deleted bool
	}
	view := map[string]rec{}
	apply := func(k string, rev uint64, deleted bool) {
		if !hasAnyPrefix(k, watchedPrefixes) {
			t.Errorf("%s delivered: not a followed key", k)
		}
		if old, ok := view[k]; ok && old.rev >= rev {
			t.Errorf("%s: revision %d after %d", k, rev, old.rev)
		}
		view[k] = rec{rev, deleted}
	}
	last, err := scanBucket(ctx, store, bucket, watchedPrefixes, func(r scanned) { apply(r.key, r.rev, r.deleted) })
	if err != nil {
		t.Fatal(err)
	}
	if len(view) < n/2 {
		t.Fatalf("scan read %d keys up to %d; want about %d", len(view), last, 3*n/4)
	}
	time.Sleep(200 * time.Millisecond) // more writes after the scan
	stopWrites()
	wg.Wait()
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	// A write the writer gave up on when it was stopped may still commit:
	// one more write on its connection, answered, comes after it in the
	// stream, and the watch reads up to that one (its "caught up" marker
	// may come before a write that commits after the watch began).
	barrier, err := kv.Put(ctx, "other.barrier", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	w, err := watchAfter(ctx, kv, last)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for kve := range w.Updates() {
		if kve == nil {
			continue
		}
		if kve.Revision() >= barrier {
			break
		}
		if hasAnyPrefix(kve.Key(), watchedPrefixes) { // as follower.deliver
			apply(kve.Key(), kve.Revision(), kve.Operation() != jetstream.KeyValuePut)
		}
	}

	// The bucket, key by key.
	for i := range n + 200 {
		k := key(i)
		if !hasAnyPrefix(k, watchedPrefixes) {
			continue
		}
		got, seen := view[k]
		e, err := kv.Get(ctx, k)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if seen && !got.deleted {
				t.Errorf("%s: seen live at %d; the bucket holds none or its delete", k, got.rev)
			}
		case err != nil:
			t.Fatal(err)
		case !seen || got.deleted || got.rev != e.Revision():
			t.Errorf("%s: seen %+v (seen %v); the bucket holds revision %d", k, got, seen, e.Revision())
		}
	}
}
