package streams

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/go-json-experiment/json"
)

var flatSeeds = []string{
	`{"resource":"orders/123","request_id":"r1"}`,
	`{"resource":"lock:backup:user1","request_id":"r1","owner":"svc-a","ttl_ms":30000,"wait_ms":5000,"max_hold_ms":60000}`,
	`{ "resource" : "a" , "lease_id" : "0123456789abcdef0123456789abcdef" , "ttl_ms" : 1000 }`,
	"{\n\t\"resource\": \"a\",\r\n\"lease_id\": \"x\"}",
	`{}`, `{"ttl_ms":-0}`, `{"ttl_ms":-12}`, `{"ttl_ms":012}`, `{"ttl_ms":1.5}`, `{"ttl_ms":1e3}`,
	`{"ttl_ms":999999999999999999}`, `{"ttl_ms":9223372036854775808}`, `{"ttl_ms":"5"}`, `{"resource":5}`,
	`{"resource":"a","resource":"b"}`, `{"Resource":"a"}`, `{"resource":"a\u0041"}`, `{"resource":"café"}`,
	`{"resource":null}`, `{"resource":"a",}`, `{"resource":"a"}x`, `{"resource":"a"`, `{"resource" "a"}`,
	`{"resource":"a","ttl":5}`, `{"resource":true}`, `{"resource":{}}`, `{"lease_id":""}`,
}

// Whatever the fast form reads, the JSON decoder reads the same way, with
// the same value.
func FuzzDecodeFlat(f *testing.F) {
	for _, s := range flatSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		data = bytes.TrimSpace(data)
		if len(data) == 0 || data[0] != '{' {
			return
		}
		for _, newBody := range []func() flatBody{
			func() flatBody { return new(AcquireRequest) },
			func() flatBody { return new(RenewRequest) },
			func() flatBody { return new(ReleaseRequest) },
		} {
			fast := newBody()
			if !decodeFlat(data, fast) {
				continue
			}
			slow := newBody()
			if err := json.Unmarshal(data, slow, json.RejectUnknownMembers(true)); err != nil {
				t.Fatalf("%T: the fast form read %s as %+v, the decoder refuses it: %v", fast, data, fast, err)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("%T: %s read as %+v by the fast form, %+v by the decoder", fast, data, fast, slow)
			}
		}
	})
}

// The bodies the Go client sends take the fast form.
func TestClientBodiesTakeTheFastForm(t *testing.T) {
	for _, c := range []struct {
		body string
		v    flatBody
		want flatBody
	}{
		{`{"resource":"orders/123","request_id":"r1","owner":"svc","ttl_ms":30000,"wait_ms":5000}`, new(AcquireRequest),
			&AcquireRequest{Resource: "orders/123", RequestID: "r1", Owner: "svc", TTLms: 30000, WaitMs: 5000}},
		{`{"resource":"a","lease_id":"l1","ttl_ms":1000}`, new(RenewRequest), &RenewRequest{Resource: "a", LeaseID: "l1", TTLms: 1000}},
		{`{"resource":"a","lease_id":"l1"}`, new(ReleaseRequest), &ReleaseRequest{Resource: "a", LeaseID: "l1"}},
	} {
		if !decodeFlat([]byte(c.body), c.v) || !reflect.DeepEqual(c.v, c.want) {
			t.Fatalf("%s: fast form gave %+v, want %+v", c.body, c.v, c.want)
		}
	}
}

// The fast form against the JSON decoder on an acquire body of the Go
// client's shape: go test ./streams -run '^$' -bench Decode.
func BenchmarkDecodeAcquire(b *testing.B) {
	body := []byte(`{"resource":"bench/0a1b2c3d/steady/r12345","request_id":"0123456789abcdef","owner":"bench-0a1b2c3d","ttl_ms":30000}`)
	b.Run("flat", func(b *testing.B) {
		for b.Loop() {
			var req AcquireRequest
			if !decodeFlat(body, &req) {
				b.Fatal("not the flat form")
			}
		}
	})
	b.Run("decoder", func(b *testing.B) {
		for b.Loop() {
			var req AcquireRequest
			if err := json.Unmarshal(body, &req, json.RejectUnknownMembers(true)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FormatTime against time.Format with the wire layout.
func BenchmarkFormatTime(b *testing.B) {
	now := time.Now()
	b.Run("FormatTime", func(b *testing.B) {
		for b.Loop() {
			_ = FormatTime(now)
		}
	})
	b.Run("time.Format", func(b *testing.B) {
		for b.Loop() {
			_ = now.UTC().Format(TimeFormat)
		}
	})
}

// Only JSON's own whitespace surrounds a body: \v, \f, U+0085 and U+00A0
// (which bytes.TrimSpace would trim) make it malformed.
func TestDecodeTrimsOnlyJSONWhitespace(t *testing.T) {
	body := `{"resource":"a","request_id":"r"}`
	for _, ok := range []string{" ", "\t", "\r\n", "\n \t"} {
		var req AcquireRequest
		if err := Decode([]byte(ok+body+ok), &req); err != nil || req.Resource != "a" {
			t.Errorf("body around %q: %v, %+v", ok, err, req)
		}
	}
	for _, bad := range []string{"\v", "\f", "\u0085", "\u00a0"} {
		for _, data := range []string{bad + body, body + bad} {
			var req AcquireRequest
			if err := Decode([]byte(data), &req); err == nil {
				t.Errorf("%q decoded as %+v, want invalid", data, req)
			}
		}
	}
}

// A value the fast form decodes owns its bytes: it does not share the
// body's memory, so keeping an owner for a lease's life does not keep the
// request (padded to its size cap) alive.
func TestFlatValuesOwnTheirBytes(t *testing.T) {
	data := []byte(`{"resource":"orders/1","request_id":"r1","owner":"me"}` + string(bytes.Repeat([]byte(" "), 2000)))
	var req AcquireRequest
	if err := Decode(data, &req); err != nil {
		t.Fatal(err)
	}
	lo, hi := uintptr(unsafe.Pointer(&data[0])), uintptr(unsafe.Pointer(&data[len(data)-1]))
	for _, s := range []string{req.Resource, req.RequestID, req.Owner} {
		if p := uintptr(unsafe.Pointer(unsafe.StringData(s))); p >= lo && p <= hi {
			t.Errorf("%q points into the request body", s)
		}
	}
	// Nor are they slices of one copy of the whole body: then the owner
	// would sit as far from the resource as it does in the body.
	r, o := unsafe.StringData(req.Resource), unsafe.StringData(req.Owner)
	inBody := strings.Index(string(data), `"me"`) + 1 - strings.Index(string(data), "orders/1")
	if uintptr(unsafe.Pointer(o))-uintptr(unsafe.Pointer(r)) == uintptr(inBody) {
		t.Errorf("owner and resource are slices of one copy of the body")
	}
}
