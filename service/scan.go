package service

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// The first sync of a watcher. A KV watcher's first delivery (the last
// record of every key, the consumer's "last per subject") reaches a
// consumer one message at a time, each loaded apart from the writes the
// stream commits meanwhile: under the design load it takes a minute or
// more for a bucket of 100,000 keys, and an instance that starts (a lockd
// restarted in a rolling upgrade) is not ready until it has ended. The
// same records read with batched direct gets, many to a request, take
// about a second (see docs/capacity.md). So the follower reads them so,
// in stream order, and starts its watcher after the last of them.
//
// With a history of one, the stream holds exactly the last record of each
// key, so reading it in order up to a sequence S gives every key's state
// as of S, except keys written again during the read: their older record
// is gone from the stream, and their newer one, after S, comes from the
// watcher. Any replica may answer a direct get; each holds a prefix of the
// stream, so a batch that a replica behind the others answers ends at
// what it holds, and the read goes on (or the watcher starts) after the
// last record read: nothing below it is skipped.

// scanBatch is how many records one direct get returns at most.
const scanBatch = 1000

// scanTimeout bounds the wait for each answer of a batch.
const scanTimeout = 5 * time.Second

// scanned is one record read by scanBucket.
type scanned struct {
	key     string
	rev     uint64
	deleted bool
	data    []byte
}

// scanBucket reads every record of bucket's stream whose key starts with
// one of prefixes, in stream order, with batched direct gets on nc, and
// calls fn for each. It returns the stream sequence of the last record it
// read (0 for an empty stream): a watcher started after it misses nothing.
func scanBucket(ctx context.Context, nc *nats.Conn, bucket string, prefixes []string, fn func(scanned)) (uint64, error) {
	subjPfx := "$KV." + bucket + "."
	subj := "$JS.API.DIRECT.GET." + streams.StreamName(bucket)
	inbox := nc.NewInbox()
	ch := make(chan *nats.Msg, scanBatch+1)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return 0, fmt.Errorf("scan the bucket: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	var last uint64
	for {
		req := fmt.Appendf(nil, `{"seq":%d,"batch":%d,"next_by_subj":%q}`, last+1, scanBatch, subjPfx+">")
		if err := nc.PublishRequest(subj, inbox, req); err != nil {
			return last, fmt.Errorf("scan the bucket: %w", err)
		}
		more, err := scanOne(ctx, ch, subjPfx, prefixes, &last, fn)
		if err != nil || !more {
			return last, err
		}
	}
}

// scanOne takes the answers to one batch from ch, advancing last, and
// reports whether to read on: a full batch with more after it. A batch
// that is not full reached the stream's tail, where writes go on
// arriving: the watcher takes them from there.
func scanOne(ctx context.Context, ch <-chan *nats.Msg, subjPfx string, prefixes []string, last *uint64, fn func(scanned)) (bool, error) {
	timer := time.NewTimer(scanTimeout)
	defer timer.Stop()
	for n := 0; ; n++ {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return false, ctx.Err()
		case <-timer.C:
			return false, fmt.Errorf("scan the bucket: %w: no answer within %v after sequence %d", errUnavailable, scanTimeout, *last)
		}
		timer.Reset(scanTimeout)
		if status := m.Header.Get("Status"); status != "" && len(m.Data) == 0 {
			switch status {
			case "204": // end of the batch
				return n >= scanBatch && m.Header.Get("Nats-Num-Pending") != "0", nil
			case "404": // nothing after last
				return false, nil
			}
			return false, fmt.Errorf("scan the bucket: %w: direct get answered %s %s", errUnavailable, status, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		if err != nil || seq <= *last {
			return false, fmt.Errorf("scan the bucket: bad sequence %q after %d", m.Header.Get("Nats-Sequence"), *last)
		}
		*last = seq
		key, ok := strings.CutPrefix(m.Header.Get("Nats-Subject"), subjPfx)
		if !ok || !hasAnyPrefix(key, prefixes) {
			continue
		}
		op := m.Header.Get(kvOperationHeader)
		deleted := op == "DEL" || op == "PURGE" || m.Header.Get("Nats-Marker-Reason") != ""
		fn(scanned{key: key, rev: seq, deleted: deleted, data: m.Data})
	}
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
