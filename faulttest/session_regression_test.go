package faulttest

import (
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/testenv"
)

// A retried session.open is answered lease_lost ("request_id … opened a
// session before, and that session has ended") while the session its
// first attempt opened is alive: the same open, sent 200ms later, is
// answered with that session. Nobody could have ended it (nobody had its
// id), so the answer can only come from openSession's branch for a write
// JetStream acknowledges as a duplicate (service/sessions.go: "Opened
// before (and since ended, or the read above was stale)"), taken with the
// read already fresh. The likely path: the retry reaches another instance
// while the first attempt's write is being proposed; its write with the
// same message id is refused as a duplicate in process (a conflict), its
// fresh read does not show the first write yet, and its next write is
// acknowledged as a duplicate of the first, stored meanwhile. Acquire, in
// the same place, answers from the earlier write's revision
// (earlierGrant). The contract: a retry while the session lives returns
// the same session_id. Found by this suite (TestSessionsAcrossLeaderChanges:
// an open whose reply was dropped, retried within its TTL); about one
// retry in thirty sent right after the first attempt is answered so.
func TestRetriedOpenWhileTheFirstIsInFlight(t *testing.T) {
	t.Parallel()
	h := StartHarness(t)
	for node := 0; node < 3; node++ {
		h.Serve(node, ServiceConfig())
	}
	nc, _ := h.Connect(0, "client")
	c := &Caller{NC: nc, H: NewHistory(), Client: 1}
	const ttl = 5 * time.Second
	for i := 0; i < 300; i++ {
		rid := "retried-" + itoa(i)
		c.OpenDropReply(rid, ttl)
		op := c.OpenSession(rid, ttl, true)
		switch {
		case op.Result == OK:
			c.CloseSession(op.Session)
		case op.Result == Fail && op.Code == "lease_lost":
			time.Sleep(200 * time.Millisecond)
			again := c.OpenSession(rid, ttl, true)
			t.Fatalf("open %s, retried right after its first attempt (TTL %v), was answered that its session had ended: %v; 200ms later the same open: %v",
				rid, ttl, &op, &again)
		}
	}
}

// A session opened on the majority side while the stream's leader is cut
// off, then kept alive or closed through the old leader's node right after
// the partition heals, is answered as the live session it is: found by the
// soak (a close answered closed:false and a keepalive lease_lost, 0.1–0.4s
// after a heal, seconds before the session's deadline). The instance on the
// old leader's node has not seen the session: its watcher was cut off with
// the node, and the node, still leader in its own term until it hears the
// new one, answers reads from its old state.
func TestStaleSessionAfterHeal(t *testing.T) {
	t.Parallel()
	h, callers := servedEverywhere(t)
	const ttl = 10 * time.Second
	for round := 0; round < 5; round++ {
		old, err := h.IsolateLeader()
		if err != nil {
			t.Fatal(err)
		}
		var s Op
		testenv.Eventually(t, 20*time.Second, func() bool {
			s = callers[(old+1)%3].OpenSession("heal-"+itoa(round), ttl, true)
			return s.Result == OK
		}, "no session opened on the majority side")
		h.Heal()
		via := callers[old]
		if round%2 == 0 {
			k := received(func() Op { return via.Keepalive(s.Session) })
			t.Logf("round %d: keepalive through the old leader's node right after healing: %v", round, &k)
			if k.Result == Fail {
				t.Fatalf("the live session was answered %s by a keepalive: %v", k.Code, &k)
			}
		}
		c := received(func() Op { return via.CloseSession(s.Session) })
		t.Logf("round %d: close through the old leader's node right after healing: %v", round, &c)
		if c.Result == OK && !c.Flag {
			t.Fatalf("the live session was answered closed:false: %v", &c)
		}
		h.WaitCurrent(20 * time.Second)
	}
}

// received sends a request until it reaches a service instance: while the
// routes of a node that has just been healed are being set up again, its
// interest in the service's subjects may not have come back yet, and a
// request through it finds no responders (nobody received it; a caller
// sends it again). The answer of a service is what these tests judge.
func received(send func() Op) Op {
	op := send()
	for i := 0; i < 20 && op.Result == Fail && op.Code == "no_responders"; i++ {
		time.Sleep(50 * time.Millisecond)
		op = send()
	}
	return op
}
