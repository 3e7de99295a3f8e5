package streams_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/jetlock/jetlock/streams"
)

// FuzzAppendJSON holds the hand-written encoders to json.Marshal: byte for
// byte that of encoding/json/v2 when every string is valid UTF-8, and
// decoding to what encoding/json's own round trip gives when one is not.
func FuzzAppendJSON(f *testing.F) {
	f.Add("0123456789abcdef0123456789abcdef", "svc-a", "req-1", "2026-11-30T06:00:00.000Z", "jetlock.wake.X.1", int64(30000), uint64(42), true)
	f.Add("", "", "", "", "", int64(0), uint64(0), false)
	f.Add("<&>\"\\\n\t\u2028\u2029", "é\x00\x1f", "\xff\xfe", "\xed\xa0\x80", "a\u007fb", int64(-1), uint64(1<<63), true)
	f.Fuzz(func(t *testing.T, s1, s2, s3, s4, s5 string, n int64, u uint64, flag bool) {
		valid := true
		for _, s := range []string{s1, s2, s3, s4, s5} {
			valid = valid && utf8.ValidString(s)
		}
		for _, v := range []interface{ AppendJSON([]byte) []byte }{
			&streams.Record{LeaseID: s1, Owner: s2, RequestID: s3, TTLms: n, Token: u, GrantedAt: s4, RenewedAt: s5, ExpiresAt: s1, Wake: s2},
			&streams.Record{RequestID: s3, TTLms: n, Token: u, HoldUntil: s4, Wake: s5, LeaseTTLms: n, MaxHoldMs: -n},
			&streams.EndMark{RequestID: s1, EndedAt: s4},
			&streams.EndMark{RequestID: s1, Tenant: s2, EndedAt: s4, Why: s3, Reason: s5},
			&streams.Record{LeaseID: s1, Owner: s2, Tenant: s3, RequestID: s3, TTLms: n, Token: u, ExpiresAt: s4},
			&streams.Waiter{Owner: s1, Tenant: s2, RequestID: s3, Ticket: u, QueuedAt: s4, LivenessMs: n, RefreshedAt: s5, ExpiresAt: s1, Wake: s2},
			&streams.Waiter{RequestID: s3, Ticket: u, Wake: s5, LeaseTTLms: n, MaxHoldMs: -n},
			&streams.LeaseResponse{Resource: s1, LeaseID: s2, Token: u, TTLms: n, ExpiresAt: s3},
			&streams.LeaseResponse{Resource: s1, LeaseID: s2, Token: u, TTLms: n, ExpiresAt: s3, HoldUntil: s4},
			&streams.ReleaseResponse{Resource: s5, Released: flag},
		} {
			got := v.AppendJSON([]byte("prefix"))
			if string(got[:6]) != "prefix" {
				t.Fatalf("%T: the buffer's start was overwritten: %q", v, got)
			}
			got = got[6:]
			if valid {
				want, err := jsonv2.Marshal(v)
				if err != nil {
					t.Fatalf("%T: json/v2 refused valid UTF-8: %v", v, err)
				}
				if string(got) != string(want) {
					t.Fatalf("%T:\n got %s\nwant %s", v, got, want)
				}
			}
			std, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			a := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			b := reflect.New(reflect.TypeOf(v).Elem()).Interface()
			if err := json.Unmarshal(got, a); err != nil {
				t.Fatalf("%T: %s does not decode: %v", v, got, err)
			}
			_ = json.Unmarshal(std, b)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("%T: decodes to %+v, encoding/json's round trip to %+v", v, a, b)
			}
		}
	})
}

func TestAppendJSONNil(t *testing.T) {
	for _, v := range []interface{ AppendJSON([]byte) []byte }{
		(*streams.Record)(nil), (*streams.EndMark)(nil), (*streams.LeaseResponse)(nil), (*streams.ReleaseResponse)(nil),
	} {
		want, _ := jsonv2.Marshal(v)
		if got := v.AppendJSON(nil); string(got) != string(want) {
			t.Errorf("nil %T: %s, want %s", v, got, want)
		}
	}
}

// BenchmarkEncodeRecord compares the record encoder with json/v2.
func BenchmarkEncodeRecord(b *testing.B) {
	r := &streams.Record{LeaseID: "0123456789abcdef0123456789abcdef", Owner: "backup-7f9c", RequestID: "acq-5b1d0c2e",
		TTLms: 30000, Token: 123456789, GrantedAt: "2026-11-30T06:00:00.000Z", RenewedAt: "2026-11-30T06:00:10.000Z",
		ExpiresAt: "2026-11-30T06:00:40.000Z"}
	b.Run("jsonv2", func(b *testing.B) {
		for b.Loop() {
			_, _ = jsonv2.Marshal(r)
		}
	})
	b.Run("append", func(b *testing.B) {
		for b.Loop() {
			_ = r.AppendJSON(make([]byte, 0, 256))
		}
	})
}
