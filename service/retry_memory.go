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

// recentIDs remembers 64-bit ids for the retry window, each with when it
// was noted (an offset from the tracker's epoch), and forgets them oldest
// first. The tracker keeps the ended request ids in one: one per release
// over the window, a quarter of a million at the design load.
//
// A Go map beside a queue of what to forget held each id twice, in about
// one and a half times the space. Here an id sits once, in a ring in the order noted, and
// an open-addressing index of ring positions (linear probing, at most two
// thirds full) finds it. Neither holds a pointer, so the garbage
// collector never scans them. An id noted again leaves its old entry in the
// ring, dead, until the ring's front passes it.
type recentIDs struct {
	ring     []seenAt[uint64]
	front, n int      // position of the oldest entry; entries, dead ones included
	index    []uint32 // ring position + 1 of each live id's entry; 0 is empty
	live     int      // ids in the index
}

// dead marks a ring entry whose id was noted again since.
const dead = time.Duration(-1)

// minRecent is the smallest ring and index.
const minRecent = 64

// len is the number of ids remembered; entries counts the ring's entries,
// dead ones included, which bounds its memory.
func (r *recentIDs) len() int     { return r.live }
func (r *recentIDs) entries() int { return r.n }

// home is where id's probe starts in the index: ids are hashes already,
// mixed once more so that the low bits of any id spread over the index.
func (r *recentIDs) home(id uint64) int {
	return int((id * 0x9E3779B97F4A7C15) >> 32 & uint64(len(r.index)-1))
}

// slot returns the index slot that holds id, or the empty slot where it
// would go, and whether id is there.
func (r *recentIDs) slot(id uint64) (int, bool) {
	mask := len(r.index) - 1
	for i := r.home(id); ; i = (i + 1) & mask {
		p := r.index[i]
		if p == 0 {
			return i, false
		}
		if r.ring[p-1].v == id {
			return i, true
		}
	}
}

// pos is the ring position of the k-th oldest entry.
func (r *recentIDs) pos(k int) int {
	p := r.front + k
	if p >= len(r.ring) {
		p -= len(r.ring)
	}
	return p
}

// seen returns when id was last noted, if it is remembered.
func (r *recentIDs) seen(id uint64) (time.Duration, bool) {
	if r.live == 0 {
		return 0, false
	}
	i, ok := r.slot(id)
	if !ok {
		return 0, false
	}
	return r.ring[r.index[i]-1].at, true
}

// note remembers id as noted at, which is no earlier than any note before.
func (r *recentIDs) note(id uint64, at time.Duration) {
	if r.n == len(r.ring) {
		r.resize(r.live + 1 + (r.live+1)/4)
	}
	p := r.pos(r.n)
	r.ring[p] = seenAt[uint64]{v: id, at: at}
	r.n++
	i, ok := r.slot(id)
	if ok {
		r.ring[r.index[i]-1].at = dead
	} else {
		r.live++
	}
	r.index[i] = uint32(p + 1)
}

// dropOldest forgets the oldest entry, dead or alive.
func (r *recentIDs) dropOldest() {
	if e := r.ring[r.front]; e.at != dead {
		i, _ := r.slot(e.v) // found by comparing with the entry: unindex first
		r.unindex(i)
		r.live--
	}
	r.ring[r.front] = seenAt[uint64]{}
	r.front, r.n = r.pos(1), r.n-1
	if r.n == 0 {
		r.front = 0
	}
}

// expire forgets up to n ids noted more than window before since (dead
// entries on the way do not count), and shrinks the ring and index once
// they are mostly empty.
func (r *recentIDs) expire(since, window time.Duration, n int) {
	for r.n > 0 && n > 0 {
		e := r.ring[r.front]
		if e.at != dead {
			if since-e.at <= window {
				break
			}
			n--
		}
		r.dropOldest()
	}
	if len(r.ring) > minRecent && 4*r.n < len(r.ring) {
		r.resize(2 * r.live)
	}
}

// unindex empties index slot i, moving back the entries after it that
// probed past it (deletion without tombstones for linear probing).
func (r *recentIDs) unindex(i int) {
	mask := len(r.index) - 1
	for j := (i + 1) & mask; r.index[j] != 0; j = (j + 1) & mask {
		h := r.home(r.ring[r.index[j]-1].v)
		// The entry at j may move to i unless its home lies cyclically in
		// (i, j].
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			r.index[i] = r.index[j]
			i = j
		}
	}
	r.index[i] = 0
}

// resize moves the live entries, oldest first, into a ring of room for at
// least size and an index that a full ring leaves at most two thirds
// full.
func (r *recentIDs) resize(size int) {
	size = max(size, minRecent)
	ring := make([]seenAt[uint64], size)
	n := 0
	for k := range r.n {
		if e := r.ring[r.pos(k)]; e.at != dead {
			ring[n] = e
			n++
		}
	}
	slots := minRecent
	for slots < size+size/2 {
		slots <<= 1
	}
	r.ring, r.front, r.n, r.live = ring, 0, n, n
	r.index = make([]uint32, slots)
	for p := range n {
		i, _ := r.slot(ring[p].v)
		r.index[i] = uint32(p + 1)
	}
}

// reset forgets everything.
func (r *recentIDs) reset() { *r = recentIDs{} }
