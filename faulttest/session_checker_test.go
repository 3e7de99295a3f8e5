package faulttest

import (
	"time"

	"github.com/jetlock/jetlock/streams"
)

// What the checker knows of sessions.
//
// A session's client deadline is the latest send time of an acknowledged
// open or keepalive plus the TTL it answered (the clients' safety margin
// here is zero, as for leases: the service may end the session only
// later, at TTL plus grace after it saw that request land). Every lease
// granted in the session is valid from its grant's reply until that
// deadline, or until its holder invoked its release or cancel, or the
// session's close, whichever is first (Check sets lease.end so); the
// invariants on leases then apply to session leases and plain leases
// alike. A lock set or a permit granted in a session is, once expanded
// (see expand), a lease in that session of each resource of the set and
// of the permit's key: each counts as ended when its session does, and
// every rule here and above applies to each. checkSessions adds what is
// particular to sessions.

// sessInfo is everything the history says about one session id.
type sessInfo struct {
	id         string
	deadline   time.Duration // latest client deadline of an acknowledged open or keepalive
	deadlineOp *Op
	closeOp    *Op // the earliest close invoked, whatever its outcome: from then on its holder counts the session gone
	closed     *Op // the earliest acknowledged close (closed true or false)
	closes     []*Op
	// acks are the acknowledged opens and keepalives.
	acks []*Op
}

// sessionsOf gathers the sessions of a history.
func sessionsOf(ops []Op) map[string]*sessInfo {
	out := map[string]*sessInfo{}
	get := func(id string) *sessInfo {
		s := out[id]
		if s == nil {
			s = &sessInfo{id: id}
			out[id] = s
		}
		return s
	}
	for i := range ops {
		o := &ops[i]
		if o.Session == "" {
			continue
		}
		switch o.Kind {
		case KOpen, KKeepalive:
			if o.Result != OK {
				continue
			}
			s := get(o.Session)
			s.acks = append(s.acks, o)
			if o.Deadline > s.deadline {
				s.deadline, s.deadlineOp = o.Deadline, o
			}
		case KClose:
			s := get(o.Session)
			s.closes = append(s.closes, o)
			if s.closeOp == nil || o.Invoke < s.closeOp.Invoke {
				s.closeOp = o
			}
			if o.Result == OK && (s.closed == nil || o.Complete < s.closed.Complete) {
				s.closed = o
			}
		}
	}
	return out
}

// deadlineBefore returns the session's client deadline as an operation
// sent at t must find it: counted from the opens and keepalives
// acknowledged before t (whose effect t must see), with the one that sets
// it.
func (s *sessInfo) deadlineBefore(t time.Duration) (time.Duration, *Op) {
	var d time.Duration
	var by *Op
	for _, k := range s.acks {
		if k.Complete < t && k.Deadline > d {
			d, by = k.Deadline, k
		}
	}
	return d, by
}

// closeInvokedBefore reports whether a close of the session other than
// not was sent before t.
func (s *sessInfo) closeInvokedBefore(t time.Duration, not *Op) bool {
	for _, c := range s.closes {
		if c != not && c.Invoke < t {
			return true
		}
	}
	return false
}

// mayHaveEnded reports whether the session s may have ended by the time
// o, a request in it, was answered: a close of it was sent before, or its
// client deadline as o had to find it had passed. A session the history
// never saw opened (nil) may have.
func (s *sessInfo) mayHaveEnded(o *Op) bool {
	if s == nil || s.closeInvokedBefore(o.Complete, nil) {
		return true
	}
	d, _ := s.deadlineBefore(o.Invoke)
	return o.Complete >= d
}

// checkSessions checks what is particular to sessions:
//
//   - session-id: an open's request id names one session: every
//     acknowledged open (and retry) of it answers the same session id;
//   - session-closed: no acquire in a session succeeds when sent after
//     the session's close was acknowledged (closed true or false);
//   - close-lost: after an acknowledged close, no keepalive or retried
//     open of the session succeeds, nor a close answered closed:true, nor
//     a release of one of its leases answered released:true, when sent
//     afterwards;
//   - session-lost: the service does not answer that a session has ended
//     (a keepalive or retried open answered lease_lost, a close answered
//     closed:false, an acquire in it, neither retried nor cancelled,
//     answered lease_lost) before the session's client deadline as the
//     request had to find it, unless a close of it was sent before (an
//     open whose replies were all lost: before the TTL has passed since
//     its first attempt was sent); and once a keepalive or an open has
//     been answered lease_lost (the session's record is gone), nothing in
//     the session succeeds when sent afterwards, nor another open of the
//     same request id. (An acquire answered lease_lost only tells that
//     the answering instance counted the session expired, which it may do
//     after the client's deadline even when a late keepalive then keeps
//     the record: it does not forbid later successes.)
func checkSessions(ops []Op, sessions map[string]*sessInfo, leases map[string]*lease, rep *Report) {
	firstOpen, openLost, cancelled := requestFacts(ops, rep)
	gone := map[string]*Op{} // session -> earliest keepalive or open answered lease_lost
	for i := range ops {
		o := &ops[i]
		// An open refused as ended: the session an earlier attempt made
		// (unseen) lived at least its TTL from that attempt's sending.
		if o.Kind == KOpen && o.Result == Fail && o.Code == "lease_lost" && o.Session == "" && o.Complete < firstOpen[o.RequestID]+o.TTL {
			rep.add("session-lost", "open %s answered ended at %v, before a session opened by its first attempt (sent at %v) could have expired: %v",
				o.RequestID, o.Complete, firstOpen[o.RequestID], o)
		}
		s := sessions[o.Session]
		if o.Session == "" || s == nil {
			continue
		}
		ended := false
		switch o.Kind {
		case KKeepalive, KOpen:
			ended = o.Result == Fail && o.Code == "lease_lost"
			if ended && (gone[o.Session] == nil || o.Complete < gone[o.Session].Complete) {
				gone[o.Session] = o
			}
		case KClose:
			ended = o.Result == OK && !o.Flag
		case KAcquire:
			if t, ok := cancelled[reqKey{o.Resource, o.RequestID}]; ok && t < o.Complete {
				break
			}
			ended = o.Result == Fail && o.Code == "lease_lost" && !o.Retry
		}
		if !ended || s.closeInvokedBefore(o.Complete, o) {
			continue
		}
		if d, by := s.deadlineBefore(o.Invoke); o.Complete < d {
			rep.add("session-lost", "session %s answered ended at %v, before its client deadline %v (%v): %v", short(o.Session), o.Complete, d, by, o)
		}
	}

	for i := range ops {
		o := &ops[i]
		if o.Result != OK {
			continue
		}
		id := o.Session
		switch o.Kind {
		case KAcquire, KKeepalive, KOpen:
		case KClose, KRelease:
			if !o.Flag {
				continue // closed:false, released:false
			}
			if l := leases[o.LeaseID]; o.Kind == KRelease && l != nil {
				id = l.session
			}
		default:
			continue
		}
		s := sessions[id]
		if id == "" || s == nil {
			continue
		}
		if c := s.closed; c != nil && o.Invoke > c.Complete {
			if o.Kind == KAcquire {
				rep.add("session-closed", "granted in session %s after its close was answered: %v after %v", short(id), o, c)
			} else {
				rep.add("close-lost", "session %s: %v succeeded after its close was answered: %v", short(id), o, c)
			}
		}
		if g := gone[id]; g != nil && o.Invoke > g.Complete && o.Kind != KRelease {
			rep.add("session-lost", "session %s: %v succeeded after the service answered it had ended: %v", short(id), o, g)
		}
		if g := openLost[o.RequestID]; o.Kind == KOpen && g != nil && o.Invoke > g.Complete {
			rep.add("session-lost", "open %s: %v succeeded after the service answered its session had ended: %v", o.RequestID, o, g)
		}
	}
}

// cancelKeys returns the acquires that the cancel o (as expand gives it,
// one per key) ends: the acquire of its key, and for a permit's key
// "<sem>#<k>" also an acquire of the semaphore whose permit no reply
// named, which expand puts on the semaphore's queue key "<sem>#".
func cancelKeys(o *Op) []reqKey {
	keys := []reqKey{{o.Resource, o.RequestID}}
	if sem, _, ok := streams.SplitPermit(o.Resource); ok {
		keys = append(keys, reqKey{streams.PermitQueue(sem), o.RequestID})
	}
	return keys
}

// requestFacts gathers what checkSessions needs of the requests of ops:
// per open's request id, when it was first sent and its earliest answer
// lease_lost (and it checks that every acknowledged open of it answers
// one session: session-id); per acquire (see cancelKeys), when a cancel
// of it was first sent.
func requestFacts(ops []Op, rep *Report) (firstOpen map[string]time.Duration, openLost map[string]*Op, cancelled map[reqKey]time.Duration) {
	byOpen := map[string]*Op{}
	firstOpen = map[string]time.Duration{}
	openLost = map[string]*Op{}
	cancelled = map[reqKey]time.Duration{}
	for i := range ops {
		o := &ops[i]
		if o.Kind == KOpen {
			if t, ok := firstOpen[o.RequestID]; !ok || o.Invoke < t {
				firstOpen[o.RequestID] = o.Invoke
			}
			if p := openLost[o.RequestID]; o.Result == Fail && o.Code == "lease_lost" && (p == nil || o.Complete < p.Complete) {
				openLost[o.RequestID] = o
			}
		}
		switch {
		case o.Kind == KOpen && o.Result == OK:
			if p := byOpen[o.RequestID]; p != nil && p.Session != o.Session {
				rep.add("session-id", "open %s answered two sessions: %v and %v", o.RequestID, p, o)
			} else if p == nil {
				byOpen[o.RequestID] = o
			}
		case o.Kind == KCancel:
			for _, k := range cancelKeys(o) {
				if t, ok := cancelled[k]; !ok || o.Invoke < t {
					cancelled[k] = o.Invoke
				}
			}
		}
	}
	return firstOpen, openLost, cancelled
}
