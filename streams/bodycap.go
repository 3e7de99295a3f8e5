package streams

// The body cap. A deployment refuses a request body larger than a bound
// (lockd --max-body) before decoding it; every request the contract
// allows must fit. MaxRequestBytes derives that bound from the contract's
// field limits, so that it follows them when they change.

// Worst cases of one field as a JSON encoder writes it. Free text (a
// request id, owner, value or reason) may need six bytes a byte: an
// encoder that escapes HTML, as Go's encoding/json does, writes '<' as
// \u003c. Resource names and ids of the service's own need no escape.
const (
	escapedByte = 6
	maxNumber   = 20 // an int64 or uint64 in decimal, with its sign
)

// MaxRequestBytes is the largest body of a valid request, written as
// compact JSON with every field at its longest, for a deployment whose
// lock sets have at most maxSetSize resources: an acquire (or a renewal)
// of a set of that many names of MaxResourceLen bytes, its free text
// escaped as an encoder may. Whitespace beyond compact JSON is the
// sender's choice and not counted.
func MaxRequestBytes(maxSetSize int) int {
	set := len(`"resources":[]`) + maxSetSize*(MaxResourceLen+len(`"",`))
	text := func(name string, n int) int { return len(name) + len(`"":"",`) + n*escapedByte }
	num := func(name string) int { return len(name) + len(`"":,`) + maxNumber }
	acquire := len(`{}`) + set + text("request_id", MaxRequestIDLen) + text("owner", MaxOwnerLen) +
		num("ttl_ms") + num("wait_ms") + num("max_hold_ms") + num("limit") +
		len(`"session_id":"",`) + SessionIDLen + text("value", MaxValueLen)
	renew := len(`{}`) + set + len(`"lease_id":"",`) + MaxLeaseIDLen*escapedByte + num("ttl_ms") + num("permit") +
		text("value", MaxValueLen)
	return max(acquire, renew)
}
