// Package faulttest proves jetlock's safety invariants under faults, in
// the spirit of Jepsen's tests of etcd, ZooKeeper and NATS. It holds tests
// only; this file is its documentation.
//
// A test starts the in-process three-node cluster (streams/devcluster)
// with one service instance per node. Every service instance and every
// client reaches NATS through its own loopback proxy, which can pause
// (bytes held, then delivered late) or cut its connection; the routes
// between nodes pass through per-direction proxies that partition the
// cluster. Faults: leader step-down, one node isolated (a follower or the
// stream leader), every node isolated (no quorum anywhere), a node
// stopped and restarted, the whole cluster crashed and restarted from its
// disks, a paused or replaced service instance, a paused or cut client.
//
// A workload of raw request-reply clients and Go clients acquires (some
// waiting in the queue), renews, releases and cancels leases on a few hot
// and many cold resources, drops replies and retries with the same
// request_id, and writes through a fenced register (client/fence Memory
// guard) with its tokens, including late writes of ended leases. Session
// actors, in the scenarios that ask for them and in the soak, open
// sessions (raw session.open), keep them alive at a third of their TTL or
// stop doing so, acquire several resources in each (some waiting), now
// and then a lock set (out of the set actors' pool or the other
// resources) or a permit of a semaphore (the semaphore actors', same
// limit) in the session, write with each lease's token (each resource of
// a set, and each permit, fenced on its own), release some (a set whole,
// a permit by its number), and close the session, sometimes while its
// acquires are in flight, then probe the closed session. Actors
// of lock sets, semaphores and elections, in the scenarios that ask for
// them and in the soak, are raw clients too: set actors acquire sets of 2
// to 4 resources out of a small pool, overlapping and named in random
// orders, some waiting, and sometimes one resource of the pool alone, in
// the same queues; they write to each resource with its own token, renew
// and release the set whole (and probe that one resource alone is
// refused), cancel it or abandon it. Semaphore actors take one of the N=3
// permits of a semaphore (some waiting), renew and release it by its
// number, and fence each permit's writes on its own key, "<sem>#<k>".
// Candidates campaign for an election (an acquire with a value, usually
// waiting), proclaim new values with their renewals, read the status, and
// resign, are cancelled or stop renewing. An observer records every
// election event, and an inspector watches every write to the bucket, in
// revision order. Every operation is recorded with its invocation and
// completion time and result, and the history is checked afterwards
// (Check): no two leases of a resource valid at once (a lease is valid
// from its grant's reply until the client's deadline, counted from the
// send time of its last acknowledged grant or renewal, or until its
// holder released or cancelled it; a lease in a session, until the
// session's deadline, counted from the send time of its last acknowledged
// keepalive or open, or until its holder released or cancelled it or
// closed the session);
// tokens unique and increasing in real-time order, per resource and
// across resources (they are revisions of one stream); the register never
// accepting a smaller token after a larger one; no acknowledged renewal,
// keepalive, release, cancel or close lost (nothing succeeds in a session
// after its close was answered, nor after the service answered that it
// had ended, and the service never says so before the session's
// deadline); one lease at most per request_id and one session per open's
// request_id; nothing granted, renewed or kept alive without a quorum;
// and, per resource, linearizability of the answers against a model of
// the lock record (porcupine), a session's close acting on each of its
// resources. Each resource of a lock set and each permit of a semaphore
// counts as a lease of its own key for all of these (the resource, and
// "<sem>#<k>"), so a set's resources and a semaphore's permits are
// excluded, tokened, fenced and linearized one by one; one taken in a
// session is a lease in that session of each of its keys, valid only as
// long as the session and ended with it, by every rule on sessions above.
// Besides: a set
// grant's reply lists every resource of the set with a token, a set is
// renewed and released only whole, a status shows a set's resource with
// its set's size, and the bucket never shows a set's lease on part of its
// resources between two commits; no more permits of a semaphore are valid
// at once than it has, each permit granted is one of its N, and one
// request gets one permit at most; the election events, ordered by
// revision, never show a lease still leading at or after the grant of a
// later one (two leaders without an end between them; missing events are
// tolerated), nor a lease leading after its end, nor a new leader while
// an earlier leader's lease is valid by its holder's deadline, and the
// values they and status show are the ones the leaders sent. Status
// replies are checked too, but a stale status read is reported as an
// anomaly: the contract does not promise linearizable status.
//
// Swap actors, in the test that asks for them, use a name of their own
// by turns as a semaphore and, once its permits have ended, as a lock;
// the check adds that no lock of a name is valid while a permit of it is
// (a name is one thing at a time). TestRollingUpgradeKeepsEveryLease runs
// the workload, semaphores of several limits and swap actors among it,
// against lockd processes instead of in-process instances: one built
// from an earlier commit of the repository's history and one of this
// tree on one bucket, then the old one stopped with SIGTERM beside a
// second new one (docs/compatibility.md).
//
// The scenario tests (Test…) run in CI, each in well under a minute. A
// soak runs every fault at random for as long as asked:
//
//	go test ./faulttest -run Soak -soak=1h -timeout 2h
//
// A failed check writes the history of every resource, with the faults
// interleaved, to a file under the system's temporary directory and logs
// its path. To see what the service instances did, set JETLOCK_TEST_LOGDIR
// to a directory: each instance then logs at debug level (waiter wakes,
// reservations, store errors) to a file of its own there.
package faulttest
