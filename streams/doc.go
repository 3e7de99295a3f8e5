// Package streams is jetlock's wire contract and its JetStream assets.
//
// It holds the request subjects, the JSON request and response bodies, the
// error codes of the contract, the validation rules every field must pass,
// the mapping from resource names to KV keys, and the definition of the
// replicated key-value bucket that stores lock state (with Ensure, which
// creates or checks it). It is the one package that both the service and the
// client import; it pulls in no server code.
//
// Key mapping: the lease record of resource R lives at KV key
// "lease." + EncodeResource(R). EncodeResource keeps letters, digits, '-',
// '_' and '/' as they are and writes every other byte as '=' followed by
// two upper-case hex digits, so "orders/123" is stored at
// "lease.orders/123" and "lock:backup:user1" at "lease.lock=3Abackup=3Auser1".
// The mapping is one-to-one, and `nats kv get jetlock lease.<encoded>` shows
// the record. Waiters queued on R are at "wait." + EncodeResource(R) + "." +
// a hash of their request id, so `nats kv ls jetlock` or
// `nats kv watch jetlock 'wait.>'` shows a queue.
package streams
