package streams

import (
	"strconv"
	"strings"

	"github.com/go-json-experiment/json"
)

// Sessions. A session is kept alive by one keepalive however many leases
// and waits it holds; when it ends (closed, or not kept alive for its TTL)
// every lease it holds and every wait it made ends with it.

// Session operations: what follows the version token of their subjects.
const (
	OpSessionOpen      = "session.open"
	OpSessionKeepalive = "session.keepalive"
	OpSessionClose     = "session.close"
)

// SessionOpenRequest is the body of a session.open request. It is
// idempotent by request_id (from the same NATS user) like an acquire: a
// retry gets the same session while it lives, lease_lost once it ended.
type SessionOpenRequest struct {
	RequestID string `json:"request_id"`
	Owner     string `json:"owner,omitempty"`
	TTLms     int64  `json:"ttl_ms,omitempty"`
}

// SessionKeepaliveRequest is the body of a session.keepalive request; a
// ttl_ms sets the session's TTL from now on.
type SessionKeepaliveRequest struct {
	SessionID string `json:"session_id"`
	TTLms     int64  `json:"ttl_ms,omitempty"`
}

// SessionCloseRequest is the body of a session.close request.
type SessionCloseRequest struct {
	SessionID string `json:"session_id"`
}

// SessionResponse answers a session.open.
type SessionResponse struct {
	SessionID string `json:"session_id"`
	TTLms     int64  `json:"ttl_ms"`
	ExpiresAt string `json:"expires_at"`
}

// KeepaliveResponse answers a session.keepalive: the session's TTL, its
// expiry as the service sees it, and the leases it holds.
type KeepaliveResponse struct {
	SessionID string `json:"session_id"`
	TTLms     int64  `json:"ttl_ms"`
	ExpiresAt string `json:"expires_at"`
	Leases    int    `json:"leases"`
}

// SessionCloseResponse answers a session.close: Closed is true when this
// request ended the session (false when it had ended already, or was never
// this caller's), Released the number of leases that ended with it.
type SessionCloseResponse struct {
	Closed   bool `json:"closed"`
	Released int  `json:"released"`
}

// A session id is the session's key hash (SessionHashLen hex digits, which
// names its record in the bucket) followed by its secret (SessionSecretLen
// hex digits, 128 random bits): SessionIDLen lowercase hex digits in all.
// Callers treat it as opaque.
const (
	SessionHashLen   = 40
	SessionSecretLen = 32
	SessionIDLen     = SessionHashLen + SessionSecretLen
)

// SessionKeyPrefix is the KV key prefix of session records.
const SessionKeyPrefix = "session."

// SessionKey returns the KV key of the session whose key hash is hash.
func SessionKey(hash string) string { return SessionKeyPrefix + hash }

// SplitSessionID returns the key hash and the secret of a session id, or
// an invalid_request error when id does not have a session id's form.
func SplitSessionID(id string) (hash, secret string, err error) {
	if len(id) != SessionIDLen {
		return "", "", invalidf("session_id must be %d hex digits, got %d bytes", SessionIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", "", invalidf("session_id must be %d lowercase hex digits: byte %d is not", SessionIDLen, i)
		}
	}
	return id[:SessionHashLen], id[SessionHashLen:], nil
}

// ValidateSessionID checks the form of a session id.
func ValidateSessionID(id string) error {
	_, _, err := SplitSessionID(id)
	return err
}

// Validate checks a session.open's request id, owner and ttl_ms sign; the
// service checks ttl_ms against its bounds.
func (r *SessionOpenRequest) Validate() error {
	return firstError(ValidateRequestID(r.RequestID), ValidateOwner(r.Owner), nonNegative("ttl_ms", r.TTLms))
}

// Validate checks a keepalive's session id and ttl_ms sign.
func (r *SessionKeepaliveRequest) Validate() error {
	return firstError(ValidateSessionID(r.SessionID), nonNegative("ttl_ms", r.TTLms))
}

// Validate checks a close's session id.
func (r *SessionCloseRequest) Validate() error { return ValidateSessionID(r.SessionID) }

// Session is a session record as the bucket holds it, at key
// SessionKey(hash). Secret is the second half of the session id: only the
// session's holder (and whoever may read the bucket: the service and its
// operators) knows it. The service keeps a session in memory as a Record
// (SessionOf and Session.Record convert): LeaseID is the secret, GrantedAt
// when it opened, RenewedAt its last keepalive.
type Session struct {
	Owner     string `json:"owner,omitempty"`
	Tenant    string `json:"tenant,omitempty"`
	RequestID string `json:"request_id"`
	Secret    string `json:"secret"`
	TTLms     int64  `json:"ttl_ms"`
	OpenedAt  string `json:"opened_at"`
	KeptAt    string `json:"kept_alive_at"`
	ExpiresAt string `json:"expires_at"`
}

// SessionOf returns the bucket form of r, a session held as a Record.
func SessionOf(r *Record) *Session {
	return &Session{Owner: r.Owner, Tenant: r.Tenant, RequestID: r.RequestID, Secret: r.LeaseID, TTLms: r.TTLms,
		OpenedAt: r.GrantedAt, KeptAt: r.RenewedAt, ExpiresAt: r.ExpiresAt}
}

// Record returns s as the service holds a session in memory.
func (s *Session) Record() *Record {
	return &Record{Owner: s.Owner, Tenant: s.Tenant, RequestID: s.RequestID, LeaseID: s.Secret, TTLms: s.TTLms,
		GrantedAt: s.OpenedAt, RenewedAt: s.KeptAt, ExpiresAt: s.ExpiresAt}
}

// AppendJSON appends s encoded as JSON to b.
func (s *Session) AppendJSON(b []byte) []byte {
	b = append(b, '{')
	if s.Owner != "" {
		b = append(appendField(b, `"owner":`, s.Owner), ',')
	}
	if s.Tenant != "" {
		b = append(appendField(b, `"tenant":`, s.Tenant), ',')
	}
	b = appendField(b, `"request_id":`, s.RequestID)
	b = appendField(b, `,"secret":`, s.Secret)
	b = strconv.AppendInt(append(b, `,"ttl_ms":`...), s.TTLms, 10)
	b = appendField(b, `,"opened_at":`, s.OpenedAt)
	b = appendField(b, `,"kept_alive_at":`, s.KeptAt)
	b = appendField(b, `,"expires_at":`, s.ExpiresAt)
	return append(b, '}')
}

// ParseSession parses the value stored at revision rev of a session key
// into the Record the service holds it as. Anything but a complete session
// record is an error wrapping ErrForeign.
func ParseSession(b []byte, rev uint64) (*Record, error) {
	var s Session
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, foreignf("%w", err)
	}
	if len(s.Secret) != SessionSecretLen || strings.Trim(s.Secret, "0123456789abcdef") != "" {
		return nil, foreignf("a session record without a %d-digit secret", SessionSecretLen)
	}
	r := s.Record()
	if err := r.checkCommon(rev); err != nil {
		return nil, err
	}
	return r, nil
}
