package streams

import (
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
)

// Encoders for the bodies the service writes on every request: the lease
// record it stores, the mark a delete carries, and its two common answers.
// Each appends what json.Marshal (encoding/json/v2) would produce, byte for
// byte, in a fraction of its time (measured: BenchmarkEncodeRecord); the
// fuzz test FuzzAppendJSON holds them to that. A string that is not valid
// UTF-8 has its bad bytes replaced with U+FFFD, as encoding/json does; a
// nil pointer is null.

func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			b, _ = jsontext.AppendQuote(b, s) // the error only reports replaced bytes
			return b
		}
	}
	// Printable ASCII with nothing to escape (every name, id and time
	// jetlock writes): the quoted form is the string itself.
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func appendField(b []byte, name, s string) []byte {
	b = append(b, name...)
	return appendString(b, s)
}

// AppendJSON appends r encoded as JSON to b.
func (r *Record) AppendJSON(b []byte) []byte {
	if r == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	if r.LeaseID != "" {
		b = append(appendField(b, `"lease_id":`, r.LeaseID), ',')
	}
	if r.Owner != "" {
		b = append(appendField(b, `"owner":`, r.Owner), ',')
	}
	if r.Tenant != "" {
		b = append(appendField(b, `"tenant":`, r.Tenant), ',')
	}
	b = appendField(b, `"request_id":`, r.RequestID)
	b = strconv.AppendInt(append(b, `,"ttl_ms":`...), r.TTLms, 10)
	b = strconv.AppendUint(append(b, `,"token":`...), r.Token, 10)
	b = appendField(b, `,"granted_at":`, r.GrantedAt)
	b = appendField(b, `,"renewed_at":`, r.RenewedAt)
	b = appendField(b, `,"expires_at":`, r.ExpiresAt)
	if r.HoldUntil != "" {
		b = appendField(b, `,"hold_until":`, r.HoldUntil)
	}
	if r.Wake != "" {
		b = appendField(b, `,"wake":`, r.Wake)
	}
	if r.LeaseTTLms != 0 {
		b = strconv.AppendInt(append(b, `,"lease_ttl_ms":`...), r.LeaseTTLms, 10)
	}
	if r.MaxHoldMs != 0 {
		b = strconv.AppendInt(append(b, `,"max_hold_ms":`...), r.MaxHoldMs, 10)
	}
	if r.Session != "" {
		b = appendField(b, `,"session":`, r.Session)
	}
	if r.Set != "" {
		b = appendField(b, `,"set":`, r.Set)
		b = strconv.AppendInt(append(b, `,"set_size":`...), int64(r.SetSize), 10)
	}
	if r.Limit != 0 {
		b = strconv.AppendInt(append(b, `,"limit":`...), int64(r.Limit), 10)
	}
	if r.Value != "" {
		b = appendField(b, `,"value":`, r.Value)
	}
	return append(b, '}')
}

// AppendJSON appends m encoded as JSON to b.
func (m *EndMark) AppendJSON(b []byte) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	b = appendField(append(b, '{'), `"ended_request_id":`, m.RequestID)
	if m.Tenant != "" {
		b = appendField(b, `,"ended_tenant":`, m.Tenant)
	}
	b = appendField(b, `,"ended_at":`, m.EndedAt)
	if m.Why != "" {
		b = appendField(b, `,"why":`, m.Why)
	}
	if m.Reason != "" {
		b = appendField(b, `,"reason":`, m.Reason)
	}
	return append(b, '}')
}

// AppendJSON appends r encoded as JSON to b.
func (r *LeaseResponse) AppendJSON(b []byte) []byte {
	if r == nil {
		return append(b, "null"...)
	}
	b = appendField(append(b, '{'), `"resource":`, r.Resource)
	b = appendField(b, `,"lease_id":`, r.LeaseID)
	b = strconv.AppendUint(append(b, `,"token":`...), r.Token, 10)
	b = strconv.AppendInt(append(b, `,"ttl_ms":`...), r.TTLms, 10)
	b = appendField(b, `,"expires_at":`, r.ExpiresAt)
	if r.HoldUntil != "" {
		b = appendField(b, `,"hold_until":`, r.HoldUntil)
	}
	if r.Permit != 0 {
		b = strconv.AppendInt(append(b, `,"permit":`...), int64(r.Permit), 10)
	}
	return append(b, '}')
}

// AppendJSON appends r encoded as JSON to b.
func (r *ReleaseResponse) AppendJSON(b []byte) []byte {
	if r == nil {
		return append(b, "null"...)
	}
	b = appendField(append(b, '{'), `"resource":`, r.Resource)
	b = strconv.AppendBool(append(b, `,"released":`...), r.Released)
	return append(b, '}')
}
