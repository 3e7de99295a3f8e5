package streams

import (
	"time"

	"github.com/go-json-experiment/json"
)

// TimeFormat is the layout of every time on the wire: RFC 3339 with
// milliseconds, in UTC.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// FormatTime renders t for the wire, in UTC: what t.UTC().Format(TimeFormat)
// renders (milliseconds truncated), without interpreting the layout on
// every call; every record written carries two or three of these.
func FormatTime(t time.Time) string {
	t = t.UTC()
	y, mo, d := t.Date()
	if y < 0 || y > 9999 {
		return t.Format(TimeFormat)
	}
	h, mi, sec := t.Clock()
	var b [24]byte
	put := func(at, v, digits int) {
		for i := at + digits - 1; i >= at; i-- {
			b[i] = byte('0' + v%10)
			v /= 10
		}
	}
	put(0, y, 4)
	put(5, int(mo), 2)
	put(8, d, 2)
	put(11, h, 2)
	put(14, mi, 2)
	put(17, sec, 2)
	put(20, t.Nanosecond()/int(time.Millisecond), 3)
	b[4], b[7], b[10], b[13], b[16], b[19], b[23] = '-', '-', 'T', ':', ':', '.', 'Z'
	return string(b[:])
}

// ParseTime reads a time of the wire: what time.Parse(TimeFormat, s)
// reads. The form FormatTime writes is read without interpreting the
// layout (and checked by writing it again); any other goes to time.Parse.
func ParseTime(s string) (time.Time, error) {
	if len(s) == 24 && s[23] == 'Z' {
		n := func(at, digits int) int {
			v := 0
			for i := at; i < at+digits; i++ {
				if s[i] < '0' || s[i] > '9' {
					return -1
				}
				v = v*10 + int(s[i]-'0')
			}
			return v
		}
		y, mo, d, h, mi, sec, ms := n(0, 4), n(5, 2), n(8, 2), n(11, 2), n(14, 2), n(17, 2), n(20, 3)
		if min(y, mo, d, h, mi, sec, ms) >= 0 {
			t := time.Date(y, time.Month(mo), d, h, mi, sec, ms*int(time.Millisecond), time.UTC)
			if FormatTime(t) == s { // no field out of range, every separator in place
				return t, nil
			}
		}
	}
	return time.Parse(TimeFormat, s)
}

// AcquireRequest is the body of an acquire request. Resources, instead of
// Resource, asks for a lock set (see sets.go).
type AcquireRequest struct {
	Resource  string   `json:"resource,omitempty"`
	Resources []string `json:"resources,omitempty"`
	RequestID string   `json:"request_id"`
	Owner     string   `json:"owner,omitempty"`
	TTLms     int64    `json:"ttl_ms,omitempty"`
	WaitMs    int64    `json:"wait_ms,omitempty"`
	// MaxHoldMs bounds how long the lease may be held in total, renewals
	// included; the deployment's cap applies when it is absent or larger.
	MaxHoldMs int64 `json:"max_hold_ms,omitempty"`
	// SessionID, instead of TTLms, binds the lease (or the wait) to a
	// session: it lives as long as the session does.
	SessionID string `json:"session_id,omitempty"`
	// Limit makes resource a counting semaphore of Limit permits, one of
	// which is granted (see election.go).
	Limit int `json:"limit,omitempty"`
	// Value is the lease's value: an election's leader announces itself
	// with it (see election.go).
	Value string `json:"value,omitempty"`
}

// RenewRequest is the body of a renew request; Resources renews a set.
type RenewRequest struct {
	Resource  string   `json:"resource,omitempty"`
	Resources []string `json:"resources,omitempty"`
	LeaseID   string   `json:"lease_id"`
	TTLms     int64    `json:"ttl_ms,omitempty"`
	// Permit names the permit of a semaphore; Value, when set, replaces
	// the lease's value.
	Permit int    `json:"permit,omitempty"`
	Value  string `json:"value,omitempty"`
}

// ReleaseRequest is the body of a release request; Resources releases a
// set.
type ReleaseRequest struct {
	Resource  string   `json:"resource,omitempty"`
	Resources []string `json:"resources,omitempty"`
	LeaseID   string   `json:"lease_id"`
	Permit    int      `json:"permit,omitempty"`
}

// CancelRequest is the body of a cancel request; Resources cancels the
// acquire of a set.
type CancelRequest struct {
	Resource  string   `json:"resource,omitempty"`
	Resources []string `json:"resources,omitempty"`
	RequestID string   `json:"request_id"`
	// Owner is the owner the acquire named: a cancel belongs to the same
	// caller as an acquire exactly when tenant, owner and request id all
	// match, so a cancel never ends another owner's lease or wait.
	Owner string `json:"owner,omitempty"`
	Limit int    `json:"limit,omitempty"`
}

// StatusRequest is the body of a status request; with a Limit it asks
// about a semaphore.
type StatusRequest struct {
	Resource string `json:"resource"`
	Limit    int    `json:"limit,omitempty"`
}

// ListRequest is the body of a list request: the held leases whose
// resource starts with Prefix, in resource order, after the resource
// After, at most Limit (default DefaultListLimit, at most MaxListLimit).
type ListRequest struct {
	Prefix string `json:"prefix,omitempty"`
	After  string `json:"after,omitempty"`
	Limit  int    `json:"limit,omitempty"`
}

// List bounds.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// RevokeRequest is the body of an admin revoke request. Reason is
// required: it goes to the audit log.
type RevokeRequest struct {
	Resource string `json:"resource"`
	Reason   string `json:"reason"`
	// Permit names one permit of the semaphore Resource (1..its limit):
	// the revoke ends that permit's lease.
	Permit int `json:"permit,omitempty"`
}

// LeaseResponse answers a successful acquire or renew.
type LeaseResponse struct {
	Resource  string `json:"resource"`
	LeaseID   string `json:"lease_id"`
	Token     uint64 `json:"token"`
	TTLms     int64  `json:"ttl_ms"`
	ExpiresAt string `json:"expires_at"`
	// HoldUntil is when the lease ends at the latest, renewals included,
	// when a hold cap applies (the request's max_hold_ms or the
	// deployment's cap).
	HoldUntil string `json:"hold_until,omitempty"`
	// Permit is the permit granted, for a semaphore.
	Permit int `json:"permit,omitzero"`
}

// ReleaseResponse answers a release. Released is false when the lease was
// already gone.
type ReleaseResponse struct {
	Resource string `json:"resource"`
	Released bool   `json:"released"`
}

// CancelResponse answers a cancel. Cancelled is true when the cancel removed
// a waiter or released a lease.
type CancelResponse struct {
	Resource  string `json:"resource"`
	Cancelled bool   `json:"cancelled"`
}

// StatusResponse answers a status request. It never carries the lease id.
type StatusResponse struct {
	Resource string `json:"resource"`
	Held     bool   `json:"held"`
	// Owner is shown to the lease's own tenant (the NATS user that holds
	// it) and to operators; others see the lease without it.
	Owner     string `json:"owner,omitempty"`
	Token     uint64 `json:"token"`
	ExpiresAt string `json:"expires_at"`
	Waiters   int    `json:"waiters"`
	HoldUntil string `json:"hold_until,omitempty"`
	// InSession marks a lease held by a session; SessionOwner is that
	// session's owner, shown as Owner is. ExpiresAt of such a lease is its
	// session's.
	InSession    bool   `json:"in_session,omitzero"`
	SessionOwner string `json:"session_owner,omitempty"`
	// SetSize, for a lease of a lock set, is the number of resources the
	// set holds with this one (under the same lease).
	SetSize int `json:"set_size,omitzero"`
	// Value is the lease's value (an election's leader's), shown to
	// every caller.
	Value string `json:"value,omitempty"`
	// Limit is set when the name is a semaphore's (asked without its
	// limit): Held then tells whether any permit is held, HeldPermits how
	// many, and Permits lists them, as a SemaphoreStatus does.
	Limit       int          `json:"limit,omitzero"`
	HeldPermits int          `json:"held_permits,omitzero"`
	Permits     []PermitInfo `json:"permits,omitempty"`
}

// LeaseInfo is one held lease in a list reply. It never carries the lease
// id.
type LeaseInfo struct {
	Resource string `json:"resource"`
	// Owner is shown as in StatusResponse.
	Owner     string `json:"owner,omitempty"`
	Token     uint64 `json:"token"`
	ExpiresAt string `json:"expires_at"`
	Waiters   int    `json:"waiters"`
	HoldUntil string `json:"hold_until,omitempty"`
	// InSession, SessionOwner and SetSize are as in StatusResponse.
	InSession    bool   `json:"in_session,omitzero"`
	SessionOwner string `json:"session_owner,omitempty"`
	SetSize      int    `json:"set_size,omitzero"`
	// Permit, for a permit of a semaphore, is its number (Resource is
	// the semaphore's).
	Permit int `json:"permit,omitzero"`
}

// ListResponse answers a list request. Next, when set, is the After of
// the following page.
type ListResponse struct {
	Leases []LeaseInfo `json:"leases"`
	Next   string      `json:"next,omitempty"`
}

// RevokeResponse answers a revoke. Revoked is false when nobody held the
// resource; Token is the token of the lease it ended.
type RevokeResponse struct {
	Resource string `json:"resource"`
	// Permit is the permit revoked, when the request named one.
	Permit  int    `json:"permit,omitzero"`
	Revoked bool   `json:"revoked"`
	Token   uint64 `json:"token,omitempty"`
}

// Holder describes the current holder in a "locked" error. Resource names
// the resource it holds in the Holders of a set's "locked" error.
type Holder struct {
	Resource string `json:"resource,omitempty"`
	// Owner is shown as in StatusResponse.
	Owner     string `json:"owner,omitempty"`
	Token     uint64 `json:"token"`
	ExpiresAt string `json:"expires_at"`
}

// ErrorDetail is the error object of an error reply.
type ErrorDetail struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Holder  *Holder `json:"holder,omitempty"`
	// Holders, in the "locked" answer to a set, names every resource of
	// the set that was held, and by whom.
	Holders []Holder `json:"holders,omitempty"`
	// RetryAfterMs, on an "unavailable" answer to a caller over its
	// fair-use rate, is how long to wait before trying again.
	RetryAfterMs int64 `json:"retry_after_ms,omitempty"`
}

// ErrorResponse is the body of every error reply: {"error":{...}}.
type ErrorResponse struct {
	Error ErrorDetail `json:"error"`
}

// Record is the value stored in the bucket for a held lease, and for a
// waiter. Token zero in the granting write means "the revision of this
// write"; every renewal copies the grant revision into Token explicitly.
// HoldUntil, when set, is the latest a lease may last, renewals included.
//
// A waiter record has no LeaseID; its Token is its ticket (the revision
// that queued it, so FIFO order is ticket order), TTLms its liveness
// window, Wake the subject that wakes it, and LeaseTTLms and MaxHoldMs
// what its acquire asked for, so that whoever ends the lease before it
// can grant it in the same write.
//
// Tenant is who asked for the lease or the wait, as the NATS server
// vouched for it ("ACCOUNT/user", from the Nats-Request-Info header it
// stamps on a request that crosses an account import), or empty when the
// request carried no such identity. A retry or cancel by request_id counts
// only from the same tenant.
type Record struct {
	LeaseID    string `json:"lease_id,omitempty"`
	Owner      string `json:"owner,omitempty"`
	Tenant     string `json:"tenant,omitempty"`
	RequestID  string `json:"request_id"`
	TTLms      int64  `json:"ttl_ms"`
	Token      uint64 `json:"token"`
	GrantedAt  string `json:"granted_at"`
	RenewedAt  string `json:"renewed_at"`
	ExpiresAt  string `json:"expires_at"`
	HoldUntil  string `json:"hold_until,omitempty"`
	Wake       string `json:"wake,omitempty"`
	LeaseTTLms int64  `json:"lease_ttl_ms,omitzero"`
	MaxHoldMs  int64  `json:"max_hold_ms,omitzero"`
	// Session is the key hash of the session that holds the lease or made
	// the wait (see SessionKey), empty for a lease of its own.
	Session string `json:"session,omitempty"`
	// Set is the hash of the lock set a lease (or wait) is part of, and
	// SetSize its number of resources; a set's records share their lease
	// id (waiters: their request id) and end together.
	Set     string `json:"set,omitempty"`
	SetSize int    `json:"set_size,omitzero"`
	// Limit is the number of permits of the semaphore a permit (or a
	// waiter for one) belongs to; Value the lease's value (elections).
	Limit int    `json:"limit,omitzero"`
	Value string `json:"value,omitempty"`
}

// EndMark is the body of the delete marker that ends a lease (release,
// cancel, expiry): the request id of the lease it ended, and when. It keeps
// "that request's lease has ended" in the bucket, so that a retry of the
// request is answered lease_lost within the retry window even after every
// service instance and the cluster restarted (JetStream forgets message ids
// of overwritten messages when it restarts).
//
// Why says what ended it (EndRelease, EndExpiry, EndRevoke, EndCancel) and
// Reason, for a revoke, the operator's reason; both are empty in marks
// written by older releases.
type EndMark struct {
	RequestID string `json:"ended_request_id"`
	// Tenant is the tenant of the request whose lease ended (see Record).
	Tenant  string `json:"ended_tenant,omitempty"`
	EndedAt string `json:"ended_at"`
	Why     string `json:"why,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// What ended a lease, in EndMark.Why. A lease handed to the next waiter
// ends without a mark: the key's next write is the waiter's lease.
const (
	EndRelease = "release"
	EndExpiry  = "expiry"
	EndRevoke  = "revoke"
	EndCancel  = "cancel"
)

// DecodeEndMark parses the body of a delete marker; an empty body (a
// delete written by something else) is no mark.
func DecodeEndMark(b []byte) *EndMark {
	if len(b) == 0 {
		return nil
	}
	var m EndMark
	if json.Unmarshal(b, &m) != nil || m.RequestID == "" {
		return nil
	}
	return &m
}

// Ended reports whether m ended the lease of requestID of tenant no longer
// than window before now. A mark whose time cannot be read counts as
// recent.
func (m *EndMark) Ended(requestID, tenant string, now time.Time, window time.Duration) bool {
	if m == nil || m.RequestID != requestID || m.Tenant != tenant {
		return false
	}
	at, err := ParseTime(m.EndedAt)
	return err != nil || now.Sub(at) <= window
}

// TokenAt returns the fencing token of r stored at revision rev.
func (r *Record) TokenAt(rev uint64) uint64 {
	if r.Token == 0 {
		return rev
	}
	return r.Token
}
