package streams_test

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
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
		if got := m.Ended(c.id, "", c.at, window); got != c.want {
			t.Errorf("Ended(%q) at %v: %v, want %v", c.id, c.at.Sub(now), got, c.want)
		}
	}
	for _, b := range []string{``, `{}`, `not json`, `{"ended_request_id":""}`} {
		if m := streams.DecodeEndMark([]byte(b)); m != nil {
			t.Errorf("%q decoded as a mark %+v", b, m)
		}
	}
	// Another tenant's request of the same id did not end.
	if m.Ended("r1", "CALLERS/b", now, window) {
		t.Error("a mark of tenant-less r1 ended CALLERS/b's r1")
	}
	if mt := (&streams.EndMark{RequestID: "r1", Tenant: "CALLERS/a", EndedAt: streams.FormatTime(now)}); !mt.Ended("r1", "CALLERS/a", now, window) || mt.Ended("r1", "CALLERS/b", now, window) {
		t.Error("a tenant's mark must end its own request id and no other tenant's")
	}
	var none *streams.EndMark
	if none.Ended("r1", "", now, window) {
		t.Error("no mark ended a request")
	}
	if !(&streams.EndMark{RequestID: "r1", EndedAt: "garbage"}).Ended("r1", "", now, window) {
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

// FormatTime writes what time.Format writes with TimeFormat in UTC, and
// ParseTime reads what time.Parse reads, for times across the years,
// zones and milliseconds, and for strings one byte away from a valid one.
func TestTimeFormatMatchesTimePackage(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	zones := []*time.Location{time.UTC, time.FixedZone("east", 5*3600+1800), time.FixedZone("west", -8*3600)}
	check := func(s string) {
		t.Helper()
		got, gerr := streams.ParseTime(s)
		want, werr := time.Parse(streams.TimeFormat, s)
		if (gerr == nil) != (werr == nil) || !got.Equal(want) || got.Location().String() != want.Location().String() {
			t.Fatalf("ParseTime(%q) = %v, %v; time.Parse: %v, %v", s, got, gerr, want, werr)
		}
	}
	for range 20000 {
		tm := time.Unix(r.Int64N(400*365*86400)-100*365*86400, r.Int64N(1e9)).In(zones[r.IntN(len(zones))])
		if r.IntN(50) == 0 {
			tm = time.Date(r.IntN(12000)-1000, time.Month(1+r.IntN(12)), 1+r.IntN(28), 0, 0, 0, 0, time.UTC)
		}
		s := streams.FormatTime(tm)
		if want := tm.UTC().Format(streams.TimeFormat); s != want {
			t.Fatalf("FormatTime(%v) = %q, want %q", tm, s, want)
		}
		check(s)
		b := []byte(s)
		b[r.IntN(len(b))] = "0123456789-:.TZ+x "[r.IntN(18)]
		check(string(b))
	}
	for _, s := range []string{"", "2026-02-29T00:00:00.000Z", "2024-02-29T00:00:00.000Z", "2026-13-01T00:00:00.000Z",
		"2026-12-01T24:00:00.000Z", "2026-12-01T23:59:60.000Z", "2026-12-01T23:59:59.999+01:00", "2026-12-01T23:59:59.99Z",
		"2026-12-01 23:59:59.999Z", "0000-01-01T00:00:00.000Z", "9999-12-31T23:59:59.999Z"} {
		check(s)
	}
}

// A waiter record is read in its own form, and in the lease record's form
// that releases before Waiter wrote; either way the service holds it as a
// Record with the ticket as Token and the liveness window as TTLms.
func TestParseWaiterBothForms(t *testing.T) {
	const root = "jetlock.wake."
	w := &streams.Waiter{Owner: "o", Tenant: "CALLERS/caller", RequestID: "r1", Ticket: 7, QueuedAt: "2026-12-03T08:00:00.000Z",
		LivenessMs: 6000, RefreshedAt: "2026-12-03T08:00:02.000Z", ExpiresAt: "2026-12-03T08:00:08.000Z", Wake: root + "i.h", LeaseTTLms: 30000}
	old := `{"owner":"o","request_id":"r1","ttl_ms":6000,"token":7,"granted_at":"2026-12-03T08:00:00.000Z","renewed_at":"2026-12-03T08:00:02.000Z","expires_at":"2026-12-03T08:00:08.000Z","wake":"jetlock.wake.i.h","lease_ttl_ms":30000}`
	for name, body := range map[string][]byte{"own form": w.AppendJSON(nil), "lease form": []byte(old)} {
		r, err := streams.ParseWaiter(body, 9, root)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.Token != 7 || r.TTLms != 6000 || r.GrantedAt != w.QueuedAt || r.RenewedAt != w.RefreshedAt || r.Wake != w.Wake || r.LeaseTTLms != 30000 || r.RequestID != "r1" {
			t.Errorf("%s: %+v", name, r)
		}
	}
	if !strings.Contains(string(w.AppendJSON(nil)), `"ticket":7,"queued_at":`) {
		t.Errorf("own form %s", w.AppendJSON(nil))
	}
	if _, err := streams.ParseWaiter([]byte(`{"request_id":"r1","ticket":1,"wake":"jetlock.wake.i.h"}`), 9, root); err == nil {
		t.Error("a waiter without a liveness window was read")
	}
}
