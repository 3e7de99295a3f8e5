package service

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// quickAck reads exactly the acknowledgements it knows and leaves every
// other body to the JSON decoder.
func TestQuickAck(t *testing.T) {
	s := newStore(nil, "jetlock", 0)
	for body, want := range map[string]struct {
		seq     uint64
		dup, ok bool
	}{
		`{"stream":"KV_jetlock","seq":42}`:                                               {42, false, true},
		`{"stream":"KV_jetlock","seq":7,"duplicate": true}`:                              {7, true, true},
		`{"stream":"KV_jetlock","seq":7,"duplicate":true}`:                               {7, true, true},
		`{"stream":"KV_jetlock","seq":0}`:                                                {},
		`{"stream":"KV_jetlock","seq":}`:                                                 {},
		`{"stream":"KV_jetlock","seq":18446744073709551616}`:                             {},
		`{"stream":"KV_jetlock","seq":5,"duplicate": false}`:                             {},
		`{"stream":"KV_jetlock","seq":5 }`:                                               {},
		`{"stream":"KV_other","seq":5}`:                                                  {},
		`{"stream":"KV_jetlock","domain":"hub","seq":5}`:                                 {},
		`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}`: {},
		``: {},
	} {
		seq, dup, ok := s.quickAck([]byte(body))
		if seq != want.seq || dup != want.dup || ok != want.ok {
			t.Errorf("%s: seq %d dup %v ok %v, want %d %v %v", body, seq, dup, ok, want.seq, want.dup, want.ok)
		}
	}
}

// The acknowledgements of the nats-server in use take the quick path: a
// write and a repeat of it with the same message id.
func TestQuickAckReadsTheServersAcks(t *testing.T) {
	cl := startCluster(t)
	nc := connectAs(t, cl, devcluster.Store)
	js, _ := jetstream.New(nc)
	ctx := t.Context()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "acks", Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	s := newStore(nc, "acks", 0)
	for i, wantDup := range []bool{false, true} {
		m := nats.NewMsg(streams.SubjectPrefix("acks") + "k")
		m.Data = []byte("v")
		m.Header.Set(jetstream.MsgIDHeader, "same-id")
		// A new R3 stream answers once its leader is elected: until then
		// a publish finds no responders.
		var reply *nats.Msg
		var err error
		for try := 0; ; try++ {
			if reply, err = nc.RequestMsgWithContext(ctx, m); !errors.Is(err, nats.ErrNoResponders) || try == 100 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		seq, dup, ok := s.quickAck(reply.Data)
		if !ok || seq != 1 || dup != wantDup {
			t.Fatalf("write %d acknowledged %s: quick path seq %d dup %v ok %v, want 1 %v true", i+1, reply.Data, seq, dup, ok, wantDup)
		}
	}
}

// A compare-and-set that meets another write to its key still being
// proposed is refused by nats-server as "in flight" (10164), before it is
// known whether the key moved on. The store sends it again until it is
// decided: the loser of two creates of one key at once learns that it
// lost (a conflict), never that a write was in flight, and a caller that
// re-reads after it sees the winner's write. (Deciding again on a read
// made while the winner was in flight read the key as free, and a caller
// whose every attempt met the same write in flight — under load, a second
// instance answering the retry of a request the first was granting —
// answered "every attempt lost".)
func TestAWriteThatMetAnotherInFlightIsDecided(t *testing.T) {
	cl := startCluster(t)
	ctx := t.Context()
	js, _ := jetstream.New(connectAs(t, cl, devcluster.Store))
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "inflight", Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	a := newStore(connectAs(t, cl, devcluster.Store), "inflight", time.Minute)
	b := newStore(connectAs(t, cl, devcluster.Store), "inflight", time.Minute)
	rec := &streams.Record{LeaseID: "l", Owner: "o"}
	if _, _, err := a.put(ctx, "warm", rec, 0, ""); err != nil {
		t.Fatal(err)
	}
	const pairs = 300
	lost := 0
	for i := range pairs {
		key := fmt.Sprintf("k%03d", i)
		errs := make(chan error, 2)
		for _, s := range []*store{a, b} {
			go func() {
				_, _, err := s.put(ctx, key, rec, 0, "")
				errs <- err
			}()
		}
		won := 0
		for range 2 {
			switch err := <-errs; {
			case err == nil:
				won++
			case errors.Is(err, errInFlight):
				t.Fatalf("%s: a create was answered in flight: %v", key, err)
			case errors.Is(err, errConflict):
				lost++
			default:
				t.Fatalf("%s: %v", key, err)
			}
		}
		if won != 1 {
			t.Fatalf("%s: %d creates at revision 0 committed, want 1", key, won)
		}
	}
	t.Logf("%d pairs; the loser's create was decided a conflict in %d", pairs, lost)
}
