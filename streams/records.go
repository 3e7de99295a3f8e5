package streams

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
)

// MaxRecordTTL is the longest TTL a record in the bucket may carry: a
// lease's, or a waiter's liveness window. No deployment may allow longer
// leases (the service's MaxTTL is bounded by it), so a record that claims
// more was not written by jetlock.
const MaxRecordTTL = 24 * time.Hour

// ErrForeign is wrapped by ParseLease and ParseWaiter when a value is not
// a complete jetlock record: something else wrote it (nats kv put, another
// program, a corrupted write). Such a value is never anyone's lease or
// waiter.
var ErrForeign = errors.New("not a jetlock record")

func foreignf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrForeign}, args...)...)
}

// decodeRecord parses a stored record. Unknown fields are ignored, so that
// a newer service may add some.
func decodeRecord(b []byte) (*Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, foreignf("%w", err)
	}
	return &r, nil
}

// checkCommon checks what lease and waiter records share: a request id, a
// TTL within (0, MaxRecordTTL], and a token that is 0 (this revision) or
// an earlier revision than rev, the record's own.
func (r *Record) checkCommon(rev uint64) error {
	if err := ValidateRequestID(r.RequestID); err != nil {
		return foreignf("%w", err)
	}
	if r.TTLms <= 0 || r.TTLms > MaxRecordTTL.Milliseconds() {
		return foreignf("ttl_ms %d outside (0, %d]", r.TTLms, MaxRecordTTL.Milliseconds())
	}
	if r.Token != 0 && r.Token >= rev {
		return foreignf("token %d not below the record's revision %d", r.Token, rev)
	}
	if err := ValidateOwner(r.Owner); err != nil {
		return foreignf("%w", err)
	}
	if len(r.Tenant) > MaxTenantLen {
		return foreignf("tenant of %d bytes, over %d", len(r.Tenant), MaxTenantLen)
	}
	return nil
}

// ParseLease parses the value stored at revision rev of a lease key. A
// value that is not a complete lease record (lease id, request id, TTL,
// token semantics) is an error wrapping ErrForeign.
func ParseLease(b []byte, rev uint64) (*Record, error) {
	r, err := decodeRecord(b)
	if err != nil {
		return nil, err
	}
	if err := ValidateLeaseID(r.LeaseID); err != nil {
		return nil, foreignf("%w", err)
	}
	if r.Wake != "" {
		return nil, foreignf("a lease record names a wake subject")
	}
	if err := r.checkCommon(rev); err != nil {
		return nil, err
	}
	return r, nil
}

// ParseWaiter parses the value stored at revision rev of a waiter key (a
// Waiter) into the Record the service holds it as. A waiter record has no
// lease id and names a wake subject under wakeRoot (the service's
// "<prefix>.wake."); anything else is an error wrapping ErrForeign. A
// record in the lease record's form, as releases before Waiter wrote them,
// is read too: one may still be queued while an instance of that release
// serves during a rolling upgrade (it lives for a liveness window).
func ParseWaiter(b []byte, rev uint64, wakeRoot string) (*Record, error) {
	var form struct {
		Waiter
		LeaseID string `json:"lease_id"`
		TTLms   int64  `json:"ttl_ms"`
	}
	if err := json.Unmarshal(b, &form); err != nil {
		return nil, foreignf("%w", err)
	}
	if form.LeaseID != "" {
		return nil, foreignf("a waiter record carries a lease id")
	}
	r := form.Waiter.Record()
	if form.LivenessMs == 0 && form.TTLms != 0 {
		if r, _ = decodeRecord(b); r == nil {
			return nil, foreignf("unreadable waiter record")
		}
	}
	if !strings.HasPrefix(r.Wake, wakeRoot) || len(r.Wake) == len(wakeRoot) {
		return nil, foreignf("wake subject %q not under %q", r.Wake, wakeRoot)
	}
	if r.LeaseTTLms < 0 || r.MaxHoldMs < 0 {
		return nil, foreignf("negative lease_ttl_ms or max_hold_ms")
	}
	if err := r.checkCommon(rev); err != nil {
		return nil, err
	}
	return r, nil
}
