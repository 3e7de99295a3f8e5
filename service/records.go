package service

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// entry is one observation of a key of the bucket: the revision of its
// last write and, unless that write deleted it, the record.
type entry struct {
	rev uint64
	rec *streams.Record  // nil when the key is absent, deleted or foreign
	end *streams.EndMark // what a delete marker says it ended, if anything
	// foreign is set when the value is not a jetlock record. It is nobody's
	// lease or waiter; a lease key holding one is taken over once it has
	// stood for the maximum TTL (see tracker.expired).
	foreign bool
	// sem is the limit of the semaphore whose name record the key holds
	// (streams.AppendNameRecord), 0 for any other value: nobody's lease,
	// never foreign, replaced only under the name rule (name_rule.go).
	sem int
}

func (e entry) held() bool { return e.rec != nil }

// decodeEntry turns the last write of key (its revision, whether it
// deleted the key, and its value) into an entry. A value that is not a
// complete jetlock record is reported through foreign and becomes a
// foreign entry, never an error: no value anybody writes can wedge a key.
func decodeEntry(key string, rev uint64, deleted bool, data []byte, wakeRoot string, foreign func(key string, rev uint64, err error)) entry {
	e := entry{rev: rev}
	if rev == 0 {
		return e
	}
	if deleted {
		e.end = streams.DecodeEndMark(data)
		return e
	}
	var err error
	switch {
	case strings.HasPrefix(key, streams.LeaseKeyPrefix):
		if n, ok := streams.ParseNameRecord(data); ok {
			e.sem = n
			return e
		}
		e.rec, err = streams.ParseLease(data, rev)
	case strings.HasPrefix(key, streams.WaitKeyPrefix):
		e.rec, err = streams.ParseWaiter(data, rev, wakeRoot)
	case strings.HasPrefix(key, streams.SessionKeyPrefix):
		e.rec, err = streams.ParseSession(data, rev)
	default:
		err = fmt.Errorf("%w: key outside the lease and wait prefixes", streams.ErrForeign)
	}
	if err != nil {
		e.rec, e.foreign = nil, true
		if foreign != nil {
			foreign(key, rev, err)
		}
	}
	return e
}

func newLeaseID() string {
	var b [16]byte // 128 random bits
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// requestHash names one logical acquire: the message id of its granting
// write, the key of its cancel tombstone and its waiter key derive from it.
// The tenant is part of it, so two tenants' requests of the same id are two
// requests; a request of no tenant hashes as it did before tenants.
func requestHash(resource, requestID, tenant string) string {
	s := resource + "\x00" + requestID
	if tenant != "" {
		s += "\x00" + tenant
	}
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:20])
}

func grantMsgID(hash string) string { return "acq-" + hash }

func cancelKey(hash string) string { return "cancel." + hash }

func sameLease(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// resourceOf returns the encoded resource of a lease or waiter key.
func resourceOf(key string) string {
	if rest, ok := strings.CutPrefix(key, streams.LeaseKeyPrefix); ok {
		return rest
	}
	enc, _, _ := strings.Cut(strings.TrimPrefix(key, streams.WaitKeyPrefix), ".")
	return enc
}

// decodedResource returns the resource name of an encoded one, or the
// encoded form when it does not decode (a foreign key).
func decodedResource(enc string) string {
	if !strings.Contains(enc, "=") {
		return enc // nothing escaped: the same string, no copy
	}
	if r, err := streams.DecodeResource(enc); err == nil {
		return r
	}
	return enc
}

// newLease builds the record of a lease granted now to requestID of owner
// and tenant for ttl, held at most until holdUntil (zero: no cap).
func newLease(now time.Time, requestID, owner, tenant string, ttl time.Duration, holdUntil time.Time) *streams.Record {
	rec := &streams.Record{
		LeaseID:   newLeaseID(),
		Owner:     owner,
		Tenant:    tenant,
		RequestID: requestID,
		GrantedAt: streams.FormatTime(now),
	}
	setExpiry(rec, now, ttl, holdUntil)
	return rec
}

// setExpiry sets rec's TTL and times for a write at now: ttl, shortened so
// that the lease never outlasts holdUntil.
func setExpiry(rec *streams.Record, now time.Time, ttl time.Duration, holdUntil time.Time) {
	if !holdUntil.IsZero() {
		ttl = min(ttl, holdUntil.Sub(now))
		rec.HoldUntil = streams.FormatTime(holdUntil)
	}
	rec.TTLms = ttl.Milliseconds()
	rec.RenewedAt = streams.FormatTime(now)
	rec.ExpiresAt = streams.FormatTime(now.Add(ttl))
}

// holdUntil returns the hold limit a lease record carries, or the zero
// time.
func holdUntil(rec *streams.Record) time.Time {
	if rec.HoldUntil == "" {
		return time.Time{}
	}
	t, err := streams.ParseTime(rec.HoldUntil)
	if err != nil {
		return time.Time{}
	}
	return t
}

// errHoldOver is returned when a lease has been held for its max hold.
var errHoldOver = errors.New("lease held for its max hold")

// leaseResponse is the answer that hands out the lease rec, whose token is
// token.
func leaseResponse(resource string, token uint64, rec *streams.Record) *streams.LeaseResponse {
	return &streams.LeaseResponse{Resource: resource, LeaseID: rec.LeaseID, Token: token, TTLms: rec.TTLms,
		ExpiresAt: rec.ExpiresAt, HoldUntil: rec.HoldUntil}
}
