// Package fence is the protected-resource side of jetlock's fencing
// tokens: it keeps, per resource, the highest token accepted and rejects
// every request that carries a smaller one.
//
// # Why a lock is not enough
//
// A lease tells the lock service when someone else may take over; it cannot
// stop the old holder. A holder that is paused past its TTL — a long GC
// pause, a frozen VM, a slow disk, a network partition — wakes up still
// believing it holds the lock, and its next write lands after the new
// holder's. No client-side check can close that gap: the pause can happen
// between the check and the write. Only the resource can refuse the write.
//
// jetlock gives every grant a fencing token that is strictly larger than
// every earlier grant's for the same resource (client Lease.Token(); for a
// lock set, which holds several resources under one lease, each resource
// has its own: Lease.TokenOf(resource), and each resource's guard checks
// that resource's token). The resource remembers the highest token it has
// accepted:
//
//	A acquires (token 7), writes with 7      accepted, highest = 7
//	A pauses; its lease expires
//	B acquires (token 9), writes with 9      accepted, highest = 9
//	A resumes, writes with 7                 rejected: 7 < 9
//
// Equal tokens are accepted, so one holder may do many operations. A write
// sent before B acquired but delivered after B's is rejected the same way.
//
// # Using it
//
// Pass the lease's token with every request to the protected resource, and
// have the resource check it in the same atomic step as the write:
//
//   - Memory: for a resource that lives in one process. Memory.Do runs the
//     write while no newer token can be accepted.
//   - KV: for state kept in a JetStream key-value bucket. Every acceptance is
//     a compare-and-set on a guard record per resource; KV.Put stores the
//     data in that same record, so check and write are one operation.
//   - SQL: for a SQL database. SQL.Write (or SQL.CheckTx in your own
//     transaction) upserts the fence row with
//     "… WHERE f.token <= excluded.token" and commits it together with the
//     protected statements; or keep a fence column on the protected row and
//     write "UPDATE t SET …, fence = $token WHERE id = $id AND fence <= $token".
//
// A bare Guard.Check followed by an unrelated write is check-then-act: a
// newer holder can be accepted and write between the two, and the older
// write then overwrites it. Use Check on its own only where the resource
// serializes the check and the write itself.
//
// A rejection is a *StaleTokenError matching ErrStaleToken: the caller has
// lost its lease and must stop, not retry with the same token. Any other
// error leaves the outcome unknown; treat the token as not accepted. Each
// guard counts its rejections (Rejected) for operators; NewCollector
// exports them to Prometheus.
//
// The fence state must live at least as long as the data it protects: if it
// is lost (a wiped Memory, a deleted guard record) while the data survives,
// the next token — whatever its value — is accepted again.
package fence
