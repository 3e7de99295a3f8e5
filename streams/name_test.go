package streams_test

import (
	"testing"

	"github.com/jetlock/jetlock/streams"
)

func TestNameRecordRoundTrip(t *testing.T) {
	for _, n := range []int{1, 2, 999, streams.MaxLimit} {
		b := streams.AppendNameRecord(nil, n)
		got, ok := streams.ParseNameRecord(b)
		if !ok || got != n {
			t.Errorf("ParseNameRecord(%s) = %d, %v; want %d", b, got, ok, n)
		}
		if _, err := streams.ParseLease(b, 7); err == nil {
			t.Errorf("a name record %s parses as a lease", b)
		}
	}
}

func TestNameRecordRefusesOtherValues(t *testing.T) {
	for _, v := range []string{
		``, `{}`, `{"semaphore_limit":0}`, `{"semaphore_limit":1001}`, `{"semaphore_limit":-1}`,
		`{"semaphore_limit":01}`, `{"semaphore_limit":1,"x":2}`, `{"semaphore_limit":"2"}`,
		`{"semaphore_limit":2} `, `{"lease_id":"x"}`,
	} {
		if n, ok := streams.ParseNameRecord([]byte(v)); ok {
			t.Errorf("ParseNameRecord(%q) = %d, true; want refused", v, n)
		}
	}
}
