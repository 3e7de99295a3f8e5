package streams

import "slices"

// The bodies of acquire, renew and release, decoded on every request, are
// flat objects of short ASCII strings and integers. decodeFlat reads that
// common form without reflection; anything else (an escape, a byte outside
// printable ASCII, a fraction or exponent, null, a repeated or unknown
// member, trailing data) makes it give up, and Decode hands the body to the
// JSON decoder, whose answer, value or error, stands. So the fast form
// only ever yields what the decoder would.

// flatBody is a request body decodeFlat can fill.
type flatBody interface {
	// setFlat sets member i of flatNames to s (isNum false) or n, and
	// reports false when the member has the other type.
	setFlat(i int, s string, n int64, isNum bool) bool
	flatNames() []string
	resetFlat() // zeroes the body
}

// decodeFlat fills v from data, an object with no leading or trailing
// whitespace, and reports whether it could; when it could not, v may be
// partly filled and must be zeroed (resetFlat).
func decodeFlat(data []byte, v flatBody) bool {
	r := flatReader{data: data}
	names := v.flatNames()
	var seen uint32
	i := skipSpace(data, 1) // data[0] is '{'
	if i < len(data) && data[i] == '}' {
		return i == len(data)-1
	}
	for {
		from, to, ok := flatString(data, i)
		if !ok {
			return false
		}
		field := slices.Index(names, string(data[from:to])) // compared without a copy
		if field < 0 || seen&(1<<field) != 0 {
			return false
		}
		seen |= 1 << field
		i = skipSpace(data, to+1)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		if i, ok = r.value(skipSpace(data, i+1), field, v); !ok {
			return false
		}
		i = skipSpace(data, i)
		if i >= len(data) {
			return false
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
		case '}':
			return i == len(data)-1
		default:
			return false
		}
	}
}

// flatReader holds a body being read. Every string value is a copy of its
// own bytes, never a slice of the body: a value kept for a lease's life
// (its owner, its request id) must not keep the whole request alive.
type flatReader struct {
	data []byte
}

// value reads the value of member field at data[i] into v and returns the
// index after it.
func (r *flatReader) value(i, field int, v flatBody) (int, bool) {
	if i >= len(r.data) {
		return 0, false
	}
	if r.data[i] != '"' {
		n, next, ok := flatInt(r.data, i)
		return next, ok && v.setFlat(field, "", n, true)
	}
	from, to, ok := flatString(r.data, i)
	if !ok {
		return 0, false
	}
	return to + 1, v.setFlat(field, string(r.data[from:to]), 0, false)
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && isJSONSpace(data[i]) {
		i++
	}
	return i
}

// isJSONSpace reports whether c is whitespace to JSON (RFC 8259): space,
// tab, line feed and carriage return, nothing else.
func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// trimJSONSpace trims JSON whitespace around data.
func trimJSONSpace(data []byte) []byte {
	i, j := 0, len(data)
	for i < j && isJSONSpace(data[i]) {
		i++
	}
	for j > i && isJSONSpace(data[j-1]) {
		j--
	}
	return data[i:j]
}

// flatString reads a string of printable ASCII without escapes at
// data[i], a '"': its contents are data[from:to], and the closing quote
// is at to.
func flatString(data []byte, i int) (from, to int, ok bool) {
	if i >= len(data) || data[i] != '"' {
		return 0, 0, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return i + 1, j, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return 0, 0, false
		}
	}
	return 0, 0, false
}

// flatInt reads an integer of at most 18 digits, no fraction or exponent,
// at data[i].
func flatInt(data []byte, i int) (int64, int, bool) {
	neg := i < len(data) && data[i] == '-'
	if neg {
		i++
	}
	start := i
	var n int64
	for i < len(data) && data[i] >= '0' && data[i] <= '9' {
		n = n*10 + int64(data[i]-'0')
		i++
	}
	digits := i - start
	if digits == 0 || digits > 18 || (digits > 1 && data[start] == '0') {
		return 0, 0, false
	}
	if i < len(data) && (data[i] == '.' || data[i] == 'e' || data[i] == 'E') {
		return 0, 0, false
	}
	if neg {
		n = -n
	}
	return n, i, true
}

var (
	acquireNames = []string{"resource", "request_id", "owner", "ttl_ms", "wait_ms", "max_hold_ms", "session_id"}
	renewNames   = []string{"resource", "lease_id", "ttl_ms"}
	releaseNames = []string{"resource", "lease_id"}
)

func (r *AcquireRequest) flatNames() []string { return acquireNames }

func (r *AcquireRequest) setFlat(i int, s string, n int64, isNum bool) bool {
	if isNum != (i >= 3 && i <= 5) {
		return false
	}
	switch i {
	case 0:
		r.Resource = s
	case 1:
		r.RequestID = s
	case 2:
		r.Owner = s
	case 3:
		r.TTLms = n
	case 4:
		r.WaitMs = n
	case 5:
		r.MaxHoldMs = n
	default:
		r.SessionID = s
	}
	return true
}

func (r *AcquireRequest) resetFlat() { *r = AcquireRequest{} }

func (r *RenewRequest) flatNames() []string { return renewNames }

func (r *RenewRequest) resetFlat() { *r = RenewRequest{} }

func (r *RenewRequest) setFlat(i int, s string, n int64, isNum bool) bool {
	switch {
	case i == 2 && isNum:
		r.TTLms = n
	case i == 0 && !isNum:
		r.Resource = s
	case i == 1 && !isNum:
		r.LeaseID = s
	default:
		return false
	}
	return true
}

func (r *ReleaseRequest) flatNames() []string { return releaseNames }

func (r *ReleaseRequest) resetFlat() { *r = ReleaseRequest{} }

func (r *ReleaseRequest) setFlat(i int, s string, _ int64, isNum bool) bool {
	if isNum {
		return false
	}
	if i == 0 {
		r.Resource = s
	} else {
		r.LeaseID = s
	}
	return true
}
