package service

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetlock/jetlock/streams"
)

// Config configures a Service. Start from DefaultConfig.
type Config struct {
	// Prefix is the subject prefix. The default is "jetlock".
	Prefix string
	// Bucket configures the lock-state bucket (default "jetlock", R3,
	// retry window 2m). The retry window is how long an acquire retried
	// with the same request_id is recognised.
	Bucket streams.BucketConfig
	// DefaultTTL is the lease TTL when a request names none. The default
	// is 30s.
	DefaultTTL time.Duration
	// MinTTL and MaxTTL bound ttl_ms. The defaults are 1s and 10m; MaxTTL
	// is at most 24h. A value in the bucket that jetlock did not write
	// blocks its key for MaxTTL plus ExpiryGrace from when an instance
	// first saw it, then is taken over.
	MinTTL, MaxTTL time.Duration
	// MaxHold caps how long a lease may be held in total, renewals
	// included: the deployment's cap on max_hold_ms, which also applies
	// when a request names none. Zero means no cap. The default is 24h.
	MaxHold time.Duration
	// MaxWait bounds wait_ms. The default is 5m.
	MaxWait time.Duration
	// ExpiryGrace is added to a lease's TTL before the service expires it:
	// a lease expires once the service has seen its last write unchanged
	// for TTL + ExpiryGrace on its monotonic clock. The default is 2s.
	ExpiryGrace time.Duration
	// SweepInterval is how often expired leases are swept. The default is
	// 200ms.
	SweepInterval time.Duration
	// HandoverTTL caps the TTL of a lease granted after waiting. The grant
	// may reach a caller that has gone away meanwhile; the short TTL frees
	// the resource soon in that case, and the holder's first renewal (with
	// the TTL it wants) extends it. The default is 5s.
	HandoverTTL time.Duration
	// WaiterLiveness is the liveness window of a waiter record: a record
	// whose instance has not been heard (instances announce themselves on
	// a heartbeat subject every second) for this long plus ExpiryGrace is
	// removed, so a waiter whose instance died frees its place within
	// seconds, while a waiter costs no write as long as nothing changes. A
	// third of it is also how often one waiter of each queue checks the
	// lock on the stream leader without a wake. The default is 6s.
	WaiterLiveness time.Duration
	// Recheck is how often a waiter re-checks the lock without being woken,
	// since wake messages are at-most-once. The default is 1s.
	Recheck time.Duration
	// Reservation is how long a free resource is kept for the head waiter.
	// The waiter k places behind the head may claim after k reservations,
	// so a waiter that does not claim is skipped in ticket order. The
	// default is 2s.
	Reservation time.Duration
	// MaxWaitersPerResource caps the queue of one resource, and
	// MaxWaitersPerTenant the waiting acquires of one tenant (a NATS user
	// as the server vouches for it; every request that crossed no import
	// counts as one tenant) on every resource; beyond them acquire answers
	// too_many_waiters. Each instance counts the waiters it knows and the
	// places it is writing, so waits arriving at once on one instance never
	// pass a cap; instances that queue at the same moment may each let one
	// more in (see docs/waiting.md). The defaults are 1000 and 1000.
	MaxWaitersPerResource, MaxWaitersPerTenant int
	// MaxLeasesPerTenant caps the leases one tenant holds at once, as this
	// instance knows them; beyond it acquire answers too_many_waiters.
	// Zero means no cap. The default is 0.
	MaxLeasesPerTenant int
	// MaxPerSession caps the leases and waits of one session together,
	// and MaxSessionsPerTenant the sessions one tenant keeps open, as this
	// instance knows them; beyond them acquire (or session.open) answers
	// too_many_waiters. The defaults are 10000 and 10000.
	MaxPerSession, MaxSessionsPerTenant int
	// MaxSetSize caps the resources of one lock set, between 2 and
	// streams.MaxSetSize (a set's grant after waiting is one atomic batch
	// of two writes a resource, within JetStream's 1,000 messages). The
	// default is 64.
	MaxSetSize int
	// MaxWaiting caps the waiting acquires one instance serves at once
	// (waits do not count toward MaxInFlight); keep MaxWaitersPerTenant
	// well below it, so that no one tenant can take every place. The
	// default is 10000.
	MaxWaiting int
	// MaxPerKey bounds the requests of one instance that wait for the
	// requests on the same key ahead of them; beyond, a request is
	// answered unavailable at once, so one hot key cannot hold every
	// in-flight place. The default is 64.
	MaxPerKey int
	// OwnerRate is a fair-use limit on acquires (waiting or not) a second
	// per owner, with a burst of twice the rate. Owners are chosen by
	// callers: UserRate is the limit a caller cannot dodge.
	//
	// UserRate is the fair-use limit of a tenant (a NATS user as the
	// server vouches for it on an account import): operations a second,
	// each weighted by what it costs (see opCost: an acquire 1, a waiting
	// one 2, a cancel 2, renewing or releasing a lease the instance does
	// not know 2, a list page 1 plus 1 per 10 leases asked for), with a
	// burst of twice the rate. The renewal or release of a lease the
	// instance knows as current costs nothing, so a tenant over its rate
	// never loses a lease it keeps renewing. A caller over its rate is
	// answered unavailable with retry_after_ms. Requests that crossed no
	// import are not limited by it.
	//
	// Zero disables a limit. The defaults are 0 (owner) and 0 (user).
	OwnerRate, UserRate float64
	// TenantRates gives tenants a rate of their own instead of UserRate:
	// by "ACCOUNT/user", or by "ACCOUNT" for every user of an account (the
	// user's entry wins); 0 means no limit. A deployment whose tenants
	// differ in size gives its large ones a larger rate, and keeps the
	// default small enough that no one tenant can saturate the cluster.
	// The default is none.
	TenantRates map[string]float64
	// Operators lists who may call admin requests (revoke): "ACCOUNT" for
	// every user of an account, or "ACCOUNT/user". The identity must be
	// stamped by the NATS server on an import (deploy/ gives operators an
	// account of their own that imports the service): a request that
	// crossed no import is never an operator's. The default is
	// ["OPERATORS"].
	Operators []string
	// MaxBodyBytes bounds a request's body; a larger one is answered
	// invalid_request before it is decoded. It may not be below the
	// largest valid request (streams.MaxRequestBytes of MaxSetSize), and
	// the default, 0, is exactly that.
	MaxBodyBytes int
	// OpTimeout bounds the store work of one request: it must end within
	// QueueWait+OpTimeout of the request's receipt (rounded up to the next
	// 10ms), so a request that did not wait in the queue has the unused
	// part of QueueWait as well, for a slow stretch of the stream. The
	// default is 3s; with QueueWait's 1s that is 4s, below the client's
	// default request timeout of 5s.
	OpTimeout time.Duration
	// MaxInFlight bounds the requests processed at once; the next
	// MaxQueued wait in arrival order, and beyond those the service sheds
	// load, answering unavailable at once. The bound keeps the queue in
	// front of the stream well below OpTimeout: requests that time out
	// inside the service have used the stream for nothing, and goodput
	// collapses (docs/capacity.md has the measurements behind the
	// default). The default is 4096.
	MaxInFlight int
	// MaxQueued bounds the requests waiting for one of the MaxInFlight
	// places; 0 sheds every request beyond MaxInFlight. The default is
	// 16384.
	MaxQueued int
	// QueueWait is how long a request may wait for its place: one whose
	// turn comes later is answered unavailable then, without store work.
	// The queue lets the service ride out a stall of the stream without
	// shedding; QueueWait plus OpTimeout, the whole budget of a request
	// from its receipt, should stay below the clients' request timeout, so
	// that every answer still finds its caller. The default is 1s.
	QueueWait time.Duration
	// HighWaterPatience is how long Run keeps re-checking a bucket whose
	// stream reports a last sequence below the token high-water mark
	// (streams.ErrBelowHighWater: a replica that is behind answered while
	// the stream had no leader) before it refuses the bucket. The default
	// is 1m.
	HighWaterPatience time.Duration
	// Clock supplies wall time for reported times. The default is the
	// system clock.
	Clock Clock
	// Logger receives the service's logs. The default is slog.Default().
	Logger *slog.Logger
	// Registerer receives the service's Prometheus metrics. The default is
	// none (metrics are kept but not registered).
	Registerer prometheus.Registerer
	// Audit, when set, receives one record per grant, renew refusal,
	// release, expiry, hand-over, cancel and revoke, with the resource,
	// token, owner, outcome, instance and caller; never a lease id. The
	// default is none.
	Audit *slog.Logger
	// Version is reported in `nats micro info`. The default is "0.1.0".
	Version string
}

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	return Config{
		Prefix:        streams.DefaultPrefix,
		Bucket:        streams.BucketConfig{Bucket: streams.DefaultBucket, Replicas: 3, RetryWindow: streams.DefaultRetryWindow},
		DefaultTTL:    30 * time.Second,
		MinTTL:        time.Second,
		MaxTTL:        10 * time.Minute,
		MaxHold:       24 * time.Hour,
		MaxWait:       5 * time.Minute,
		ExpiryGrace:   2 * time.Second,
		SweepInterval: 200 * time.Millisecond,
		OpTimeout:     3 * time.Second,
		MaxInFlight:   4096,
		MaxQueued:     16384,
		QueueWait:     time.Second,

		HighWaterPatience: time.Minute,

		HandoverTTL:           5 * time.Second,
		WaiterLiveness:        6 * time.Second,
		Recheck:               time.Second,
		Reservation:           2 * time.Second,
		MaxWaitersPerResource: 1000,
		MaxWaitersPerTenant:   1000,
		MaxPerSession:         10000,
		MaxSessionsPerTenant:  10000,
		MaxSetSize:            streams.DefaultSetSize,
		MaxWaiting:            10000,
		MaxPerKey:             64,
		Operators:             []string{"OPERATORS"},
		MaxBodyBytes:          0,
		Clock:                 systemClock{},
		Version:               "0.1.0",
	}
}

// Validate reports the first unusable setting, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	if c.Prefix == "" || !validPrefix(c.Prefix) {
		return badConfig("prefix %q must be dot-separated tokens of letters, digits, - and _", c.Prefix)
	}
	if err := c.Bucket.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := c.validateTimes(); err != nil {
		return err
	}
	return c.validateCaps()
}

// validateTimes reports the first unusable duration or rate.
func (c Config) validateTimes() error {
	if c.MinTTL < time.Second || c.MaxTTL < c.MinTTL || c.MaxTTL > streams.MaxRecordTTL {
		return badConfig("TTL bounds [%v, %v]: need 1s <= min <= max <= %v", c.MinTTL, c.MaxTTL, streams.MaxRecordTTL)
	}
	if c.MaxHold != 0 && c.MaxHold < c.MinTTL || c.MaxHold > streams.MaxHoldCeiling {
		return badConfig("max hold %v: need 0 (no cap) or min TTL %v to %v", c.MaxHold, c.MinTTL, streams.MaxHoldCeiling)
	}
	if c.OwnerRate < 0 || c.UserRate < 0 {
		return badConfig("owner rate %v and user rate %v must not be negative", c.OwnerRate, c.UserRate)
	}
	for t, r := range c.TenantRates {
		if !validTenant(t) || r < 0 {
			return badConfig("tenant rate %q=%v: want ACCOUNT or ACCOUNT/user and a rate of at least 0", t, r)
		}
	}
	if c.DefaultTTL < c.MinTTL || c.DefaultTTL > c.MaxTTL {
		return badConfig("default TTL %v outside [%v, %v]", c.DefaultTTL, c.MinTTL, c.MaxTTL)
	}
	if c.MaxWait < 0 {
		return badConfig("max wait %v is negative", c.MaxWait)
	}
	if c.ExpiryGrace < 0 || c.SweepInterval <= 0 || c.OpTimeout <= 0 || c.HighWaterPatience <= 0 {
		return badConfig("expiry grace, sweep interval, op timeout and high-water patience must be positive")
	}
	if c.HandoverTTL < c.MinTTL || c.WaiterLiveness < time.Second || c.Recheck <= 0 || c.Reservation <= 0 {
		return badConfig("handover TTL (>= min TTL), waiter liveness (>= 1s), recheck and reservation must be positive")
	}
	return nil
}

// validateCaps reports the first unusable cap, size or other setting.
func (c Config) validateCaps() error {
	if c.MaxWaitersPerResource < 1 || c.MaxWaitersPerTenant < 1 || c.MaxWaiting < 1 || c.MaxPerKey < 1 {
		return badConfig("waiter caps and max per key must be at least 1")
	}
	if c.MaxSetSize < streams.MinSetSize || c.MaxSetSize > streams.MaxSetSize {
		return badConfig("max set size %d outside [%d, %d]", c.MaxSetSize, streams.MinSetSize, streams.MaxSetSize)
	}
	if c.MaxPerSession < 1 || c.MaxSessionsPerTenant < 1 {
		return badConfig("max leases and waits per session (%d) and sessions per tenant (%d) must be at least 1", c.MaxPerSession, c.MaxSessionsPerTenant)
	}
	if c.MaxLeasesPerTenant < 0 {
		return badConfig("max leases per tenant %d is negative", c.MaxLeasesPerTenant)
	}
	if need := streams.MaxRequestBytes(c.MaxSetSize); c.MaxBodyBytes != 0 && c.MaxBodyBytes < need {
		return badConfig("max body bytes %d: need 0 (derived) or at least %d, the largest valid request with sets of %d resources", c.MaxBodyBytes, need, c.MaxSetSize)
	}
	for _, op := range c.Operators {
		if !validTenant(op) {
			return badConfig("operator %q: want ACCOUNT or ACCOUNT/user", op)
		}
	}
	if c.MaxInFlight < 1 {
		return badConfig("max in flight %d < 1", c.MaxInFlight)
	}
	if c.MaxQueued < 0 || c.QueueWait < 0 {
		return badConfig("max queued %d and queue wait %v must not be negative", c.MaxQueued, c.QueueWait)
	}
	if c.Clock == nil {
		return badConfig("clock is nil")
	}
	return nil
}

// badConfig is an error wrapping ErrInvalidConfig with the format's text.
func badConfig(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// validTenant reports whether t names an account or an account's user.
func validTenant(t string) bool {
	acc, user, _ := strings.Cut(t, "/")
	return acc != "" && !strings.ContainsAny(t, " \t\r\n") && !strings.Contains(user, "/")
}

func validPrefix(p string) bool {
	tok := 0
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '.':
			if tok == 0 {
				return false
			}
			tok = 0
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			tok++
		default:
			return false
		}
	}
	return tok > 0
}

// maxBody is the largest request body the service decodes.
func (c Config) maxBody() int {
	if c.MaxBodyBytes != 0 {
		return c.MaxBodyBytes
	}
	return streams.MaxRequestBytes(c.MaxSetSize)
}
