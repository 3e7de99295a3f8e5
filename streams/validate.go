package streams

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
)

// Field limits of the wire contract.
const (
	MaxResourceLen  = 200
	MaxRequestIDLen = 128
	MaxOwnerLen     = 128
	MaxLeaseIDLen   = 64
	// MaxTenantLen bounds a record's tenant: an account name and a user
	// name as the NATS server reports them (an nkey is 56 bytes).
	MaxTenantLen = 512
)

// ErrInvalid is wrapped by every validation and decoding error; the service
// answers it with CodeInvalidRequest.
var ErrInvalid = errors.New("invalid request")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// MaxEcho is how many bytes of a caller's name (a field name, a resource,
// a key) an error message repeats: enough to recognise it, while a reply
// to a request with a name of thousands of bytes stays short.
const MaxEcho = 64

// Echo returns s as an error message repeats it: whole up to MaxEcho
// bytes, else its first MaxEcho bytes (cut at a UTF-8 boundary) and
// "…(N bytes)" with its full length.
func Echo(s string) string { return cut(s, MaxEcho) }

// cut returns s whole up to n bytes, else its first n bytes (at a UTF-8
// boundary) and "…(N bytes)".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:i], len(s))
}

// maxDecodeMessage bounds the decoder's own words in a malformed-JSON
// error: they quote the JSON pointer of the bad value, whose member names
// the caller chose.
const maxDecodeMessage = 256

// Decode parses a request body into v strictly: unknown or repeated
// fields, field names in another case, invalid UTF-8, trailing data and
// anything but a JSON object are errors wrapping ErrInvalid. An unknown
// field is refused because a misspelt option ("ttl" for "ttl_ms") would
// otherwise be ignored silently. (It uses the encoding/json/v2 prototype,
// which decodes several times faster than encoding/json.)
//
// Whitespace around the object is what JSON allows (space, tab, CR, LF);
// any other byte there, \v or U+00A0 included, is malformed.
func Decode(data []byte, v any) error {
	data = trimJSONSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return invalidf("body must be a JSON object")
	}
	if fb, ok := v.(flatBody); ok {
		if decodeFlat(data, fb) {
			return nil
		}
		fb.resetFlat()
	}
	if err := json.Unmarshal(data, v, json.RejectUnknownMembers(true)); err != nil {
		var serr *json.SemanticError
		if errors.As(err, &serr) && errors.Is(serr.Err, json.ErrUnknownName) {
			// json/v2 says "cannot unmarshal JSON string into Go
			// streams.AcquireRequest: unknown object member name".
			return invalidf("unknown field %q", Echo(serr.JSONPointer.LastToken()))
		}
		return invalidf("malformed JSON: %s", cut(err.Error(), maxDecodeMessage))
	}
	return nil
}

func resourceByteOK(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("-_./=:@", c) >= 0
}

// ValidateResource checks a resource name: 1 to 200 bytes of letters,
// digits and "- _ . / = : @", not starting or ending with '.' or '/'.
func ValidateResource(r string) error {
	if r == "" {
		return invalidf("resource is required")
	}
	if len(r) > MaxResourceLen {
		return invalidf("resource is %d bytes, at most %d allowed", len(r), MaxResourceLen)
	}
	for i := 0; i < len(r); i++ {
		if !resourceByteOK(r[i]) {
			return invalidf("resource has a character outside letters, digits and - _ . / = : @ at byte %d", i)
		}
	}
	if r[0] == '.' || r[0] == '/' || r[len(r)-1] == '.' || r[len(r)-1] == '/' {
		return invalidf("resource must not start or end with '.' or '/'")
	}
	return nil
}

func validateText(field string, s string, maxLen int, required bool) error {
	if s == "" {
		if required {
			return invalidf("%s is required", field)
		}
		return nil
	}
	if len(s) > maxLen {
		return invalidf("%s is %d bytes, at most %d allowed", field, len(s), maxLen)
	}
	if !utf8.ValidString(s) {
		return invalidf("%s is not valid UTF-8", field)
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return invalidf("%s contains a control character", field)
		}
	}
	return nil
}

// ValidateRequestID checks a request id: 1 to 128 bytes of UTF-8 text
// without control characters.
func ValidateRequestID(id string) error { return validateText("request_id", id, MaxRequestIDLen, true) }

// ValidateOwner checks an owner: at most 128 bytes of UTF-8 text without
// control characters; empty is allowed.
func ValidateOwner(o string) error { return validateText("owner", o, MaxOwnerLen, false) }

// ValidateLeaseID checks the shape of a lease id (1 to 64 bytes of text).
// It says nothing about whether the lease exists.
func ValidateLeaseID(id string) error { return validateText("lease_id", id, MaxLeaseIDLen, true) }

const hexDigits = "0123456789ABCDEF"

func keepInKey(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return c == '-' || c == '_' || c == '/'
}

// EncodeResource maps a valid resource name to the part of a KV key that
// follows the key prefix: letters, digits, '-', '_' and '/' stay, every
// other byte becomes '=' and two upper-case hex digits. The mapping is
// one-to-one and DecodeResource inverts it.
func EncodeResource(r string) string {
	var b strings.Builder
	b.Grow(len(r) + 8)
	for i := 0; i < len(r); i++ {
		c := r[i]
		if keepInKey(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xf])
	}
	return b.String()
}

// DecodeResource inverts EncodeResource.
func DecodeResource(k string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c != '=' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(k) {
			return "", invalidf("truncated escape in key %q", Echo(k))
		}
		hi, lo := strings.IndexByte(hexDigits, k[i+1]), strings.IndexByte(hexDigits, k[i+2])
		if hi < 0 || lo < 0 {
			return "", invalidf("bad escape in key %q", Echo(k))
		}
		b.WriteByte(byte(hi<<4 | lo))
		i += 2
	}
	return b.String(), nil
}

// LeaseKeyPrefix is the KV key prefix of lease records.
const LeaseKeyPrefix = "lease."

// LeaseKey returns the KV key of the lease record of resource r.
func LeaseKey(r string) string { return LeaseKeyPrefix + EncodeResource(r) }

// WaitKeyPrefix is the KV key prefix of waiter records.
const WaitKeyPrefix = "wait."

// WaitKey returns the KV key of the waiter record of request id (an opaque
// token of letters and digits) on resource r:
// "wait." + EncodeResource(r) + "." + id. The encoded resource never
// contains '.', so the key splits unambiguously.
func WaitKey(r, id string) string { return WaitKeyPrefix + EncodeResource(r) + "." + id }

// MaxReasonLen bounds a revoke's reason.
const MaxReasonLen = 256

// MaxHoldCeiling bounds max_hold_ms when a deployment sets no cap.
const MaxHoldCeiling = 366 * 24 * time.Hour

// ValidateReason checks a revoke's reason: 1 to 256 bytes of UTF-8 text
// without control characters.
func ValidateReason(r string) error { return validateText("reason", r, MaxReasonLen, true) }

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Validate checks the fields of an acquire whose rules do not depend on the
// deployment: resource, request id, owner, and numbers not negative. The
// service checks ttl_ms, wait_ms and max_hold_ms against its bounds.
func (r *AcquireRequest) Validate() error {
	if r.SessionID != "" {
		if r.TTLms != 0 {
			return invalidf("ttl_ms and session_id together: a session's lease lives as long as its session")
		}
		if err := ValidateSessionID(r.SessionID); err != nil {
			return err
		}
	}
	if r.Limit != 0 && r.Resources != nil {
		return invalidf("limit and resources together: a semaphore is one resource")
	}
	return firstError(oneOf(r.Resource, r.Resources), ValidateRequestID(r.RequestID), ValidateOwner(r.Owner),
		nonNegative("ttl_ms", r.TTLms), nonNegative("wait_ms", r.WaitMs), nonNegative("max_hold_ms", r.MaxHoldMs),
		validateLimit(r.Limit), ValidateValue(r.Value))
}

// Validate checks a renew's resource, lease id and ttl_ms sign.
func (r *RenewRequest) Validate() error {
	return firstError(oneOf(r.Resource, r.Resources), ValidateLeaseID(r.LeaseID), nonNegative("ttl_ms", r.TTLms),
		validatePermit(r.Permit), ValidateValue(r.Value))
}

// Validate checks a release's resource and lease id.
func (r *ReleaseRequest) Validate() error {
	return firstError(oneOf(r.Resource, r.Resources), ValidateLeaseID(r.LeaseID), validatePermit(r.Permit))
}

// Validate checks a cancel's resource and request id.
func (r *CancelRequest) Validate() error {
	return firstError(oneOf(r.Resource, r.Resources), ValidateRequestID(r.RequestID), ValidateOwner(r.Owner), validateLimit(r.Limit))
}

// Validate checks a status request's resource.
func (r *StatusRequest) Validate() error {
	return firstError(ValidateResource(r.Resource), validateLimit(r.Limit))
}

// Validate checks a list request: the prefix is at most 200 bytes of the
// characters a resource name may hold (it may end with '.' or '/'), after
// is empty or a resource name, and limit lies in 0..1000 (0: the default).
func (r *ListRequest) Validate() error {
	if len(r.Prefix) > MaxResourceLen {
		return invalidf("prefix is %d bytes, at most %d allowed", len(r.Prefix), MaxResourceLen)
	}
	for i := 0; i < len(r.Prefix); i++ {
		if !resourceByteOK(r.Prefix[i]) {
			return invalidf("prefix has a character outside letters, digits and - _ . / = : @ at byte %d", i)
		}
	}
	if r.After != "" {
		if err := ValidateResource(r.After); err != nil {
			return invalidf("after: %w", err)
		}
	}
	if r.Limit < 0 || r.Limit > MaxListLimit {
		return invalidf("limit %d outside [0, %d]", r.Limit, MaxListLimit)
	}
	return nil
}

// Validate checks a revoke's resource and reason.
func (r *RevokeRequest) Validate() error {
	return firstError(ValidateResource(r.Resource), ValidateReason(r.Reason), validatePermit(r.Permit))
}

func nonNegative(field string, n int64) error {
	if n < 0 {
		return invalidf("%s %d is negative", field, n)
	}
	return nil
}
