package service

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// A semaphore's grants commit together: while one grant's write is held
// up, the next request is decided and granted another permit, a request
// finds the held-up permit taken, and a retry of the held-up request waits
// for it and gets the same permit, never a second one. The write is held
// up by holding the gate of the session it is made in (sessionGate), which
// a grant in a session takes just before it commits; a decision that kept
// the semaphore's lock across its commit would hold up every other
// request of the semaphore with it.
func TestSemaphoreGrantsCommitTogether(t *testing.T) {
	s, req := runInternal(t, DefaultConfig())
	var sess streams.SessionResponse
	if err := json.Unmarshal(req(streams.OpSessionOpen, streams.SessionOpenRequest{RequestID: "s", TTLms: 30000}).Data, &sess); err != nil || sess.SessionID == "" {
		t.Fatalf("session.open: %v %+v", err, sess)
	}
	hash, _, _ := streams.SplitSessionID(sess.SessionID)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gate, err := s.locks.sessionGate(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	gateHeld := true
	defer func() {
		if gateHeld {
			gate.unlock()
		}
	}()

	const sem = "pool"
	held := streams.AcquireRequest{Resource: sem, RequestID: "a", Limit: 2, SessionID: sess.SessionID}
	type answer struct {
		code string
		body []byte
		err  error
	}
	send := func(body streams.AcquireRequest) chan answer {
		ch := make(chan answer, 1)
		go func() {
			code, data, err := ask(s.nc, streams.OpAcquire, body)
			ch <- answer{code, data, err}
		}()
		return ch
	}
	first := send(held)
	// Wait until its grant is committing, held at the gate.
	for !s.locks.permits.reserved(permitKey(sem, 1)) {
		if ctx.Err() != nil {
			t.Fatal("the first acquire never reached its commit")
		}
		time.Sleep(5 * time.Millisecond)
	}
	retry := send(held)

	// Another request is granted the other permit meanwhile.
	var other streams.LeaseResponse
	if code, body, err := ask(s.nc, streams.OpAcquire, streams.AcquireRequest{Resource: sem, RequestID: "b", Limit: 2, TTLms: 30000}); err != nil || code != "" {
		t.Fatalf("second acquire while the first commits: %q %s %v", code, body, err)
	} else if err := json.Unmarshal(body, &other); err != nil || other.Permit != 2 {
		t.Fatalf("second acquire: %v %+v, want permit 2", err, other)
	}
	// The permit being granted counts as taken.
	if code, body, err := ask(s.nc, streams.OpAcquire, streams.AcquireRequest{Resource: sem, RequestID: "c", Limit: 2, TTLms: 30000}); err != nil || code != streams.CodeLocked {
		t.Fatalf("third acquire: %q %s %v, want locked", code, body, err)
	}
	select {
	case a := <-retry:
		t.Fatalf("the retry was answered before its first attempt committed: %q %s %v", a.code, a.body, a.err)
	default:
	}

	gate.unlock()
	gateHeld = false
	var leases [2]streams.LeaseResponse
	for i, ch := range []chan answer{first, retry} {
		a := <-ch
		if a.err != nil || a.code != "" {
			t.Fatalf("acquire %d: %q %s %v", i, a.code, a.body, a.err)
		}
		if err := json.Unmarshal(a.body, &leases[i]); err != nil {
			t.Fatal(err)
		}
	}
	if leases[0].Permit != 1 || leases[1] != leases[0] {
		t.Fatalf("first attempt %+v, retry %+v: want permit 1, the same lease", leases[0], leases[1])
	}
	if s.locks.permits.reserved(permitKey(sem, 1)) || s.locks.permits.pending(requestHash(streams.PermitQueue(sem), "a", "")) != nil {
		t.Fatal("a reservation outlived its grant")
	}
}
