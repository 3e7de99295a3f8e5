package streams_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/streams"
)

func TestEndMark(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	body, err := json.Marshal(streams.EndMark{RequestID: "r1", EndedAt: streams.FormatTime(now)})
	if err != nil {
		t.Fatal(err)
	}
	m := streams.DecodeEndMark(body)
	if m == nil || m.RequestID != "r1" {
		t.Fatalf("decoded %s as %+v", body, m)
	}
	const window = 2 * time.Minute
	for _, c := range []struct {
		id   string
		at   time.Time
		want bool
	}{
		{"r1", now, true},
		{"r1", now.Add(window), true},
		{"r1", now.Add(window + time.Millisecond), false},
		{"r1", now.Add(-time.Hour), true}, // a clock behind the writer's: still recent
		{"r2", now, false},
	} {
		if got := m.Ended(c.id, c.at, window); got != c.want {
			t.Errorf("Ended(%q) at %v: %v, want %v", c.id, c.at.Sub(now), got, c.want)
		}
	}
	for _, b := range []string{``, `{}`, `not json`, `{"ended_request_id":""}`} {
		if m := streams.DecodeEndMark([]byte(b)); m != nil {
			t.Errorf("%q decoded as a mark %+v", b, m)
		}
	}
	var none *streams.EndMark
	if none.Ended("r1", now, window) {
		t.Error("no mark ended a request")
	}
	if !(&streams.EndMark{RequestID: "r1", EndedAt: "garbage"}).Ended("r1", now, window) {
		t.Error("a mark with an unreadable time must count as recent")
	}
}

// A misspelt field is named in the refusal, and other decoding errors
// still say what is wrong with the JSON.
func TestDecodeNamesAnUnknownField(t *testing.T) {
	var req streams.AcquireRequest
	err := streams.Decode([]byte(`{"resource":"a","request_id":"r","ttl":5000}`), &req)
	if !errors.Is(err, streams.ErrInvalid) || err.Error() != `invalid request: unknown field "ttl"` {
		t.Fatalf("unknown field: %v", err)
	}
	err = streams.Decode([]byte(`{"resource":5,"request_id":"r"}`), &req)
	if !errors.Is(err, streams.ErrInvalid) || !strings.Contains(err.Error(), "malformed JSON") {
		t.Fatalf("wrong type: %v", err)
	}
}
