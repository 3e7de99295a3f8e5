package streams_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/jetlock/jetlock/streams"
)

// Fuzz targets. `go test ./streams` runs their seeds (f.Add below and the
// corpus in testdata/fuzz/<Name>/); `go test ./streams -run '^$' -fuzz
// FuzzDecodeRequest -fuzztime 1m` explores further.

// FuzzDecodeRequest feeds arbitrary bodies to streams.Decode for every
// request type of the contract, as the service does, then validates the
// result as the service does. Nothing may panic; every refusal wraps
// ErrInvalid; whatever decodes re-encodes and decodes to the same value;
// and a body that decodes and validates is also accepted after that round
// trip.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"resource":"orders/123","request_id":"r1"}`,
		`{"resource":"lock:backup:user123:service:backup","request_id":"r1","owner":"svc-a","ttl_ms":30000,"wait_ms":5000}`,
		`{"resource":"a","lease_id":"0123456789abcdef0123456789abcdef","ttl_ms":1000}`,
		`{"resource":"a.b/c=d@e_f-g"}`,
		` {"resource":"a"} `,
		`{"resource":"a","request_id":"r"} {}`,
		`{"resource":"a","ttl":5000}`,
		`{"resource":5}`,
		`{"resource":"a","request_id":"\u0000"}`,
		`{"resource":"café","request_id":"\ud800"}`,
		`[]`, `null`, ``, `{`, `{"resource":"a","resource":"b"}`,
		`{"ttl_ms":1e99}`, `{"ttl_ms":-1}`, `{"wait_ms":9223372036854775808}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, newReq := range requestTypes {
			req := newReq()
			err := streams.Decode(data, req)
			if err != nil {
				if !errors.Is(err, streams.ErrInvalid) {
					t.Fatalf("%T: Decode error %v does not wrap ErrInvalid", req, err)
				}
				continue
			}
			valid := validate(req) == nil
			enc, err := json.Marshal(req)
			if err != nil {
				t.Fatalf("%T: re-encode %+v: %v", req, req, err)
			}
			again := newReq()
			if err := streams.Decode(enc, again); err != nil {
				t.Fatalf("%T: %s decoded, but its re-encoding %s did not: %v", req, data, enc, err)
			}
			if !reflect.DeepEqual(req, again) {
				t.Fatalf("%T: round trip changed %+v into %+v", req, req, again)
			}
			if valid && validate(again) != nil {
				t.Fatalf("%T: valid %+v became invalid after a round trip", req, req)
			}
		}
	})
}

var requestTypes = []func() any{
	func() any { return new(streams.AcquireRequest) },
	func() any { return new(streams.RenewRequest) },
	func() any { return new(streams.ReleaseRequest) },
	func() any { return new(streams.CancelRequest) },
	func() any { return new(streams.StatusRequest) },
}

// validate checks a decoded request the way the service does before it
// touches the store (TTL and wait bounds are configuration: only their
// sign is checked here).
func validate(req any) error {
	var errs []error
	switch r := req.(type) {
	case *streams.AcquireRequest:
		errs = append(errs, streams.ValidateResource(r.Resource), streams.ValidateRequestID(r.RequestID), streams.ValidateOwner(r.Owner))
		if r.TTLms < 0 || r.WaitMs < 0 {
			errs = append(errs, streams.ErrInvalid)
		}
	case *streams.RenewRequest:
		errs = append(errs, streams.ValidateResource(r.Resource), streams.ValidateLeaseID(r.LeaseID))
		if r.TTLms < 0 {
			errs = append(errs, streams.ErrInvalid)
		}
	case *streams.ReleaseRequest:
		errs = append(errs, streams.ValidateResource(r.Resource), streams.ValidateLeaseID(r.LeaseID))
	case *streams.CancelRequest:
		errs = append(errs, streams.ValidateResource(r.Resource), streams.ValidateRequestID(r.RequestID))
	case *streams.StatusRequest:
		errs = append(errs, streams.ValidateResource(r.Resource))
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, streams.ErrInvalid) {
			panic("validation error without ErrInvalid: " + err.Error())
		}
	}
	return errors.Join(errs...)
}

// kvKey is the key syntax nats.go's KV accepts (jetstream/kv.go keyValid).
var kvKey = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)

func kvKeyValid(k string) bool {
	return k != "" && k[0] != '.' && k[len(k)-1] != '.' && !strings.Contains(k, "..") && kvKey.MatchString(k)
}

// FuzzResourceName checks resource-name validation and the resource-to-key
// mapping: a valid name encodes to a readable, '.'-free key part that
// DecodeResource maps back to the name, so that the lease key and the
// waiter keys are valid NATS KV keys and split unambiguously; a name that
// fails validation never panics anything. DecodeResource of arbitrary
// input never panics, and a decoded valid name encodes back to a key that
// decodes to it again.
func FuzzResourceName(f *testing.F) {
	for _, s := range []string{
		"orders/123", "lock:backup:user123:service:backup", "a", "a.b", "user@example.com", "k=v",
		"x_y-z", ".a", "a.", "/a", "a/", "a b", "a*", "a>", "café", "", strings.Repeat("a", 200),
		strings.Repeat("a", 201), "=41", "a..b", "a//b", "=", "=4", "=ZZ",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := streams.EncodeResource(s)
		if back, err := streams.DecodeResource(enc); err != nil || back != s {
			t.Fatalf("DecodeResource(EncodeResource(%q)) = %q, %v", s, back, err)
		}
		if r, err := streams.DecodeResource(s); err == nil && streams.ValidateResource(r) == nil {
			if again, err := streams.DecodeResource(streams.EncodeResource(r)); err != nil || again != r {
				t.Fatalf("decoded name %q does not survive a round trip: %q, %v", r, again, err)
			}
		}
		if err := streams.ValidateResource(s); err != nil {
			if !errors.Is(err, streams.ErrInvalid) {
				t.Fatalf("ValidateResource(%q): %v does not wrap ErrInvalid", s, err)
			}
			return
		}
		if len(s) == 0 || len(s) > streams.MaxResourceLen {
			t.Fatalf("ValidateResource accepted %d bytes", len(s))
		}
		if strings.ContainsAny(enc, ".*> \t\r\n") {
			t.Fatalf("EncodeResource(%q) = %q: not a single subject token", s, enc)
		}
		for _, key := range []string{streams.LeaseKey(s), streams.WaitKey(s, "0123abcd")} {
			if !kvKeyValid(key) {
				t.Fatalf("resource %q gives key %q, which NATS KV refuses", s, key)
			}
		}
		rest := strings.TrimPrefix(streams.WaitKey(s, "0123abcd"), streams.WaitKeyPrefix)
		if res, id, ok := strings.Cut(rest, "."); !ok || res != enc || id != "0123abcd" {
			t.Fatalf("waiter key of %q does not split back: %q", s, rest)
		}
	})
}
