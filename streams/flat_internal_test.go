package streams

import (
	"bytes"
	"reflect"
	"testing"
	"time"

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
