package load

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

func TestIDSet(t *testing.T) {
	s := newIDSet(10)
	for i := int32(0); i < 10; i++ {
		s.add(i)
	}
	s.add(3) // twice: no effect
	s.remove(4)
	s.remove(4)
	if s.len() != 9 || s.has(4) || !s.has(9) {
		t.Fatalf("set len %d has4 %v has9 %v", s.len(), s.has(4), s.has(9))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[int32]bool{}
	for {
		id, ok := s.pick(rng)
		if !ok {
			break
		}
		if seen[id] || id == 4 {
			t.Fatalf("picked %d again or a removed id", id)
		}
		seen[id] = true
	}
	if len(seen) != 9 {
		t.Fatalf("picked %d ids, want 9", len(seen))
	}
}

func TestServiceParse(t *testing.T) {
	b := &Service{Prefix: "jetlock", Bucket: "jetlock"}
	ok := &nats.Msg{Data: []byte(`{"resource":"r","lease_id":"L","token":42,"ttl_ms":30000,"expires_at":"x"}`)}
	if r := b.Parse(streams.OpAcquire, ok, nil); r.Code != CodeOK || r.Lease != "L" || r.Token != 42 {
		t.Fatalf("grant parsed as %+v", r)
	}
	locked := nats.NewMsg("x")
	locked.Header.Set(streams.HeaderErrorCode, "409")
	locked.Data = []byte(`{"error":{"code":"locked","message":"held"}}`)
	if r := b.Parse(streams.OpAcquire, locked, nil); r.Code != streams.CodeLocked || r.Unknown {
		t.Fatalf("locked parsed as %+v", r)
	}
	unavail := nats.NewMsg("x")
	unavail.Header.Set(streams.HeaderErrorCode, "503")
	unavail.Data = []byte(`not json`)
	if r := b.Parse(streams.OpRenew, unavail, nil); r.Code != streams.CodeUnavailable || !r.Unknown {
		t.Fatalf("503 with a bad body parsed as %+v", r)
	}
	shed := nats.NewMsg("x")
	shed.Header.Set(streams.HeaderErrorCode, "503")
	shed.Data = []byte(`{"error":{"code":"unavailable","message":"service overloaded","retry_after_ms":180}}`)
	if r := b.Parse(streams.OpAcquire, shed, nil); r.Code != streams.CodeUnavailable || !r.Unknown || r.RetryAfter != 180*time.Millisecond {
		t.Fatalf("a shed answer parsed as %+v", r)
	}
	rel := &nats.Msg{Data: []byte(`{"resource":"r","released":false}`)}
	if r := b.Parse(streams.OpRelease, rel, nil); r.Code != CodeOK || r.Released {
		t.Fatalf("release parsed as %+v", r)
	}
	if r := b.Parse(streams.OpAcquire, nil, ErrTimeout); r.Code != CodeTimeout || !r.Unknown {
		t.Fatalf("timeout parsed as %+v", r)
	}
	m := b.Acquire("r", "q", "", 30*time.Second, 2*time.Second, 0)
	if m.Subject != "jetlock.v1.acquire" || !strings.Contains(string(m.Data), `"wait_ms":2000`) {
		t.Fatalf("acquire message %s %s", m.Subject, m.Data)
	}
}

func TestRaw(t *testing.T) {
	b := NewRaw("raw", "me")
	m := b.Acquire("a/b", "q1", "", 30*time.Second, 0, 7)
	if m.Subject != "$KV.raw.lease.a/b" || m.Header.Get("Nats-Expected-Last-Subject-Sequence") != "7" || m.Header.Get("Nats-Msg-Id") == "" {
		t.Fatalf("raw acquire %s %v", m.Subject, m.Header)
	}
	if d := b.Release("a/b", "", 9); d.Header.Get("KV-Operation") != "DEL" {
		t.Fatalf("raw release headers %v", d.Header)
	}
	ack := &nats.Msg{Data: []byte(`{"stream":"KV_raw","seq":12}`)}
	if r := b.Parse(streams.OpAcquire, ack, nil); r.Code != CodeOK || r.Rev != 12 || r.Token != 12 {
		t.Fatalf("ack parsed as %+v", r)
	}
	for _, code := range []string{"10071", "10164"} {
		conflict := &nats.Msg{Data: []byte(`{"error":{"code":400,"err_code":` + code + `,"description":"wrong last sequence"}}`)}
		if r := b.Parse(streams.OpRenew, conflict, nil); r.Code != CodeConflict || r.Unknown || r.InProcess != (code == "10164") {
			t.Fatalf("conflict %s parsed as %+v", code, r)
		}
	}
}

// An operation answered is one that got a reply, whatever it said.
func TestAnswered(t *testing.T) {
	s := OpSummary{Count: 10, ErrorsByCode: map[string]int64{CodeTimeout: 2, CodeBacklog: 1, streams.CodeLocked: 3}}
	if n := s.Answered(); n != 7 {
		t.Fatalf("answered %d, want 7", n)
	}
}

func TestGrantTimesAround(t *testing.T) {
	t0 := time.Now()
	var g GrantTimes
	for _, ms := range []int{0, 100, 200, 1500, 1600} {
		at := t0.Add(time.Duration(ms) * time.Millisecond)
		g.Add(at.Add(-time.Millisecond), at)
	}
	last, first, gap := g.Around(t0.Add(300 * time.Millisecond))
	if last != 100*time.Millisecond || gap != 1300*time.Millisecond || first != 1200*time.Millisecond {
		t.Fatalf("last %v first %v gap %v", last, first, gap)
	}
}
