package streams

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultBucket is the default name of the lock-state bucket.
const DefaultBucket = "jetlock"

// DefaultRetryWindow is the default duplicate window of the bucket's stream:
// how long an acquire retried with the same request_id is recognised by
// JetStream's message-id deduplication.
const DefaultRetryWindow = 2 * time.Minute

// RecreateGap is added to the recorded high-water mark when the bucket's
// stream has to be created again, so that tokens handed out after the last
// recording still lie below every new token.
const RecreateGap = 1_000_000_000

// highWaterKey is the key of the high-water mark in the meta bucket.
const highWaterKey = "high_water"

// ErrBucketConfig is wrapped by Ensure when an existing bucket's
// configuration would break jetlock's invariants.
var ErrBucketConfig = errors.New("lock bucket configuration unsafe")

// ErrBelowHighWater is wrapped by Ensure when the stream reports a last
// sequence below the recorded token high-water mark. That can be a stream
// recreated without jetlock (its tokens would go backwards), or it can be
// passing: while a stream has no leader, a replica that is behind may
// answer the info request (nats-server jsStreamInfoRequest lets members of
// a leaderless group answer; Ensure then returns a plain, retryable error),
// and a leader just elected may still be applying entries. Callers retry
// for a while and only then refuse the bucket.
var ErrBelowHighWater = errors.New("stream last sequence below the token high-water mark")

// BucketConfig describes the lock-state bucket.
type BucketConfig struct {
	// Bucket is the KV bucket name. The default is "jetlock".
	Bucket string
	// Replicas is the replica count. The default is 3. Fewer than 3 is
	// refused unless AllowSingleReplica is set.
	Replicas int
	// AllowSingleReplica permits Replicas 1, for throwaway experiments
	// only: one server's loss then loses acknowledged state.
	AllowSingleReplica bool
	// RetryWindow is the stream's duplicate window. The default is 2m.
	RetryWindow time.Duration
	// PlacementTags restricts placement to servers with all these tags. The
	// default is none: spread over availability zones comes from the
	// servers' unique_tag "az:" setting.
	PlacementTags []string
	// MinFirstSeq is a floor for the first sequence of a newly created
	// stream, for an operator restoring a cluster whose meta bucket was
	// lost too. The default is 0 (no floor).
	MinFirstSeq uint64
}

func (c BucketConfig) withDefaults() BucketConfig {
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	if c.RetryWindow == 0 {
		c.RetryWindow = DefaultRetryWindow
	}
	return c
}

// Validate reports a configuration that cannot be used.
func (c BucketConfig) Validate() error {
	c = c.withDefaults()
	if !validBucketName(c.Bucket) {
		return fmt.Errorf("%w: bucket name %q must be letters, digits, - and _", ErrInvalid, c.Bucket)
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		return fmt.Errorf("%w: replicas %d out of 1..5", ErrInvalid, c.Replicas)
	}
	if c.Replicas < 3 && !c.AllowSingleReplica {
		return fmt.Errorf("%w: %d replicas cannot survive the loss of a zone; 3 are required", ErrBucketConfig, c.Replicas)
	}
	if c.RetryWindow < time.Second {
		return fmt.Errorf("%w: retry window %v below 1s", ErrInvalid, c.RetryWindow)
	}
	return nil
}

func validBucketName(b string) bool {
	if b == "" {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// StreamName returns the name of the stream behind bucket.
func StreamName(bucket string) string { return "KV_" + bucket }

// SubjectPrefix returns the subject prefix of the keys of bucket.
func SubjectPrefix(bucket string) string { return "$KV." + bucket + "." }

func metaBucket(bucket string) string { return bucket + "_meta" }

// StreamConfig returns the stream configuration of the lock bucket, a
// standard KV stream (readable with `nats kv`) with history 1, file
// storage, deletes and purges through the API denied (and so no roll-ups:
// nothing but a compare-and-set write changes a key), atomic batches
// allowed (a hand-over commits a grant and a waiter's removal together),
// message TTLs allowed (for delete markers and cancel tombstones, which
// leave the bucket after the retry window; never for lease expiry) and
// the given first sequence.
func (c BucketConfig) StreamConfig(firstSeq uint64) jetstream.StreamConfig {
	c = c.withDefaults()
	sc := jetstream.StreamConfig{
		Name:               StreamName(c.Bucket),
		Description:        "jetlock lock state",
		Subjects:           []string{SubjectPrefix(c.Bucket) + ">"},
		MaxMsgsPerSubject:  1,
		MaxBytes:           -1,
		MaxMsgSize:         -1,
		MaxMsgs:            -1,
		MaxConsumers:       -1,
		Storage:            jetstream.FileStorage,
		Replicas:           c.Replicas,
		DenyDelete:         true,
		DenyPurge:          true,
		AllowAtomicPublish: true,
		Duplicates:         c.RetryWindow,
		AllowDirect:        true,
		Discard:            jetstream.DiscardNew,
		AllowMsgTTL:        true,
		FirstSeq:           firstSeq,
	}
	if len(c.PlacementTags) > 0 {
		sc.Placement = &jetstream.Placement{Tags: c.PlacementTags}
	}
	return sc
}

// Drift is one way a stream's live configuration or state differs from
// what the lock bucket requires.
type Drift struct {
	Setting string `json:"setting"`
	Want    string `json:"want"`
	Have    string `json:"have"`
	// Fixable drift can be put right by a stream update that only
	// tightens (lockd check --fix); the rest needs the operator.
	Fixable bool `json:"fixable"`
}

func (d Drift) String() string { return fmt.Sprintf("%s: %s, want %s", d.Setting, d.Have, d.Want) }

// Drift compares a live stream configuration, its last sequence and the
// recorded token high-water mark with the definition, and returns every
// difference that matters to jetlock's invariants: replicas, placement,
// history, storage, max age, discard policy, the duplicate window, denied
// deletes and purges, roll-ups, atomic batches, message TTLs, and a last
// sequence below the high-water mark.
func (c BucketConfig) Drift(sc jetstream.StreamConfig, lastSeq, highWater uint64) []Drift {
	c = c.withDefaults()
	want := c.StreamConfig(0)
	var out []Drift
	add := func(cond bool, setting string, w, h any, fixable bool) {
		if cond {
			out = append(out, Drift{Setting: setting, Want: fmt.Sprint(w), Have: fmt.Sprint(h), Fixable: fixable})
		}
	}
	add(sc.Replicas < want.Replicas && !(c.AllowSingleReplica && sc.Replicas >= 1), "replicas", want.Replicas, sc.Replicas, false)
	add(!slices.Equal(placementTags(sc.Placement), c.PlacementTags), "placement tags", c.PlacementTags, placementTags(sc.Placement), false)
	add(sc.MaxMsgsPerSubject != 1, "history", 1, sc.MaxMsgsPerSubject, false)
	add(sc.Storage != jetstream.FileStorage, "storage", jetstream.FileStorage, sc.Storage, false)
	add(sc.MaxAge != 0, "max age", "none (expiry without compare-and-set)", sc.MaxAge, false)
	add(sc.Discard != jetstream.DiscardNew, "discard", jetstream.DiscardNew, sc.Discard, false)
	add(sc.Duplicates < c.RetryWindow, "duplicate window", fmt.Sprintf(">= %v (the retry window)", c.RetryWindow), sc.Duplicates, false)
	add(!sc.DenyDelete, "deny delete", true, false, true)
	add(!sc.DenyPurge, "deny purge", true, false, true)
	add(sc.AllowRollup, "allow roll-up", false, true, true)
	add(!sc.AllowAtomicPublish, "allow atomic publish", true, false, true)
	add(!sc.AllowMsgTTL, "allow message TTL", true, false, true)
	add(lastSeq < highWater, "last sequence", fmt.Sprintf(">= %d (the token high-water mark)", highWater), lastSeq, false)
	return out
}

func placementTags(p *jetstream.Placement) []string {
	if p == nil {
		return nil
	}
	return p.Tags
}

// Fixed returns sc with every fixable drift put right.
func (c BucketConfig) Fixed(sc jetstream.StreamConfig) jetstream.StreamConfig {
	sc.DenyDelete, sc.DenyPurge, sc.AllowRollup, sc.AllowAtomicPublish, sc.AllowMsgTTL = true, true, false, true, true
	return sc
}

// check reports why an existing stream cannot serve as the lock bucket.
func (c BucketConfig) check(info *jetstream.StreamInfo, highWater uint64) error {
	var problems []string
	below := false
	for _, d := range c.Drift(info.Config, info.State.LastSeq, highWater) {
		if d.Setting == "last sequence" {
			below = true
			continue
		}
		problems = append(problems, d.String())
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: stream %s: %s (lockd check --fix puts right what an update can)", ErrBucketConfig, info.Config.Name, strings.Join(problems, "; "))
	}
	if below {
		if info.Cluster != nil && info.Cluster.Leader == "" {
			// Answered by a replica of a leaderless stream: not evidence.
			return fmt.Errorf("stream %s has no leader (a replica reports last sequence %d, below the high-water mark %d)",
				info.Config.Name, info.State.LastSeq, highWater)
		}
		return fmt.Errorf("%w: stream %s reports last sequence %d, the high-water mark is %d: tokens would go backwards if it stays so",
			ErrBelowHighWater, info.Config.Name, info.State.LastSeq, highWater)
	}
	return nil
}

// Bucket is an ensured lock bucket.
type Bucket struct {
	KV     jetstream.KeyValue
	Stream jetstream.Stream
	meta   jetstream.KeyValue
	cfg    BucketConfig
}

// Ensure creates the lock bucket, or checks an existing one, and returns
// it. It is idempotent and safe to call from many service instances at
// once. It refuses (with ErrBucketConfig) a bucket whose configuration
// drifted from the definition (see Drift: wrong history, fewer than 3
// replicas without AllowSingleReplica, a max age, deletes or purges
// through the API allowed, ...); and (with ErrBelowHighWater) one that
// reports a sequence below the recorded high-water mark. A stream created
// anew starts at the recorded high-water mark plus RecreateGap (or
// MinFirstSeq), never at 1 again.
func Ensure(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (*Bucket, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	meta, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      metaBucket(cfg.Bucket),
		Description: "jetlock metadata: the token high-water mark",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure meta bucket: %w", err)
	}
	// A just-created R3 bucket answers reads only once its replicas are
	// up; until then a read finds no responders.
	highWater, _, err := readHighWater(ctx, meta)
	for errors.Is(err, nats.ErrNoResponders) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		highWater, _, err = readHighWater(ctx, meta)
	}
	if err != nil {
		return nil, err
	}
	name := StreamName(cfg.Bucket)
	stream, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		first := uint64(1)
		if highWater > 0 {
			first = highWater + RecreateGap
		}
		if cfg.MinFirstSeq > first {
			first = cfg.MinFirstSeq
		}
		stream, err = js.CreateStream(ctx, cfg.StreamConfig(first))
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Another instance created it first; check theirs.
			stream, err = js.Stream(ctx, name)
		}
		if err != nil {
			return nil, fmt.Errorf("create stream %s: %w", name, err)
		}
	case err != nil:
		return nil, fmt.Errorf("look up stream %s: %w", name, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream %s info: %w", name, err)
	}
	if err := cfg.check(info, highWater); err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("bind bucket %s: %w", cfg.Bucket, err)
	}
	b := &Bucket{KV: kv, Stream: stream, meta: meta, cfg: cfg}
	if err := b.RecordHighWater(ctx, info.State.LastSeq); err != nil {
		return nil, err
	}
	return b, nil
}

// Config returns the bucket's configuration with defaults filled in.
func (b *Bucket) Config() BucketConfig { return b.cfg }

func readHighWater(ctx context.Context, meta jetstream.KeyValue) (uint64, uint64, error) {
	e, err := meta.Get(ctx, highWaterKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("read high-water mark: %w", err)
	}
	var hw uint64
	if err := json.Unmarshal(e.Value(), &hw); err != nil {
		return 0, 0, fmt.Errorf("parse high-water mark %q: %w", e.Value(), err)
	}
	return hw, e.Revision(), nil
}

// LoadHighWater returns the token high-water mark recorded for bucket (0
// when none is).
func LoadHighWater(ctx context.Context, js jetstream.JetStream, bucket string) (uint64, error) {
	meta, err := js.KeyValue(ctx, metaBucket(bucket))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("bind meta bucket: %w", err)
	}
	hw, _, err := readHighWater(ctx, meta)
	return hw, err
}

// HighWater returns the recorded high-water mark.
func (b *Bucket) HighWater(ctx context.Context) (uint64, error) {
	hw, _, err := readHighWater(ctx, b.meta)
	return hw, err
}

// RecordHighWater raises the recorded high-water mark to seq if it is
// higher, by compare-and-set; it never lowers it.
func (b *Bucket) RecordHighWater(ctx context.Context, seq uint64) error {
	for attempt := 0; attempt < 10; attempt++ {
		hw, rev, err := readHighWater(ctx, b.meta)
		if err != nil {
			return err
		}
		if seq <= hw {
			return nil
		}
		val := []byte(strconv.FormatUint(seq, 10))
		if rev == 0 {
			_, err = b.meta.Create(ctx, highWaterKey, val)
		} else {
			_, err = b.meta.Update(ctx, highWaterKey, val, rev)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("record high-water mark: %w", err)
		}
	}
	return errors.New("record high-water mark: too many conflicts")
}
