package faulttest

import (
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/testenv"
)

// The cancel of a permit's acquire is answered cancelled:false, and leaves
// the permit held, when the instance that answers it has not yet learnt
// of the grant: the request then still holds its permit, and its holder's
// next renewal succeeds. The contract: after a cancel, the request holds
// nothing and waits for nothing; a lease granted to it meanwhile is
// released.
//
// service/semaphores.go, cancelSem: the tombstone is written against the
// semaphore's queue key (never written, so its fresh read and the
// tombstone's compare-and-set say nothing about the permits; a tombstone
// refused as a duplicate of the grant's message id is the very proof that
// the request was granted). cancelPermit then looks for the request's
// permit only in the instance's tracker (heldPermit), never in the
// bucket, and finds none when the tracker is stale. A cancel of one
// resource or of a set does not: its tombstone reads each lease key fresh
// and compares and sets on it. An instance's tracker is stale when it has
// not followed the bucket for a while, as after it was cut off from the
// other instances for longer than the follower's linger (5s) and has not
// heard one since; here the others are paused when the partition heals,
// so that the isolated instance answers before it follows the bucket
// again. Found by this suite (TestSoak: a waiting permit acquire handed
// its permit by another instance, cancelled 300ms later through an
// instance on a node that had been isolated, answered cancelled:false,
// then renewed). This test fails until the service is fixed.
func TestPermitCancelByAStaleInstance(t *testing.T) {
	t.Parallel()
	h := StartHarness(t)
	var insts []*Instance
	for node := 0; node < 3; node++ {
		insts = append(insts, h.Serve(node, ServiceConfig()))
	}
	hist := NewHistory()
	var callers [3]*Caller
	for node := range callers {
		nc, _ := h.Connect(node, "probe")
		// One process's request through three nodes: the same owner, as a
		// cancel of its acquire must name.
		callers[node] = &Caller{NC: nc, H: hist, Client: node, Owner: "probe"}
	}
	const limit, ttl = 3, 30 * time.Second
	for round := 0; round < 2; round++ {
		sem := "stale/sem/" + itoa(round)
		x := (h.C.StreamLeader(lockStream) + 1) % 3
		h.Isolate(x)
		// The cancel must reach x's instance, and it through x's node.
		h.Attach(x, 20*time.Second, callers[x].NC, insts[x].Conn, insts[x].StoreConn)
		holder := callers[(x+1)%3]
		var g Op
		testenv.Eventually(t, 20*time.Second, func() bool {
			g = holder.AcquirePermit(sem, limit, "r", ttl, 0, true)
			return g.Result == OK
		}, "no grant on the majority side: %v", &g)
		time.Sleep(6 * time.Second) // the isolated instance hears no other: it stops following
		for i, inst := range insts {
			if i != x {
				inst.Pause()
			}
		}
		h.Heal()
		c := answered(t, 30*time.Second, "cancel", func() Op { return callers[x].CancelPermit(sem, limit, "r") })
		for i, inst := range insts {
			if i != x {
				inst.Resume()
			}
		}
		if c.Result != OK {
			t.Fatalf("cancel: %v", &c)
		}
		if rn := holder.RenewPermit(sem, g.Permit, g.LeaseID, ttl); rn.Result == OK {
			t.Fatalf("round %d: the request still holds its permit after its cancel was answered: grant %v, cancel through node %d (isolated until just before) %v, renewal after the cancel %v",
				round, &g, x, &c, &rn)
		}
		h.WaitCurrent(20 * time.Second)
	}
}
