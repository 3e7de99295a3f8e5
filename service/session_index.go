package service

import (
	"strings"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// What the tracker knows of sessions. A session record is held like a
// lease record (at its own key, with its own due item: a session expires
// by observation exactly as a lease does), and the tracker indexes, for
// each session, the lease and waiter keys whose records name it. That
// index is what ending a session walks: its cost is the session's size,
// never the bucket's.
//
// A lease of a session carries no expiry of its own but its hold limit;
// it ends when its session ends. When the tracker sees a session end, it
// makes each of its leases and waits due at once plus sessionTakeover: the
// instance that ended the session ends them itself first (endSession), and
// the others step in only for what it left (it died, or lost its
// connection).

// sessionTakeover is how long after a session's end other instances leave
// its leases to the instance that ended it.
const sessionTakeover = 2 * time.Second

// sessionIndex is what the tracker knows of sessions: the members of each
// and the count of live sessions by tenant.
type sessionIndex struct {
	// t is the tracker whose mu guards the index.
	t *tracker
	// sessions indexes the lease and waiter keys of each session (by its
	// key hash); tenantSessions counts the live sessions of each tenant,
	// nSessions all of them.
	sessions       map[string]*sessionMembers
	tenantSessions map[string]int
	nSessions      int
	// orphans holds the sessions whose members the tracker knows but whose
	// records it did not find once synced: their members are due at once.
	orphans map[string]struct{}
}

// sessionMembers is the index of one session: its lease and waiter keys.
type sessionMembers struct {
	leases, waits map[string]struct{}
}

func (m *sessionMembers) size() int { return len(m.leases) + len(m.waits) }

// isSessionKey reports whether key holds a session record.
func isSessionKey(key string) bool { return strings.HasPrefix(key, streams.SessionKeyPrefix) }

// sessionHashOf returns the key hash of a session key.
func sessionHashOf(key string) string { return strings.TrimPrefix(key, streams.SessionKeyPrefix) }

// indexSessionMember moves key (a lease or waiter key) in the session
// index from the session of old (if any) to the session of rec (if any).
// The caller holds t.mu.
func (ix *sessionIndex) indexSessionMember(key string, old, rec *streams.Record) {
	var from, to string
	if old != nil {
		from = old.Session
	}
	if rec != nil {
		to = rec.Session
	}
	if from == to {
		return
	}
	waiter := strings.HasPrefix(key, streams.WaitKeyPrefix)
	if m := ix.sessions[from]; from != "" && m != nil {
		if waiter {
			delete(m.waits, key)
		} else {
			delete(m.leases, key)
		}
		if m.size() == 0 {
			delete(ix.sessions, from)
			delete(ix.orphans, from)
		}
	}
	if to == "" {
		return
	}
	m := ix.sessions[to]
	if m == nil {
		m = &sessionMembers{leases: map[string]struct{}{}, waits: map[string]struct{}{}}
		ix.sessions[to] = m
	}
	if waiter {
		m.waits[key] = struct{}{}
	} else {
		m.leases[key] = struct{}{}
	}
}

// sessionChanged follows a write of a session's key: it moves the
// session's count from the tenant that held it (if wasHeld) to the tenant
// of e (if held), and when the session ended, makes its members due. The
// caller holds t.mu.
func (ix *sessionIndex) sessionChanged(key string, wasHeld bool, wasTenant string, e entry, now time.Time) {
	delete(ix.orphans, sessionHashOf(key))
	if wasHeld && e.held() && e.rec.Tenant == wasTenant {
		return // a keepalive
	}
	if wasHeld {
		if ix.tenantSessions[wasTenant]--; ix.tenantSessions[wasTenant] <= 0 {
			delete(ix.tenantSessions, wasTenant)
		}
		ix.nSessions--
	}
	if e.held() {
		ix.tenantSessions[e.rec.Tenant]++
		ix.nSessions++
		return
	}
	if wasHeld {
		ix.membersDue(sessionHashOf(key), now.Add(sessionTakeover))
	}
}

// membersDue makes the leases and waiter records of session hash due at
// at. The caller holds t.mu.
func (ix *sessionIndex) membersDue(hash string, at time.Time) {
	m := ix.sessions[hash]
	if m == nil {
		return
	}
	d := at.Sub(ix.t.epoch)
	for _, keys := range []map[string]struct{}{m.leases, m.waits} {
		for key := range keys {
			o, ok := ix.t.keys[key]
			if !ok || !o.held() || (o.due != 0 && o.due <= d) {
				continue
			}
			o.due = d
			ix.t.keys[key] = o
			ix.t.due.push(dueItem{at: d, key: o.key, rev: o.rev})
		}
	}
}

// orphansDue makes due the leases and waits of every session the tracker
// does not know, once its watcher has delivered every record: their
// session's record is gone, and expire ends them on a fresh read that
// proves it (see sessionOps.sessionGone).
func (ix *sessionIndex) orphansDue(now time.Time) {
	ix.t.mu.Lock()
	defer ix.t.mu.Unlock()
	for hash := range ix.sessions {
		if _, known := ix.t.lookup(streams.SessionKey(hash)); !known {
			ix.orphans[hash] = struct{}{}
			ix.membersDue(hash, now)
		}
	}
}

// orphanedLocked reports whether rec, a lease or waiter record, belongs
// to a session the tracker suspects gone (see orphansDue). The caller
// holds t.mu.
func (ix *sessionIndex) orphanedLocked(rec *streams.Record) bool {
	if rec == nil || rec.Session == "" {
		return false
	}
	_, ok := ix.orphans[rec.Session]
	return ok
}

// sessionEnded reports whether the tracker knows session hash to have
// ended, and when it saw that. A session it does not know (never seen, or
// forgotten after the retry window) is not known to have ended: whoever
// must decide reads its record. The caller holds t.mu.
func (ix *sessionIndex) sessionEndedLocked(hash string) (time.Time, bool) {
	o, known := ix.t.lookup(streams.SessionKey(hash))
	if !known || o.held() || o.foreign {
		return time.Time{}, false
	}
	return o.seen, true
}

// sessionLeaseEnded reports whether rec, a lease or waiter record, belongs
// to a session the tracker knows to have ended.
func (ix *sessionIndex) sessionLeaseEnded(rec *streams.Record) bool {
	if rec == nil || rec.Session == "" {
		return false
	}
	ix.t.mu.Lock()
	defer ix.t.mu.Unlock()
	_, ended := ix.sessionEndedLocked(rec.Session)
	return ended
}

// members returns the lease and waiter keys of session hash.
func (ix *sessionIndex) members(hash string) (leases, waits []string) {
	ix.t.mu.Lock()
	defer ix.t.mu.Unlock()
	m := ix.sessions[hash]
	if m == nil {
		return nil, nil
	}
	for k := range m.leases {
		leases = append(leases, k)
	}
	for k := range m.waits {
		waits = append(waits, k)
	}
	return leases, waits
}

// memberCount returns the number of leases and waits of session hash.
func (ix *sessionIndex) memberCount(hash string) (leases, total int) {
	ix.t.mu.Lock()
	defer ix.t.mu.Unlock()
	m := ix.sessions[hash]
	if m == nil {
		return 0, 0
	}
	return len(m.leases), m.size()
}

// tenantSessionCount returns the number of sessions of tenant, and of all
// tenants.
func (ix *sessionIndex) sessionCounts(tenant string) (ofTenant, all int) {
	ix.t.mu.Lock()
	defer ix.t.mu.Unlock()
	return ix.tenantSessions[tenant], ix.nSessions
}

// sessionInfo returns the owner and expiry of session hash as the
// tracker knows it, and whether it knows it live.
func (ix *sessionIndex) sessionInfo(hash string) (owner, expires string, ok bool) {
	ix.t.mu.Lock()
	defer ix.t.mu.Unlock()
	if o, ok := ix.t.keys[streams.SessionKey(hash)]; ok && o.held() {
		return o.rec.Owner, o.rec.ExpiresAt, true
	}
	return "", "", false
}
