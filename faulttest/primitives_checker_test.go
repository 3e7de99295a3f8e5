package faulttest

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// What the checker knows of lock sets, semaphores and elections.
//
// Each resource of a lock set, and each permit of a semaphore, is a lease
// of its own key: expand turns every operation on a set into one
// operation per resource (the set's lease id with the resource appended
// is that resource's lease id, the reply's token for it its token), and
// every operation on a semaphore into an operation on its permit's key
// "<sem>#<k>" (a cancel, which names no permit, into one per permit). The
// invariants on leases (mutual exclusion, tokens, the register, no
// acknowledged end lost, linearizability per key) then apply to set
// members and permits as to any lease, and the fenced register is kept
// per member and per permit. An election is a lock whose lease carries a
// value: its leases are checked as any other. checkPrimitives adds what
// is particular to each.

// memberLease is the lease id the checker gives resource res of the set
// lease id.
func memberLease(id, res string) string {
	if id == "" {
		return ""
	}
	return id + "/" + res
}

// sortedSet returns the resources of a set as the service orders them.
func sortedSet(res []string) []string {
	s := slices.Clone(res)
	slices.Sort(s)
	return slices.Compact(s)
}

// expand returns ops with every operation on a lock set or a semaphore
// replaced by the operations on the keys it acts on (see above). Each
// keeps the original's ID. A semaphore's status, the answering
// instance's view of its permits, is left to checkSemaphores.
func expand(ops []Op) []Op {
	// The permit each semaphore request was granted, to place its
	// attempts that were not answered with it.
	permitOf := map[reqKey]int{}
	for i := range ops {
		o := &ops[i]
		if o.Kind == KAcquire && o.Limit > 0 && o.Result == OK && o.Permit > 0 {
			if k := (reqKey{o.Resource, o.RequestID}); permitOf[k] == 0 {
				permitOf[k] = o.Permit
			}
		}
	}
	out := make([]Op, 0, len(ops))
	for _, o := range ops {
		switch {
		case len(o.Resources) > 0:
			tokens := map[string]uint64{}
			for _, m := range o.Members {
				tokens[m.Resource] = m.Token
			}
			for _, r := range sortedSet(o.Resources) {
				m := o
				m.Resource, m.Resources, m.Members, m.LeaseID = r, nil, nil, memberLease(o.LeaseID, r)
				if o.Result == OK && (o.Kind == KAcquire || o.Kind == KRenew) {
					m.Token = tokens[r]
				}
				out = append(out, m)
			}
		case o.Kind == KStatus && o.Limit > 0:
		case o.Kind == KCancel && o.Limit > 0:
			for k := 1; k <= o.Limit; k++ {
				m := o
				m.Resource = streams.PermitResource(o.Resource, k)
				out = append(out, m)
			}
		case o.Kind == KAcquire && o.Limit > 0:
			k := o.Permit
			if o.Result != OK || k == 0 {
				k = permitOf[reqKey{o.Resource, o.RequestID}]
			}
			m := o
			m.Resource = streams.PermitQueue(o.Resource) // no permit known: a key no lease has
			if k > 0 {
				m.Resource = streams.PermitResource(o.Resource, k)
			}
			out = append(out, m)
		case o.Permit > 0:
			m := o
			m.Resource = streams.PermitResource(o.Resource, o.Permit)
			out = append(out, m)
		default:
			out = append(out, o)
		}
	}
	return out
}

// checkPrimitives checks what is particular to lock sets, semaphores and
// elections, on the history as recorded (ops), the leases Check found in
// its expanded form, and what the bucket's watch saw (see
// checkSets, checkSemaphores, checkElections, checkKinds, checkBucket).
func checkPrimitives(ops []Op, leases map[string]*lease, bucket []BucketWrite, rep *Report) {
	checkSets(ops, leases, rep)
	checkSemaphores(ops, leases, rep)
	checkElections(ops, leases, rep)
	checkKinds(leases, rep)
	checkBucket(bucket, rep)
}

type resToken struct {
	res   string
	token uint64
}

// checkSets checks lock sets:
//
//   - set-grant: a granted or renewed set's reply lists every resource of
//     the set, in order, each once, each with a token, and no other
//     resource; a set's tokens are distinct (each is the revision of its
//     own key's write);
//   - set-member: a renewal or release naming one resource of a set (with
//     the set's lease id) never succeeds: a set is renewed and released
//     whole;
//   - set-partial: a status that shows a resource held with the token of
//     a set's grant shows that set's size (set_size), and one that shows a
//     lease of its own shows none.
func checkSets(ops []Op, leases map[string]*lease, rep *Report) {
	setIDs := map[string]*Op{} // set lease id -> a grant
	size := map[resToken]int{} // a grant's token on a resource -> the size of its set (0: a lease of its own)
	for i := range ops {
		o := &ops[i]
		if o.Result != OK || o.Kind != KAcquire && o.Kind != KRenew {
			continue
		}
		if len(o.Resources) == 0 {
			if o.Kind == KAcquire && o.Limit == 0 {
				size[resToken{o.Resource, o.Token}] = 0
			}
			continue
		}
		want := sortedSet(o.Resources)
		var got []string
		seen := map[uint64]bool{}
		for _, m := range o.Members {
			got = append(got, m.Resource)
			if m.Token == 0 || seen[m.Token] {
				rep.add("set-grant", "the reply gives %s the token %d (zero, or another resource's): %v", m.Resource, m.Token, o)
			}
			seen[m.Token] = true
			if o.Kind == KAcquire {
				size[resToken{m.Resource, m.Token}] = len(want)
			}
		}
		if !slices.Equal(got, want) {
			rep.add("set-grant", "%s of the set %v answered for %v: %v", o.label(), want, got, o)
		}
		if o.Kind == KAcquire && setIDs[o.LeaseID] == nil {
			setIDs[o.LeaseID] = o
		}
	}
	for i := range ops {
		o := &ops[i]
		switch {
		case o.Result != OK || len(o.Resources) > 0:
		case o.Kind == KRenew || o.Kind == KRelease && o.Flag:
			if g := setIDs[o.LeaseID]; g != nil {
				rep.add("set-member", "%v succeeded on one resource of the set lease %s (%v)", o, short(o.LeaseID), g)
			}
		case o.Kind == KStatus && o.Limit == 0 && o.Flag:
			if n, ok := size[resToken{o.Resource, o.Token}]; ok && n != o.SetSize {
				rep.add("set-partial", "status shows token %d of %s with set_size %d; that token was granted to a set of %d (0: a lease of its own): %v",
					o.Token, o.Resource, o.SetSize, n, o)
			}
		}
	}
}

// checkSemaphores checks semaphores:
//
//   - permits: a permit granted is one of the semaphore's (1 to its
//     limit) and a renewal is answered for the permit it names; at no
//     moment are more leases of a semaphore's permits valid (by the
//     clients' deadlines, as for mutual exclusion) than it has permits; a
//     semaphore's status lists at most its limit of permits, each once,
//     as many as it counts, each with a token no other permit's grant
//     carried;
//   - request-id: a request id is granted one permit at most (one lease),
//     whichever permit it is.
func checkSemaphores(ops []Op, leases map[string]*lease, rep *Report) {
	limit := map[string]int{}
	byReq := map[reqKey]*Op{}
	for i := range ops {
		o := &ops[i]
		if o.Limit > 0 && limit[o.Resource] == 0 {
			limit[o.Resource] = o.Limit
		}
		if o.Result != OK || o.Limit == 0 && o.Permit == 0 {
			continue
		}
		switch o.Kind {
		case KAcquire:
			if o.Permit < 1 || o.Permit > o.Limit || o.Note != "" {
				rep.add("permits", "a semaphore of %d permits granted permit %d: %v", o.Limit, o.Permit, o)
			}
			k := reqKey{o.Resource, o.RequestID}
			if p := byReq[k]; p != nil && p.LeaseID != o.LeaseID {
				rep.add("request-id", "request %s on semaphore %s granted two leases: %v and %v", o.RequestID, o.Resource, p, o)
			} else if p == nil {
				byReq[k] = o
			}
		case KRenew:
			if o.Note != "" {
				rep.add("permits", "%v", o)
			}
		}
	}
	// Valid permits at once, per semaphore.
	type edge struct {
		at    time.Duration
		delta int
		l     *lease
	}
	edges := map[string][]edge{}
	tokenKey := map[uint64]string{}
	for _, l := range leases {
		sem, _, ok := streams.SplitPermit(l.res)
		if !ok {
			continue
		}
		tokenKey[l.token] = l.res
		if l.granted < l.end {
			edges[sem] = append(edges[sem], edge{l.granted, 1, l}, edge{l.end, -1, l})
		}
	}
	for sem, es := range edges {
		n := limit[sem]
		if n == 0 {
			continue
		}
		sort.Slice(es, func(i, j int) bool {
			if es[i].at != es[j].at {
				return es[i].at < es[j].at
			}
			return es[i].delta < es[j].delta // ends first
		})
		valid := map[*lease]bool{}
		for _, e := range es {
			if e.delta < 0 {
				delete(valid, e.l)
				continue
			}
			valid[e.l] = true
			if len(valid) > n {
				var names []string
				for l := range valid {
					names = append(names, fmt.Sprintf("%s token %d valid [%v, %v]", l.res, l.token, l.granted, l.end))
				}
				sort.Strings(names)
				rep.add("permits", "%d leases of semaphore %s (%d permits) valid at %v: %s", len(valid), sem, n, e.at, strings.Join(names, "; "))
				break
			}
		}
	}
	for i := range ops {
		o := &ops[i]
		if o.Kind != KStatus || o.Limit == 0 || o.Result != OK {
			continue
		}
		seen := map[string]bool{}
		bad := o.SetSize != len(o.Members) || len(o.Members) > o.Limit
		for _, m := range o.Members {
			_, k, ok := streams.SplitPermit(m.Resource)
			if !ok || k > o.Limit || seen[m.Resource] {
				bad = true
			}
			seen[m.Resource] = true
			if key, ok := tokenKey[m.Token]; ok && key != m.Resource {
				bad = true
			}
		}
		if bad {
			rep.add("permits", "semaphore status lists permits beyond its limit, twice, not as many as it counts, or with another permit's token: %v", o)
		}
	}
}

// eventFact is what one election event shows: that lease token held the
// election at revision rev (elected, proclaimed), or no longer did
// (ended).
type eventFact struct {
	token, rev uint64
	op         *Op
}

// checkElections checks elections against the events observed (which may
// come more than once, or not at all: core NATS, every instance
// publishing each change it learns of) and against the leases of the
// history:
//
//   - events: an event names a token and a revision (a token no larger
//     than the revision: a grant's token is its own revision, an end or a
//     proclaim comes later), arrives on its resource's subject, and does
//     not show a lease holding the election at or after a revision where
//     an event showed it ended; a token of another resource's lease is
//     never shown;
//   - leaders: events ordered by revision never show two leaders at once:
//     an elected or proclaimed event says that its token held the
//     election at its revision, and a lease's token is the revision of its
//     grant, so no event may show a lease holding the election at or
//     after the revision of a later lease's grant (that is, two leaders
//     elected without an end between them). Missing events hide nothing
//     here: only events seen are compared;
//   - leader-overlap: no event showing a lease holding the election
//     arrives while an earlier lease (smaller token) of the history is
//     valid by its holder's deadline: its holder still counted itself the
//     leader after a later one had been granted. This catches grants whose
//     reply no client saw;
//   - values: the value an event or a status shows for a lease is one its
//     holder sent (in its campaign or a proclaim).
func checkElections(ops []Op, leases map[string]*lease, rep *Report) {
	values := map[string]map[string]bool{} // lease id -> values sent
	for i := range ops {
		o := &ops[i]
		if o.Value == "" || (o.Kind != KAcquire && o.Kind != KRenew) || o.LeaseID == "" {
			continue
		}
		if values[o.LeaseID] == nil {
			values[o.LeaseID] = map[string]bool{}
		}
		values[o.LeaseID][o.Value] = true
	}
	// Campaigns whose reply was lost name no lease: their request id does.
	campaigns := map[reqKey]map[string]bool{}
	for i := range ops {
		o := &ops[i]
		if o.Kind == KAcquire && o.Value != "" {
			k := reqKey{o.Resource, o.RequestID}
			if campaigns[k] == nil {
				campaigns[k] = map[string]bool{}
			}
			campaigns[k][o.Value] = true
		}
	}
	byToken := map[uint64]*lease{}
	byRes := map[string][]*lease{}
	for _, l := range leases {
		byToken[l.token] = l
		byRes[l.res] = append(byRes[l.res], l)
	}
	sent := func(l *lease, v string) bool {
		return values[l.id][v] || campaigns[reqKey{l.res, l.req}][v]
	}
	held := map[string][]eventFact{}
	ended := map[string]map[uint64]eventFact{} // resource -> token -> earliest end seen
	for i := range ops {
		o := &ops[i]
		if o.Kind == KStatus && o.Result == OK && o.Flag && o.Value != "" {
			if l := byToken[o.Token]; l != nil && l.res == o.Resource && !sent(l, o.Value) {
				rep.add("values", "status shows value %q for lease %s, whose holder never sent it: %v", o.Value, short(l.id), o)
			}
		}
		if o.Kind != KEvent {
			continue
		}
		if o.Result != OK {
			rep.add("events", "malformed event: %v", o)
			continue
		}
		f := eventFact{token: o.Token, rev: o.Revision, op: o}
		switch {
		case o.Token == 0 || o.Revision == 0 || o.Token > o.Revision || o.Event != streams.EventElected && o.Token == o.Revision:
			rep.add("events", "an event whose token and revision cannot be: %v", o)
			continue
		case o.Event == streams.EventElected || o.Event == streams.EventProclaimed:
			held[o.Resource] = append(held[o.Resource], f)
		case o.Event == streams.EventEnded:
			if ended[o.Resource] == nil {
				ended[o.Resource] = map[uint64]eventFact{}
			}
			if e, ok := ended[o.Resource][o.Token]; !ok || f.rev < e.rev {
				ended[o.Resource][o.Token] = f
			}
		default:
			rep.add("events", "an event of unknown kind: %v", o)
			continue
		}
		if l := byToken[o.Token]; l != nil && l.res != o.Resource {
			rep.add("events", "an event of %s shows token %d, granted on %s (%v): %v", o.Resource, o.Token, l.res, l.grant, o)
		} else if l != nil && !sent(l, o.Value) {
			rep.add("values", "an event shows value %q for lease %s, whose holder never sent it: %v", o.Value, short(l.id), o)
		}
	}
	for res, fs := range held {
		// The latest revision at which each token was shown holding.
		latest := map[uint64]eventFact{}
		for _, f := range fs {
			if p, ok := latest[f.token]; !ok || f.rev > p.rev {
				latest[f.token] = f
			}
			if e, ok := ended[res][f.token]; ok && f.rev >= e.rev {
				rep.add("events", "an event shows token %d holding %s at revision %d, after an event showed it ended at %d: %v after %v",
					f.token, res, f.rev, e.rev, f.op, e.op)
			}
		}
		tokens := make([]uint64, 0, len(latest))
		for t := range latest {
			tokens = append(tokens, t)
		}
		slices.Sort(tokens)
		var top eventFact // the fact with the latest revision among smaller tokens
		for _, t := range tokens {
			if top.op != nil && top.rev >= t {
				rep.add("leaders", "two leaders of %s: token %d held it at revision %d, at or after the grant of token %d: %v and %v",
					res, top.token, top.rev, t, top.op, latest[t].op)
			}
			if f := latest[t]; top.op == nil || f.rev > top.rev {
				top = f
			}
		}
		for _, f := range fs {
			for _, l := range byRes[res] {
				if l.token < f.token && l.granted <= f.op.Complete && f.op.Complete < l.end {
					rep.add("leader-overlap", "an event shows token %d holding %s while lease %s (token %d) was still valid by its holder's deadline [%v, %v] (%v): %v",
						f.token, res, short(l.id), l.token, l.granted, l.end, l.endOp, f.op)
				}
			}
		}
	}
}

// checkBucket checks what the bucket's watch saw, in revision order:
//
//   - set-partial: a lock set's lease is on all of its keys or on none
//     whenever a write that is not part of its own commit is seen (a set
//     is granted, renewed, released and ended in one atomic batch each,
//     whose messages are consecutive revisions). Only sets whose every
//     write the watch saw, from their grant on, are judged: a write the
//     watch missed (a gap in the revisions) may be the one that explains
//     what it saw. A set one of whose keys another lease's grant
//     overwrote is not judged either: a grant takes over an expired lease
//     without writing its end first, and the set's other records then
//     stay until its end is written (mutual exclusion, which such a
//     grant breaks if the set had not expired, is checked on the
//     history);
//   - permits: a permit's record is one of its semaphore's permits (its
//     number at most its limit), and every permit of a semaphore carries
//     the same limit.
func checkBucket(log []BucketWrite, rep *Report) {
	type setLease struct {
		id       string
		size     int
		first    uint64 // the revision of its first write seen
		held     int    // how many keys hold it
		since    uint64 // when it became partial
		writes   []string
		reported bool
		taken    bool // one of its keys was overwritten by another lease's grant
	}
	holder := map[string]*setLease{} // key -> the set lease that holds it
	sets := map[string]*setLease{}
	partial := map[*setLease]bool{}
	semLimit := map[string]int{}
	var prev, gapAt uint64
	for i := range log {
		w := &log[i]
		if prev == 0 || w.Rev != prev+1 {
			gapAt = w.Rev
		}
		prev = w.Rev
		for s := range partial {
			own := w.Res != "" && (w.Put && w.LeaseID == s.id || !w.Put && holder[w.Key] == s)
			if own {
				continue
			}
			if gapAt < s.first && !s.reported && !s.taken {
				s.reported = true
				rep.add("set-partial", "the set lease %s (%d resources) held %d of them from revision %d when revision %d wrote %s: %s",
					short(s.id), s.size, s.held, s.since, w.Rev, w, strings.Join(s.writes, "; "))
			}
			delete(partial, s)
		}
		if w.Res == "" {
			continue
		}
		if sem, k, ok := streams.SplitPermit(w.Res); ok && w.Put {
			if k > w.Limit || semLimit[sem] != 0 && semLimit[sem] != w.Limit {
				rep.add("permits", "a record of permit %d of %s with limit %d (others have %d): %v", k, sem, w.Limit, semLimit[sem], w)
			}
			semLimit[sem] = w.Limit
		}
		touched := map[*setLease]bool{}
		if s := holder[w.Key]; s != nil && (!w.Put || w.LeaseID != s.id) {
			delete(holder, w.Key)
			s.held--
			s.taken = s.taken || w.Put
			touched[s] = true
		}
		if w.Put && w.Set != "" {
			s := sets[w.LeaseID]
			if s == nil {
				s = &setLease{id: w.LeaseID, size: w.SetSize, first: w.Rev}
				sets[w.LeaseID] = s
			}
			if holder[w.Key] != s {
				holder[w.Key] = s
				s.held++
			}
			touched[s] = true
		}
		for s := range touched {
			if len(s.writes) < 12 {
				s.writes = append(s.writes, w.String())
			}
			if s.held > 0 && s.held < s.size {
				if !partial[s] {
					s.since = w.Rev
				}
				partial[s] = true
			} else {
				delete(partial, s)
				s.writes = s.writes[:0]
			}
		}
	}
}

// unexplainedLeaseLost returns the acquires of sets, permits and elections
// answered lease_lost that the history does not explain: their request
// was not cancelled before the answer (a cancel sent before it), and was
// not granted before, and, made in a session, the session may not have
// ended by then (no close of it sent before, and its client deadline as
// the request had to find it not passed). The contract keeps lease_lost
// for those; the others are not safety violations, and Run.Check reports
// them. (checkSessions reports an acquire in a session, not retried,
// answered lease_lost before its session may have ended, as a violation.)
func unexplainedLeaseLost(ops []Op) []*Op {
	sessions := sessionsOf(ops)
	cancelled := map[string]time.Duration{} // request id -> earliest cancel sent
	granted := map[string]time.Duration{}   // request id -> earliest grant answered
	for i := range ops {
		o := &ops[i]
		switch {
		case o.Kind == KCancel:
			if t, ok := cancelled[o.RequestID]; !ok || o.Invoke < t {
				cancelled[o.RequestID] = o.Invoke
			}
		case o.Kind == KAcquire && o.Result == OK:
			if t, ok := granted[o.RequestID]; !ok || o.Complete < t {
				granted[o.RequestID] = o.Complete
			}
		}
	}
	var out []*Op
	for i := range ops {
		o := &ops[i]
		if o.Kind != KAcquire || o.Code != "lease_lost" || len(o.Resources) == 0 && o.Limit == 0 && o.Value == "" {
			continue
		}
		if t, ok := cancelled[o.RequestID]; ok && t < o.Complete {
			continue
		}
		if t, ok := granted[o.RequestID]; ok && t < o.Complete {
			continue
		}
		if o.Session != "" && sessions[o.Session].mayHaveEnded(o) {
			continue
		}
		out = append(out, o)
	}
	return out
}
