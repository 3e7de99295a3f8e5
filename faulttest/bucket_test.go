package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// An inspector watching the lock bucket sees every write in the order the
// stream committed it, with its revision: the one place where a lock set's
// records can be seen with their lease id, key by key, in commit order.
// The watch is an ordered consumer; whatever it misses (a message
// overwritten before it was delivered, which the bucket's history of one
// per key allows, or a reset of the consumer) shows as a gap in the
// revisions, and the checks that read the log (checkBucket) only judge
// what they saw whole.

// BucketWrite is one write to the lock bucket as the watch saw it.
type BucketWrite struct {
	Rev uint64
	At  time.Duration // when the watch received it
	Key string
	// Res is the resource of a lease key (a permit's is "<sem>#<k>"),
	// empty for the other keys (waiters, sessions, tombstones, confirm).
	Res string
	// Put is a record written; false, a delete marker or a purge.
	Put                bool
	LeaseID, RequestID string
	Token              uint64
	Set                string
	SetSize, Limit     int
	Value              string
}

func (w *BucketWrite) String() string {
	s := fmt.Sprintf("rev %d (seen at %v) %s", w.Rev, w.At.Round(time.Millisecond), w.Key)
	switch {
	case w.Res == "":
	case w.Put:
		s += fmt.Sprintf(" put lease=%s req=%s token=%d", short(w.LeaseID), w.RequestID, w.Token)
		if w.Set != "" {
			s += fmt.Sprintf(" set=%s/%d", short(w.Set), w.SetSize)
		}
	default:
		s += " delete"
	}
	return s
}

// BucketWatch records the writes to the lock bucket.
type BucketWatch struct {
	h    *History
	nc   *nats.Conn
	js   jetstream.JetStream
	kw   jetstream.KeyWatcher
	done chan struct{}

	mu  sync.Mutex
	log []BucketWrite
}

// WatchBucket starts watching the lock bucket, from now on, as an
// inspector connected through a proxy of its own (to node 0, or the next
// node while it is down).
func WatchBucket(h *Harness, hist *History) *BucketWatch {
	h.T.Helper()
	p := NewProxy(h.T, h.targets(0))
	nc := h.connectVia(p, "bucket watch", devcluster.Inspector)
	js, err := jetstream.New(nc)
	if err != nil {
		h.T.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var kv jetstream.KeyValue
	for {
		if kv, err = js.KeyValue(ctx, streams.DefaultBucket); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		h.T.Fatal(err)
	}
	kw, err := kv.WatchAll(context.Background(), jetstream.UpdatesOnly())
	if err != nil {
		h.T.Fatal(err)
	}
	b := &BucketWatch{h: hist, nc: nc, js: js, kw: kw, done: make(chan struct{})}
	go b.run()
	return b
}

func (b *BucketWatch) run() {
	defer close(b.done)
	for e := range b.kw.Updates() {
		if e == nil {
			continue
		}
		w := BucketWrite{Rev: e.Revision(), At: b.h.Now(), Key: e.Key(), Put: e.Operation() == jetstream.KeyValuePut}
		if enc, ok := strings.CutPrefix(w.Key, streams.LeaseKeyPrefix); ok {
			if res, err := streams.DecodeResource(enc); err == nil {
				w.Res = res
			} else {
				w.Res = enc
			}
			var rec streams.Record
			if w.Put && json.Unmarshal(e.Value(), &rec) == nil {
				w.LeaseID, w.RequestID, w.Token = rec.LeaseID, rec.RequestID, rec.TokenAt(w.Rev)
				w.Set, w.SetSize, w.Limit, w.Value = rec.Set, rec.SetSize, rec.Limit, rec.Value
			}
		}
		b.mu.Lock()
		b.log = append(b.log, w)
		b.mu.Unlock()
	}
}

// last returns the revision of the last write received.
func (b *BucketWatch) last() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.log) == 0 {
		return 0
	}
	return b.log[len(b.log)-1].Rev
}

// Stop waits (at most timeout) until the watch has received the stream's
// last write, stops it, and returns what it saw, in revision order.
func (b *BucketWatch) Stop(timeout time.Duration) []BucketWrite {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := b.js.Stream(ctx, lockStream)
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = s.Info(ctx)
		}
		cancel()
		if err == nil && b.last() >= info.State.LastSeq {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = b.kw.Stop()
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
	}
	b.nc.Close()
	return b.Log()
}

// Log returns what the watch saw so far, in revision order, each revision
// once.
func (b *BucketWatch) Log() []BucketWrite {
	b.mu.Lock()
	out := append([]BucketWrite(nil), b.log...)
	b.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Rev < out[j].Rev })
	n := 0
	for i := range out {
		if n > 0 && out[n-1].Rev == out[i].Rev {
			continue
		}
		out[n] = out[i]
		n++
	}
	return out[:n]
}
