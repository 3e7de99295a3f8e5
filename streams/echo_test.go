package streams_test

import (
	"strings"
	"testing"

	"github.com/jetlock/jetlock/streams"
)

func TestEcho(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"orders/1", "orders/1"},
		{strings.Repeat("a", streams.MaxEcho), strings.Repeat("a", streams.MaxEcho)},
		{strings.Repeat("a", 2000), strings.Repeat("a", streams.MaxEcho) + "…(2000 bytes)"},
		// Cut at a UTF-8 boundary: "é" is 2 bytes, and byte 64 is inside one.
		{"a" + strings.Repeat("é", 100), "a" + strings.Repeat("é", 31) + "…(201 bytes)"},
	} {
		if got := streams.Echo(tc.in); got != tc.want {
			t.Errorf("Echo(%d bytes) = %q, want %q", len(tc.in), got, tc.want)
		}
	}
}

// A request whose names are thousands of bytes long is refused with a
// short message: the names are cut, never echoed whole.
func TestLongNamesAreNotEchoed(t *testing.T) {
	long := strings.Repeat("x", 2000)
	for _, body := range []string{
		`{"` + long + `":1}`,
		`{"resource":"orders/1","request_id":"r1","` + long + `":"v"}`,
		`{"resource":"` + long + `","request_id":"r1"}`,
		`{"resources":["orders/1","` + long + `"],"request_id":"r1"}`,
		`{"resource":"orders/1","request_id":"` + long + `"}`,
		`{"resource":"orders/1","request_id":"r1","owner":"` + long + `"}`,
		`{"resource":"orders/1","request_id":"r1","ttl_ms":"` + long + `"}`,
		`{"resource":"orders/1","request_id":"r1","owner":` + long + `}`,
	} {
		var r streams.AcquireRequest
		err := streams.Decode([]byte(body), &r)
		if err == nil {
			err = r.Validate()
		}
		if err == nil {
			t.Errorf("%.60s…: accepted", body)
			continue
		}
		if msg := err.Error(); len(msg) > 400 || strings.Contains(msg, strings.Repeat("x", streams.MaxEcho+1)) {
			t.Errorf("%.60s…: the error is %d bytes and repeats the name: %.200s…", body, len(msg), msg)
		}
	}
	if _, err := streams.DecodeResource(long + "=4"); err == nil || len(err.Error()) > 200 {
		t.Errorf("DecodeResource of a long bad key: %.200v", err)
	}
}
