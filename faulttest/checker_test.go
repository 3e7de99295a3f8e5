package faulttest

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Window is a span of a history during which the cluster had no quorum.
type Window struct{ From, To time.Duration }

// CheckOptions tunes Check.
type CheckOptions struct {
	// NoQuorum lists spans without a quorum: an acquire or renewal invoked
	// and answered within one must not succeed (invariant 5).
	NoQuorum []Window
	// Status checks status replies too, as reads of the lock record, in a
	// second linearizability pass. jetlock does not promise linearizable
	// status (a stream leader cut off from its followers answers reads
	// from its own, possibly stale, state until it steps down), so stale
	// reads are reported as anomalies unless StrictStatus is set.
	Status, StrictStatus bool
	// Timeout bounds the linearizability check; the default is 60s. A
	// check that runs out is reported, not counted as a violation.
	Timeout time.Duration
	// Bucket is what a watch of the lock bucket saw (BucketWatch), for
	// checkBucket; none when nil.
	Bucket []BucketWrite
}

// Violation is one broken invariant.
type Violation struct {
	Kind string
	Msg  string
}

func (v Violation) String() string { return v.Kind + ": " + v.Msg }

// Report is the outcome of Check.
type Report struct {
	Violations []Violation
	// Anomalies are departures from linearizability that the contract
	// does not rule out (stale status reads).
	Anomalies []Violation
	// Counts by kind and result, e.g. "acquire/ok".
	Counts map[string]int
	Leases int
	// Linearizable is porcupine's verdict on the lock record (grants,
	// renewals, releases, cancels) and, after a slash, on the same with
	// status reads: "ok", "illegal" or "unknown (timeout)".
	Linearizable string
}

func (r *Report) add(kind, format string, args ...any) {
	if len(r.Violations) < 200 {
		r.Violations = append(r.Violations, Violation{Kind: kind, Msg: fmt.Sprintf(format, args...)})
	}
}

// Summary is a one-line account of the history.
func (r *Report) Summary() string {
	keys := make([]string, 0, len(r.Counts))
	for k := range r.Counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, r.Counts[k])
	}
	fmt.Fprintf(&b, "leases=%d linearizable=%s violations=%d anomalies=%d", r.Leases, r.Linearizable, len(r.Violations), len(r.Anomalies))
	return b.String()
}

// lease is everything the history says about one lease id.
type lease struct {
	res, id, req string
	session      string // the session it was granted in, if any
	token        uint64
	grant        *Op           // first granting reply
	granted      time.Duration // earliest granting reply
	firstInvoke  time.Duration // earliest acquire of its request id: the grant may be that old
	deadline     time.Duration // latest client deadline of an acknowledged grant or renewal (of its session's open or keepalive)
	deadlineOp   *Op
	end          time.Duration // min(deadline, release or cancel invoked, its session's close invoked)
	endOp        *Op
}

type reqKey struct{ res, req string }

// Check checks a history against jetlock's safety invariants:
//
//   - mutual exclusion: a lease is valid from its granting reply until the
//     client's deadline (send time of the last acknowledged grant or
//     renewal plus its TTL) or until its holder invoked release or cancel,
//     whichever is first; a lease granted in a session, until its
//     session's deadline (send time of the last acknowledged keepalive or
//     open plus the session's TTL), its release or cancel, or its
//     session's close, whichever is first. Two leases of one resource must
//     never be valid at once. An overlap caused by a renewal's or a
//     keepalive's deadline is an acknowledged renewal or keepalive lost;
//   - tokens: distinct leases have distinct tokens, a lease keeps its
//     token, and a grant answered before another grant's request was first
//     sent has the smaller token, on one resource and across resources
//     (tokens are revisions of one stream: a breach across resources means
//     the stream lost an acknowledged write and reused its sequence);
//   - the fenced register accepted tokens in non-decreasing order, and
//     only tokens that were granted;
//   - an acknowledged release or cancel is not undone: no renewal or
//     acquire of that lease or request succeeds when sent afterwards;
//   - sessions (checkSessions): after an acknowledged close, nothing in
//     that session succeeds when sent (a keepalive, an open, an acquire, a
//     close answered closed:true, a release answered released:true); the
//     service answers that a session has ended only after its client
//     deadline, and once a keepalive or open was answered lease_lost,
//     nothing in it succeeds when sent afterwards; an open's request id
//     names one session;
//   - a request id is never granted two leases;
//   - no acquire, renewal, open or keepalive succeeds within a no-quorum
//     window;
//   - per resource, the answers are linearizable with respect to a model
//     of the lock record (porcupine);
//   - lock sets, semaphores and elections (checkPrimitives): each resource
//     of a set and each permit of a semaphore counts as a lease of its own
//     key for every invariant above (see expand), a set or a permit taken
//     in a session as a lease of each of its keys in that session (valid
//     only while the session is, and ended by its end); a set is granted
//     whole, and renewed and released only whole; no more permits of a
//     semaphore are valid at once than it has; the election events never
//     show two leaders at once, nor a leader while an earlier one's lease
//     is valid.
func Check(ops []Op, regLog map[string][]uint64, opt CheckOptions) *Report {
	rep := &Report{Counts: map[string]int{}}
	for i := range ops {
		rep.Counts[ops[i].label()+"/"+ops[i].Result.String()]++
	}
	recorded := ops
	ops = expand(ops)
	firstInvoke := map[reqKey]time.Duration{}
	for i := range ops {
		o := &ops[i]
		if o.Kind == KAcquire {
			k := reqKey{o.Resource, o.RequestID}
			if t, ok := firstInvoke[k]; !ok || o.Invoke < t {
				firstInvoke[k] = o.Invoke
			}
		}
	}

	leases := map[string]*lease{}
	byReq := map[reqKey][]*lease{}
	// Grants first, then what extends them.
	for i := range ops {
		o := &ops[i]
		if o.Kind != KAcquire || o.Result != OK {
			continue
		}
		l := leases[o.LeaseID]
		if l == nil {
			l = &lease{res: o.Resource, id: o.LeaseID, req: o.RequestID, session: o.Session, token: o.Token, grant: o, granted: o.Complete,
				firstInvoke: firstInvoke[reqKey{o.Resource, o.RequestID}]}
			leases[o.LeaseID] = l
			byReq[reqKey{o.Resource, o.RequestID}] = append(byReq[reqKey{o.Resource, o.RequestID}], l)
		}
		switch {
		case l.res != o.Resource || l.req != o.RequestID || l.session != o.Session:
			rep.add("lease-id", "lease %s granted to %s/%s (%v) and to %s/%s (%v)", short(l.id), l.res, l.req, l.grant, o.Resource, o.RequestID, o)
		case l.token != o.Token:
			rep.add("token", "lease %s granted with token %d (%v) and %d (%v)", short(l.id), l.token, l.grant, o.Token, o)
		}
		if o.Complete < l.granted {
			l.granted, l.grant = o.Complete, o
		}
	}
	rep.Leases = len(leases)
	for k, ls := range byReq {
		if len(ls) > 1 {
			rep.add("request-id", "request %s on %s produced %d leases: %v and %v", k.req, k.res, len(ls), ls[0].grant, ls[1].grant)
		}
	}
	for i := range ops {
		o := &ops[i]
		if o.Result != OK || (o.Kind != KAcquire && o.Kind != KRenew && o.Kind != KHeld) {
			continue
		}
		l := leases[o.LeaseID]
		if l == nil {
			rep.add("renewal", "renewal of a lease never granted: %v", o)
			continue
		}
		if o.Kind == KRenew && o.Token != l.token {
			rep.add("token", "renewal of lease %s answered token %d, granted %d: %v", short(l.id), o.Token, l.token, o)
		}
		if o.Note != "" && o.Kind == KRenew {
			rep.add("renewal", "%v", o)
		}
		if l.session != "" {
			continue // valid as long as its session is
		}
		if o.Deadline > l.deadline {
			l.deadline, l.deadlineOp = o.Deadline, o
		}
	}
	sessions := sessionsOf(ops)
	for _, l := range leases {
		if s := sessions[l.session]; l.session != "" && s != nil {
			l.deadline, l.deadlineOp = s.deadline, s.deadlineOp
		}
		l.end, l.endOp = l.deadline, l.deadlineOp
		if s := sessions[l.session]; l.session != "" && s != nil && s.closeOp != nil && s.closeOp.Invoke < l.end {
			l.end, l.endOp = s.closeOp.Invoke, s.closeOp
		}
	}
	for i := range ops {
		o := &ops[i]
		var ends []*lease
		switch o.Kind {
		case KRelease:
			if l := leases[o.LeaseID]; l != nil {
				ends = append(ends, l)
			}
		case KCancel:
			ends = byReq[reqKey{o.Resource, o.RequestID}]
		}
		for _, l := range ends {
			if o.Invoke < l.end {
				l.end, l.endOp = o.Invoke, o
			}
		}
	}

	checkAfterEnd(ops, leases, rep)
	checkSessions(ops, sessions, leases, rep)
	checkLeases(leases, rep)
	checkStreamOrder(leases, rep)
	checkQuorum(ops, opt.NoQuorum, rep)
	checkRegister(regLog, leases, rep)
	checkPrimitives(recorded, leases, opt.Bucket, rep)
	rep.Linearizable = checkLinearizable(ops, leases, false, opt.Timeout, func(res string, n, culprit int) {
		rep.add("linearizability", "no order of the %d operations on %s explains their answers; the first that cannot be explained: %v", n, res, &ops[culprit])
	})
	if opt.Status && rep.Linearizable == "ok" {
		reads := checkLinearizable(ops, leases, true, opt.Timeout, func(res string, n, culprit int) {
			v := Violation{Kind: "stale-read", Msg: fmt.Sprintf("no order of the %d operations on %s, status reads included, explains their answers; the first that cannot be explained: %v", n, res, &ops[culprit])}
			if opt.StrictStatus {
				rep.Violations = append(rep.Violations, v)
			} else {
				rep.Anomalies = append(rep.Anomalies, v)
			}
		})
		rep.Linearizable += "/" + reads
	}
	return rep
}

// checkAfterEnd: after an acknowledged release of a lease, or an
// acknowledged cancel of a request, nothing sent later revives it.
func checkAfterEnd(ops []Op, leases map[string]*lease, rep *Report) {
	released := map[string]*Op{}  // lease id -> first acknowledged release
	cancelled := map[reqKey]*Op{} // request -> first acknowledged cancel
	for i := range ops {
		o := &ops[i]
		if o.Result != OK {
			continue
		}
		switch o.Kind {
		case KRelease:
			if p := released[o.LeaseID]; p == nil || o.Complete < p.Complete {
				released[o.LeaseID] = o
			}
		case KCancel:
			k := reqKey{o.Resource, o.RequestID}
			if p := cancelled[k]; p == nil || o.Complete < p.Complete {
				cancelled[k] = o
			}
		}
	}
	for i := range ops {
		o := &ops[i]
		if o.Result != OK || (o.Kind != KAcquire && o.Kind != KRenew) {
			continue
		}
		if r := released[o.LeaseID]; r != nil && o.Invoke > r.Complete {
			rep.add("release-lost", "lease %s succeeded after its release was answered: %v after %v", short(o.LeaseID), o, r)
		}
		req := o.RequestID
		if l := leases[o.LeaseID]; l != nil {
			req = l.req
		}
		if c := cancelled[reqKey{o.Resource, req}]; c != nil && o.Invoke > c.Complete {
			rep.add("cancel-lost", "request %s succeeded after its cancel was answered: %v after %v", req, o, c)
		}
	}
}

// checkStreamOrder checks tokens across resources. Every token is the
// revision of a write to one stream, whose sequence only grows; so no two
// leases share a token, and a grant answered before another grant was
// first requested has the smaller token, whatever their resources. A
// breach means the stream assigned a sequence twice or went back: an
// acknowledged write was lost. Pairs on one resource are left to
// checkLeases.
func checkStreamOrder(leases map[string]*lease, rep *Report) {
	byGrant := make([]*lease, 0, len(leases))
	byToken := map[uint64]*lease{}
	for _, l := range leases {
		byGrant = append(byGrant, l)
		if o := byToken[l.token]; o != nil && o.res != l.res {
			rep.add("stream-order", "leases %s of %s and %s of %s share token %d: the stream assigned one sequence twice",
				short(o.id), o.res, short(l.id), l.res, l.token)
		}
		byToken[l.token] = l
	}
	byInvoke := append([]*lease(nil), byGrant...)
	sort.Slice(byGrant, func(i, j int) bool { return byGrant[i].granted < byGrant[j].granted })
	sort.Slice(byInvoke, func(i, j int) bool { return byInvoke[i].firstInvoke < byInvoke[j].firstInvoke })
	var top *lease // the largest token granted so far
	next := 0
	for _, b := range byInvoke {
		for ; next < len(byGrant) && byGrant[next].granted < b.firstInvoke; next++ {
			if top == nil || byGrant[next].token > top.token {
				top = byGrant[next]
			}
		}
		if top != nil && top.res != b.res && top.token > b.token {
			rep.add("stream-order", "token went back across resources: %d granted on %s at %v, then %d on %s requested at %v: %v then %v",
				top.token, top.res, top.granted, b.token, b.res, b.firstInvoke, top.grant, b.grant)
		}
	}
}

// checkLeases checks mutual exclusion and token order per resource.
func checkLeases(leases map[string]*lease, rep *Report) {
	byRes := map[string][]*lease{}
	for _, l := range leases {
		byRes[l.res] = append(byRes[l.res], l)
	}
	for _, ls := range byRes {
		sort.Slice(ls, func(i, j int) bool { return ls[i].granted < ls[j].granted })
		for i, a := range ls {
			for _, b := range ls[i+1:] {
				if a.token == b.token {
					rep.add("token", "leases %s and %s of %s share token %d", short(a.id), short(b.id), a.res, a.token)
				}
				if a.granted < b.firstInvoke && a.token > b.token {
					rep.add("token", "token went back on %s: %d granted at %v, then %d requested at %v: %v then %v",
						a.res, a.token, a.granted, b.token, b.firstInvoke, a.grant, b.grant)
				}
				if b.granted < a.end && a.granted < a.end && b.granted < b.end {
					kind := "overlap"
					if a.endOp != nil && a.endOp.Kind == KRenew {
						kind = "renewal-lost"
					}
					if a.endOp != nil && a.endOp.Kind == KKeepalive {
						kind = "keepalive-lost"
					}
					rep.add(kind, "two valid leases of %s: %s valid [%v, %v] (until %v) and %s granted at %v (%v)",
						a.res, short(a.id), a.granted, a.end, a.endOp, short(b.id), b.granted, b.grant)
				}
			}
		}
	}
}

func checkQuorum(ops []Op, windows []Window, rep *Report) {
	for i := range ops {
		o := &ops[i]
		if o.Result != OK || (o.Kind != KAcquire && o.Kind != KRenew && o.Kind != KOpen && o.Kind != KKeepalive) {
			continue
		}
		for _, w := range windows {
			if o.Invoke >= w.From && o.Complete <= w.To {
				rep.add("no-quorum", "%s succeeded without a quorum (window [%v, %v]): %v", o.Kind, w.From, w.To, o)
			}
		}
	}
}

func checkRegister(regLog map[string][]uint64, leases map[string]*lease, rep *Report) {
	granted := map[string]map[uint64]bool{}
	for _, l := range leases {
		if granted[l.res] == nil {
			granted[l.res] = map[uint64]bool{}
		}
		granted[l.res][l.token] = true
	}
	for res, toks := range regLog {
		for i, t := range toks {
			if !granted[res][t] {
				rep.add("fence", "register of %s accepted token %d that no grant handed out", res, t)
			}
			if i > 0 && t < toks[i-1] {
				rep.add("fence", "register of %s accepted token %d after %d", res, t, toks[i-1])
			}
		}
	}
}
