package service

import (
	"hash/maphash"
	"time"
)

// retryMemory remembers, for the retry window, the request ids whose
// leases ended (keyed by lease key, request id and tenant), so that a
// retry is answered lease_lost even when JetStream has forgotten the
// grant's message id: it rebuilds its duplicate table after a restart only
// from the messages still stored (nats-server issue 3272), and a released
// or renewed grant is no longer stored. At most maxEnded are kept; the end
// marks in the bucket cover what is dropped. An id is kept as a 64-bit
// hash of key, request id and tenant, and its time as an offset from the
// tracker's epoch, in a table without pointers (recentIDs); a collision
// would answer a new request lease_lost, with a chance of about one in
// 2^64 over the retry window's ids. It lives under the tracker's lock.
type retryMemory struct {
	t   *tracker
	ids recentIDs
}

// maxEnded bounds the ended request ids an instance remembers.
const maxEnded = 1 << 20

// note records that the lease of requestID at key ended, and forgets what
// is older than the retry window or beyond maxEnded. The caller holds
// t.mu.
func (m *retryMemory) note(key, requestID, tenant string, now time.Time) {
	m.ids.note(m.id(key, requestID, tenant), now.Sub(m.t.epoch))
	for m.ids.entries() > maxEnded {
		m.ids.dropOldest()
	}
	m.forget(now, 16)
}

// forget forgets up to n ended request ids older than the retry window.
// It runs whenever a lease ends and on every sweep, so that what a burst
// of leases left is forgotten even when no lease ends after it. The
// caller holds t.mu.
func (m *retryMemory) forget(now time.Time, n int) {
	m.ids.expire(now.Sub(m.t.epoch), m.t.window, n)
}

// id is the id under which the end of the lease of requestID of tenant at
// key is remembered.
func (m *retryMemory) id(key, requestID, tenant string) uint64 {
	var h maphash.Hash
	h.SetSeed(m.t.seed)
	h.WriteString(key)
	h.WriteByte(0)
	h.WriteString(requestID)
	h.WriteByte(0)
	h.WriteString(tenant)
	return h.Sum64()
}

// hasEnded reports whether the lease of requestID of tenant at key ended
// within the retry window.
func (m *retryMemory) hasEnded(key, requestID, tenant string) bool {
	m.t.mu.Lock()
	defer m.t.mu.Unlock()
	at, ok := m.ids.seen(m.id(key, requestID, tenant))
	return ok && time.Since(m.t.epoch)-at <= m.t.window
}
