package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/jetlock/jetlock/streams"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of the KV guard.
const (
	// DefaultKVKeyPrefix is the default prefix of guard record keys.
	DefaultKVKeyPrefix = "fence."
	// DefaultKVMaxAttempts is the default number of compare-and-set
	// attempts per call.
	DefaultKVMaxAttempts = 10
	// DefaultKVBackoff is the default base delay between attempts.
	DefaultKVBackoff = 10 * time.Millisecond
)

// KVOption configures NewKV.
type KVOption func(*kvOptions) error

type kvOptions struct {
	prefix   string
	attempts int
	backoff  time.Duration
}

var kvPrefixRe = regexp.MustCompile(`^[-/_=.A-Za-z0-9]*$`)

// KVKeyPrefix sets the prefix of guard record keys, so that guard records
// can share a bucket with other data. The default is "fence."; the empty
// prefix is allowed. A prefix with characters outside letters, digits and
// "- / _ = .", starting with '.' or containing ".." is an error wrapping
// ErrInvalid.
func KVKeyPrefix(prefix string) KVOption {
	return func(o *kvOptions) error {
		if !kvPrefixRe.MatchString(prefix) || (prefix != "" && prefix[0] == '.') || containsDotDot(prefix) {
			return invalidf("KV key prefix %q is not a valid key prefix", prefix)
		}
		o.prefix = prefix
		return nil
	}
}

func containsDotDot(s string) bool {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '.' && s[i+1] == '.' {
			return true
		}
	}
	return false
}

// KVMaxAttempts sets how many attempts one call makes before it gives up:
// with ErrConflict when every compare-and-set lost, or with the read error
// when no replica answered (nats.ErrNoResponders), the only errors that are
// retried. The default is 10; n below 1 is an error wrapping ErrInvalid.
func KVMaxAttempts(n int) KVOption {
	return func(o *kvOptions) error {
		if n < 1 {
			return invalidf("KV max attempts %d, want at least 1", n)
		}
		o.attempts = n
		return nil
	}
}

// KVBackoff sets the base delay between attempts. Retry i waits a random
// time between d·2^(i-1)/2 and d·2^(i-1), with the exponent capped at 6.
// The default is 10ms; a negative or zero d is an error wrapping
// ErrInvalid.
func KVBackoff(d time.Duration) KVOption {
	return func(o *kvOptions) error {
		if d <= 0 {
			return invalidf("KV backoff %v, want more than 0", d)
		}
		o.backoff = d
		return nil
	}
}

// KV is a Guard that keeps one guard record per resource in a JetStream
// key-value bucket, for services that keep their state in NATS. Every
// acceptance is a compare-and-set write (Create, or Update on the revision
// the decision was based on), so two guard instances in different
// processes never both accept after a newer token: reads may come from a
// lagging replica, but a decision based on an outdated read fails its
// compare-and-set and is taken again on a fresh read. A rejection needs no
// write: tokens only grow, so an outdated read that already shows a larger
// token proves the rejection.
//
// The guard record of resource r has key prefix+E(r), where E keeps
// letters, digits, '-', '_' and '/' and writes every other byte as '=' and
// two upper-case hex digits (streams.EncodeResource): resource
// "lock:backup:user123" has key "fence.lock=3Abackup=3Auser123". Its value
// is JSON, readable with `nats kv get`: {"token":42} or, after Put,
// {"token":42,"value":"<base64>"}.
//
// The bucket must keep guard records forever: no TTL (MaxAge), no byte or
// value limits that discard old records, and no Delete or Purge of guard
// keys. A lost record resets the resource's fence to "nothing accepted".
// Use R3 for the same reasons as the lock bucket.
//
// Methods are safe for concurrent use, also by several KV values (in
// several processes) on the same bucket.
type KV struct {
	kv       jetstream.KeyValue
	opts     kvOptions
	rejected atomic.Uint64
}

// NewKV returns a guard keeping its records in kv. It returns an error
// wrapping ErrInvalid for a nil kv or an invalid option. It does no I/O.
func NewKV(kv jetstream.KeyValue, opts ...KVOption) (*KV, error) {
	if kv == nil {
		return nil, invalidf("nil KeyValue")
	}
	o := kvOptions{prefix: DefaultKVKeyPrefix, attempts: DefaultKVMaxAttempts, backoff: DefaultKVBackoff}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	return &KV{kv: kv, opts: o}, nil
}

// Key returns the KV key of resource's guard record.
func (g *KV) Key(resource string) string { return g.opts.prefix + streams.EncodeResource(resource) }

// Entry is the content of a KV guard record.
type Entry struct {
	// Token is the highest token accepted for the resource.
	Token uint64
	// Value is the value of the last Put; nil if there was none or it was
	// empty.
	Value []byte
	// Revision is the KV revision of the guard record.
	Revision uint64
}

type kvRecord struct {
	Token uint64 `json:"token"`
	Value []byte `json:"value,omitempty"`
}

// Check implements Guard. An accepted token costs one read and one
// replicated write, also when it equals the highest: only a successful
// compare-and-set proves that no larger token was accepted meanwhile. A
// rejection costs one read. Besides the errors of Guard.Check, Check
// returns ErrConflict after the configured number of lost
// compare-and-set races and ErrCorrupt for an undecodable record.
func (g *KV) Check(ctx context.Context, resource string, token uint64) error {
	_, err := g.write(ctx, resource, token, nil, false)
	return err
}

// Put stores value in resource's guard record together with token, in one
// compare-and-set write, if token is at least the highest accepted; this is
// the fenced write for data that lives in the bucket itself, where no newer
// holder's value can be overwritten by an older one. It returns the new KV
// revision of the record. Errors are those of Check; after a store error
// the value may or may not have been stored.
func (g *KV) Put(ctx context.Context, resource string, token uint64, value []byte) (uint64, error) {
	return g.write(ctx, resource, token, value, true)
}

// Get returns resource's guard record. It returns an error wrapping
// ErrNotFound if there is none, ErrCorrupt for an undecodable record and
// otherwise a store error; a read that no replica answers is retried like
// a lost compare-and-set. The record may come from a lagging replica:
// never decide on it, decide with Check or Put.
func (g *KV) Get(ctx context.Context, resource string) (Entry, error) {
	if resource == "" {
		return Entry{}, invalidf("resource is empty")
	}
	key := g.Key(resource)
	var (
		rec kvRecord
		rev uint64
		err error
	)
	for attempt := 0; attempt < g.opts.attempts; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, g.opts.backoff, attempt); err != nil {
				return Entry{}, err
			}
		}
		if rec, rev, err = g.read(ctx, key); !errors.Is(err, nats.ErrNoResponders) {
			break
		}
	}
	if err != nil {
		return Entry{}, err
	}
	if rev == 0 {
		return Entry{}, fmt.Errorf("%w: resource %q", ErrNotFound, resource)
	}
	return Entry{Token: rec.Token, Value: rec.Value, Revision: rev}, nil
}

// Highest implements Guard: 0 if the record does not exist. The answer may
// come from a lagging replica.
func (g *KV) Highest(ctx context.Context, resource string) (uint64, error) {
	e, err := g.Get(ctx, resource)
	if errors.Is(err, ErrNotFound) {
		return 0, nil
	}
	return e.Token, err
}

// Rejected implements Guard. It counts the rejections of this KV value
// only, not those of other processes sharing the bucket.
func (g *KV) Rejected() uint64 { return g.rejected.Load() }

// read returns the record under key and its revision; revision 0 when the
// key does not exist (or holds a delete marker).
func (g *KV) read(ctx context.Context, key string) (kvRecord, uint64, error) {
	e, err := g.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return kvRecord{}, 0, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return kvRecord{}, 0, ctx.Err()
		}
		return kvRecord{}, 0, fmt.Errorf("fence: read guard record %q: %w", key, err)
	}
	var rec kvRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return kvRecord{}, 0, fmt.Errorf("%w: key %q revision %d: %w", ErrCorrupt, key, e.Revision(), err)
	}
	if rec.Token == 0 {
		return kvRecord{}, 0, fmt.Errorf("%w: key %q revision %d has no token", ErrCorrupt, key, e.Revision())
	}
	return rec, e.Revision(), nil
}

// write is Check (setValue false: keep the stored value) and Put.
func (g *KV) write(ctx context.Context, resource string, token uint64, value []byte, setValue bool) (uint64, error) {
	if err := validate(resource, token); err != nil {
		return 0, err
	}
	key := g.Key(resource)
	var lastErr error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if attempt >= g.opts.attempts {
				if lastErr != nil {
					return 0, lastErr
				}
				return 0, fmt.Errorf("%w: resource %q: %d compare-and-set attempts lost", ErrConflict, resource, attempt)
			}
			if err := sleep(ctx, g.opts.backoff, attempt); err != nil {
				return 0, err
			}
		}
		rec, rev, err := g.read(ctx, key)
		if errors.Is(err, nats.ErrNoResponders) {
			// No replica answered the read (a stream just created or
			// electing a leader). Nothing was decided: try again.
			lastErr = err
			continue
		}
		if err != nil {
			return 0, err
		}
		lastErr = nil
		if token < rec.Token {
			g.rejected.Add(1)
			return 0, &StaleTokenError{Resource: resource, Token: token, Highest: rec.Token}
		}
		rec.Token = token
		if setValue {
			rec.Value = value
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return 0, fmt.Errorf("fence: encode guard record: %w", err)
		}
		var newRev uint64
		if rev == 0 {
			newRev, err = g.kv.Create(ctx, key, data)
		} else {
			newRev, err = g.kv.Update(ctx, key, data, rev)
		}
		switch {
		case err == nil:
			return newRev, nil
		case isCASConflict(err):
			// Someone wrote since our read (or our read lagged): read
			// again and decide again.
			continue
		case ctx.Err() != nil:
			return 0, ctx.Err()
		default:
			return 0, fmt.Errorf("fence: write guard record %q: %w", key, err)
		}
	}
}

// isCASConflict reports a failed compare-and-set. The server answers
// 10071 when the expected revision is outdated (also on R3, as measured
// with nats-server 2.15) and 10164 on a replicated stream when another
// write of the key is still in flight. nats.go 1.55 maps both to
// ErrKeyRevisionMismatch for Update and to ErrKeyExists for Create, but
// not for the second write that Create makes over a delete marker: hence
// the code check.
func isCASConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
