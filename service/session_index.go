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
func (t *tracker) indexSessionMember(key string, old, rec *streams.Record) {
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
	if m := t.sessions[from]; from != "" && m != nil {
		if waiter {
			delete(m.waits, key)
		} else {
			delete(m.leases, key)
		}
		if m.size() == 0 {
			delete(t.sessions, from)
			delete(t.orphans, from)
		}
	}
	if to == "" {
		return
	}
	m := t.sessions[to]
	if m == nil {
		m = &sessionMembers{leases: map[string]struct{}{}, waits: map[string]struct{}{}}
		t.sessions[to] = m
	}
	if waiter {
		m.waits[key] = struct{}{}
	} else {
		m.leases[key] = struct{}{}
	}
}

// countTenantSession moves a session key's count from the tenant that
// held it (if wasHeld) to the tenant of e (if held), and when the session
// ended, makes its members due. The caller holds t.mu.
func (t *tracker) sessionChanged(key string, wasHeld bool, wasTenant string, e entry, now time.Time) {
	delete(t.orphans, sessionHashOf(key))
	if wasHeld && e.held() && e.rec.Tenant == wasTenant {
		return // a keepalive
	}
	if wasHeld {
		if t.tenantSessions[wasTenant]--; t.tenantSessions[wasTenant] <= 0 {
			delete(t.tenantSessions, wasTenant)
		}
		t.nSessions--
	}
	if e.held() {
		t.tenantSessions[e.rec.Tenant]++
		t.nSessions++
		return
	}
	if wasHeld {
		t.membersDue(sessionHashOf(key), now.Add(sessionTakeover))
	}
}

// membersDue makes the leases and waiter records of session hash due at
// at. The caller holds t.mu.
func (t *tracker) membersDue(hash string, at time.Time) {
	m := t.sessions[hash]
	if m == nil {
		return
	}
	d := at.Sub(t.epoch)
	for _, keys := range []map[string]struct{}{m.leases, m.waits} {
		for key := range keys {
			o, ok := t.keys[key]
			if !ok || !o.held() || (o.due != 0 && o.due <= d) {
				continue
			}
			o.due = d
			t.keys[key] = o
			t.due.push(dueItem{at: d, key: o.key, rev: o.rev})
		}
	}
}

// orphansDue makes due the leases and waits of every session the tracker
// does not know, once its watcher has delivered every record: their
// session's record is gone, and expire ends them on a fresh read that
// proves it (see sessionOps.sessionGone).
func (t *tracker) orphansDue(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for hash := range t.sessions {
		if _, known := t.lookup(streams.SessionKey(hash)); !known {
			t.orphans[hash] = struct{}{}
			t.membersDue(hash, now)
		}
	}
}

// orphanedLocked reports whether rec, a lease or waiter record, belongs
// to a session the tracker suspects gone (see orphansDue). The caller
// holds t.mu.
func (t *tracker) orphanedLocked(rec *streams.Record) bool {
	if rec == nil || rec.Session == "" {
		return false
	}
	_, ok := t.orphans[rec.Session]
	return ok
}

// sessionEnded reports whether the tracker knows session hash to have
// ended, and when it saw that. A session it does not know (never seen, or
// forgotten after the retry window) is not known to have ended: whoever
// must decide reads its record. The caller holds t.mu.
func (t *tracker) sessionEndedLocked(hash string) (time.Time, bool) {
	o, known := t.lookup(streams.SessionKey(hash))
	if !known || o.held() || o.foreign {
		return time.Time{}, false
	}
	return o.seen, true
}

// sessionLeaseEnded reports whether rec, a lease or waiter record, belongs
// to a session the tracker knows to have ended.
func (t *tracker) sessionLeaseEnded(rec *streams.Record) bool {
	if rec == nil || rec.Session == "" {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ended := t.sessionEndedLocked(rec.Session)
	return ended
}

// members returns the lease and waiter keys of session hash.
func (t *tracker) members(hash string) (leases, waits []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.sessions[hash]
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
func (t *tracker) memberCount(hash string) (leases, total int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.sessions[hash]
	if m == nil {
		return 0, 0
	}
	return len(m.leases), m.size()
}

// tenantSessionCount returns the number of sessions of tenant, and of all
// tenants.
func (t *tracker) sessionCounts(tenant string) (ofTenant, all int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tenantSessions[tenant], t.nSessions
}

// sessionInfo returns the owner and expiry of session hash as the
// tracker knows it, and whether it knows it live.
func (t *tracker) sessionInfo(hash string) (owner, expires string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o, ok := t.keys[streams.SessionKey(hash)]; ok && o.held() {
		return o.rec.Owner, o.rec.ExpiresAt, true
	}
	return "", "", false
}
