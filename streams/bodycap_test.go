package streams_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/jetlock/jetlock/streams"
)

// The largest request the contract allows, encoded by encoding/json (which
// escapes '<' as \u003c), fits the derived cap, for the default set size
// and the largest; and it is valid, so the cap does not refuse what the
// contract allows.
func TestMaxRequestBytesFitsTheLargestRequest(t *testing.T) {
	for _, size := range []int{2, streams.DefaultSetSize, streams.MaxSetSize} {
		names := make([]string, size)
		for i := range names {
			n := strings.Repeat("a", streams.MaxResourceLen-4)
			names[i] = n + string(rune('a'+i/26/26%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i%26)) + "z"
		}
		req := streams.AcquireRequest{Resources: names, RequestID: strings.Repeat("<", streams.MaxRequestIDLen),
			Owner: strings.Repeat("<", streams.MaxOwnerLen), TTLms: -1 << 63, WaitMs: -1 << 63, MaxHoldMs: -1 << 63,
			SessionID: strings.Repeat("a", streams.SessionIDLen), Value: strings.Repeat("<", streams.MaxValueLen)}
		body, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if got, limit := len(body), streams.MaxRequestBytes(size); got > limit {
			t.Errorf("set of %d: the largest acquire takes %d bytes, over the derived cap %d", size, got, limit)
		}
		renew := streams.RenewRequest{Resources: names, LeaseID: strings.Repeat("<", streams.MaxLeaseIDLen), TTLms: -1 << 63,
			Permit: -1 << 62, Value: strings.Repeat("<", streams.MaxValueLen)}
		if body, _ = json.Marshal(renew); len(body) > streams.MaxRequestBytes(size) {
			t.Errorf("set of %d: the largest renew takes %d bytes, over the derived cap %d", size, len(body), streams.MaxRequestBytes(size))
		}
		// The same set, valid as sent by a client that does not escape.
		valid := streams.AcquireRequest{Resources: names, RequestID: strings.Repeat("r", streams.MaxRequestIDLen),
			Owner: strings.Repeat("o", streams.MaxOwnerLen)}
		if err := valid.Validate(); err != nil {
			t.Fatalf("set of %d: %v", size, err)
		}
		if _, err := streams.NormalizeSet(names, size); err != nil {
			t.Fatalf("set of %d: %v", size, err)
		}
	}
}
