package load

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

func TestMaxOverlap(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	span := func(a, b int) Span { return Span{at(a), at(b)} }
	for _, c := range []struct {
		spans []Span
		want  int
	}{
		{nil, 0},
		{[]Span{span(0, 10)}, 1},
		{[]Span{span(0, 10), span(10, 20), span(20, 30)}, 1}, // touching: handed over
		{[]Span{span(0, 10), span(5, 15), span(8, 9), span(14, 20)}, 3},
		{[]Span{span(0, 10), span(5, 5), span(7, 3)}, 1}, // empty and reversed spans count for nothing
	} {
		if got := MaxOverlap(c.spans); got != c.want {
			t.Errorf("MaxOverlap(%v) = %d, want %d", c.spans, got, c.want)
		}
	}
}

func TestParseGrantOfASetAndAPermit(t *testing.T) {
	b := &Service{Prefix: "jetlock", Bucket: "jetlock", Owner: "o"}
	set := &nats.Msg{Data: []byte(`{"lease_id":"l1","ttl_ms":5000,"expires_at":"x","resources":[{"resource":"a","token":7},{"resource":"b","token":8}]}`)}
	res, g := b.ParseGrant(set, nil)
	if res.Code != CodeOK || res.Lease != "l1" || g.TTL() != 5*time.Second || len(g.Resources) != 2 || g.Resources[1].Token != 8 {
		t.Fatalf("set grant: %+v %+v", res, g)
	}
	permit := &nats.Msg{Data: []byte(`{"resource":"s","lease_id":"l2","token":9,"ttl_ms":30000,"expires_at":"x","permit":3}`)}
	if res, g = b.ParseGrant(permit, nil); res.Code != CodeOK || res.Token != 9 || g.Permit != 3 {
		t.Fatalf("permit grant: %+v %+v", res, g)
	}
	locked := nats.NewMsg("r")
	locked.Header.Set(streams.HeaderErrorCode, "409")
	locked.Data = []byte(`{"error":{"code":"locked","message":"held"}}`)
	if res, _ = b.ParseGrant(locked, nil); res.Code != streams.CodeLocked || res.Unknown {
		t.Fatalf("locked: %+v", res)
	}
	if res, _ = b.ParseGrant(nil, ErrTimeout); res.Code != CodeTimeout || !res.Unknown {
		t.Fatalf("timeout: %+v", res)
	}
}
