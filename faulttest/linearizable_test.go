package faulttest

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The lock record of one resource as a nondeterministic sequential model
// for porcupine. Expiry is not an operation anybody invokes: the model
// lets a lease disappear at any step whose reply came at or after the
// lease's client deadline (the service never expires a lease before its
// holder's deadline, which it counts from a later moment). Operations
// whose outcome is unknown either took effect, at any moment after they
// were sent, or never did: an unknown release or cancel is kept with an
// open end, and so is an unknown acquire whose request id was later
// answered with a lease (it may be the write that granted that lease). Any
// other unknown acquire or renewal can only make later answers harder to
// explain, never easier, so leaving it out cannot hide a violation.
//
// A lease granted in a session has its session's client deadline (see
// sessionsOf), and a close of the session is an operation on every
// resource the session was granted a lease of: it ends the session's lease
// there, if that is the current one.

type lockState struct {
	lease, req string
	session    string // the session the current lease was granted in
	token      uint64
	deadline   int64  // client deadline of the current lease
	max        uint64 // highest token granted so far
}

func (s lockState) free() lockState { return lockState{max: s.max} }

type lockInput struct {
	kind     Kind
	lease    string // renew, release: the lease named; status: the lease that had the token read, if known
	req      string
	session  string // acquire: the session it was made in; close: the session closed
	at       int64  // reply time: by then the operation took effect
	deadline int64  // of a granted acquire or renewal
	unknown  bool
}

type lockOutput struct {
	result Result
	code   string
	lease  string
	token  uint64
	flag   bool
}

func lockStep(state, input, output any) []any {
	s, in, out := state.(lockState), input.(lockInput), output.(lockOutput)
	held := s.lease != ""
	// The current lease may have expired by this operation's reply.
	mayExpire := held && s.deadline <= in.at
	one := func(n lockState) []any { return []any{n} }
	switch in.kind {
	case KAcquire:
		if in.unknown {
			// Either it never took effect, or it is the grant (or an
			// extension) of the lease its request id was answered with.
			known := in
			known.unknown = false
			return append(lockStep(s, known, out), s)
		}
		if out.result != OK {
			return one(s)
		}
		if held && s.lease == out.lease {
			if out.token != s.token {
				return nil
			}
			s.deadline = max(s.deadline, in.deadline)
			return one(s)
		}
		if held && !mayExpire || out.token <= s.max {
			return nil
		}
		return one(lockState{lease: out.lease, req: in.req, session: in.session, token: out.token, deadline: in.deadline, max: out.token})
	case KRenew:
		switch {
		case out.result == OK:
			if s.lease != in.lease || out.token != s.token {
				return nil
			}
			s.deadline = max(s.deadline, in.deadline)
			return one(s)
		case out.code != "lease_lost" || s.lease != in.lease:
			return one(s)
		case mayExpire:
			return one(s.free())
		}
		return nil
	case KRelease:
		switch {
		case in.unknown:
			if s.lease == in.lease {
				return []any{s, s.free()}
			}
			return one(s)
		case out.result != OK:
			return one(s)
		case out.flag:
			if s.lease != in.lease {
				return nil
			}
			return one(s.free())
		case s.lease != in.lease:
			return one(s)
		case mayExpire:
			return one(s.free())
		}
		return nil
	case KCancel:
		switch {
		case in.unknown:
			if held && s.req == in.req {
				return []any{s, s.free()}
			}
			return one(s)
		case out.result != OK:
			return one(s)
		case held && s.req == in.req && out.flag:
			return one(s.free())
		case held && s.req == in.req:
			if mayExpire {
				return one(s.free())
			}
			return nil
		}
		return one(s) // a waiter dequeued, or nothing to cancel
	case KClose:
		mine := held && s.session != "" && s.session == in.session
		switch {
		case !mine:
			return one(s)
		case in.unknown:
			return []any{s, s.free()}
		case out.result != OK:
			return one(s)
		case out.flag, mayExpire:
			// closed:true ends the session's lease here; closed:false
			// says the session had ended, which it may only have done
			// once its deadline passed.
			return one(s.free())
		}
		return nil
	case KStatus:
		switch {
		case out.result != OK:
			return one(s)
		case out.flag && in.lease != "":
			if s.lease == in.lease {
				return one(s)
			}
			return nil
		case out.flag:
			return one(s) // a token no recorded grant carried: an unknown grant
		case !held:
			return one(s)
		case mayExpire:
			return one(s.free())
		}
		return nil
	}
	return one(s)
}

// maxEffectDelay bounds how long after it was sent an operation whose
// outcome is unknown may still take effect. The faults injected here last
// seconds (a paused client or instance up to 6s, a partition up to 8s, a
// whole-cluster restart about as long), so 30s is generous; without a
// bound, every unknown operation stays pending to the end of the history
// and the search for an order grows without limit.
const maxEffectDelay = 30 * time.Second

// checkLinearizable runs porcupine per resource (with status reads when
// status is set) and calls illegal for each resource whose answers no
// order of the operations explains.
func checkLinearizable(ops []Op, leases map[string]*lease, status bool, timeout time.Duration, illegal func(res string, n, culprit int)) string {
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	tokenLease := map[string]map[uint64]string{}
	firstLease := map[reqKey]*lease{}
	sessionRes := map[string]map[string]bool{} // session -> resources it was granted leases of
	for _, l := range leases {
		if l.session != "" {
			if sessionRes[l.session] == nil {
				sessionRes[l.session] = map[string]bool{}
			}
			sessionRes[l.session][l.res] = true
		}
		if f := firstLease[reqKey{l.res, l.req}]; f == nil || l.granted < f.granted {
			firstLease[reqKey{l.res, l.req}] = l
		}
		if tokenLease[l.res] == nil {
			tokenLease[l.res] = map[uint64]string{}
		}
		tokenLease[l.res][l.token] = l.id
	}
	byRes := map[string][]porcupine.Operation{}
	for i := range ops {
		o := &ops[i]
		in := lockInput{kind: o.Kind, lease: o.LeaseID, req: o.RequestID, session: o.Session, at: int64(o.Complete), deadline: int64(o.Deadline)}
		out := lockOutput{result: o.Result, code: o.Code, lease: o.LeaseID, token: o.Token, flag: o.Flag}
		ret := int64(o.Complete)
		switch o.Kind {
		case KAcquire:
			if o.Result == OK && o.Session != "" {
				if l := leases[o.LeaseID]; l != nil {
					in.deadline = int64(l.deadline) // its session's
				}
			}
			if o.Result != Unknown {
				break
			}
			l := firstLease[reqKey{o.Resource, o.RequestID}]
			if l == nil {
				continue
			}
			in.unknown, in.at, in.deadline, ret = true, int64(l.granted), int64(o.Invoke+o.TTL), int64(o.Invoke+maxEffectDelay)
			if o.Session != "" {
				in.deadline = int64(l.deadline)
			}
			out = lockOutput{result: OK, lease: l.id, token: l.token}
		case KClose:
			if o.Result == Unknown {
				in.unknown, in.at, ret = true, math.MaxInt64, int64(o.Invoke+maxEffectDelay)
			}
			for res := range sessionRes[o.Session] {
				byRes[res] = append(byRes[res], porcupine.Operation{
					ClientId: o.Client, Input: in, Output: out, Call: int64(o.Invoke), Return: ret, Metadata: i,
				})
			}
			continue
		case KRenew:
			if o.Result == Unknown {
				continue
			}
		case KRelease, KCancel:
			if o.Result == Unknown {
				in.unknown, in.at, ret = true, math.MaxInt64, int64(o.Invoke+maxEffectDelay)
			}
		case KStatus:
			if !status || o.Result == Unknown {
				continue
			}
			in.lease = tokenLease[o.Resource][o.Token]
		default:
			continue
		}
		byRes[o.Resource] = append(byRes[o.Resource], porcupine.Operation{
			ClientId: o.Client, Input: in, Output: out, Call: int64(o.Invoke), Return: ret, Metadata: i,
		})
	}
	model := (&porcupine.NondeterministicModel{
		Init: func() []any { return []any{lockState{}} },
		Step: lockStep,
		DescribeOperation: func(input, output any) string {
			in, out := input.(lockInput), output.(lockOutput)
			return fmt.Sprintf("%s lease=%s req=%s session=%s -> %s %s lease=%s token=%d flag=%v", in.kind, short(in.lease), in.req, short(in.session), out.result, out.code, short(out.lease), out.token, out.flag)
		},
	}).ToModel()
	res := make([]string, 0, len(byRes))
	for r := range byRes {
		res = append(res, r)
	}
	sort.Strings(res)
	verdict := "ok"
	// Each resource gets an equal share of what is left, so that one hard
	// history cannot starve the others.
	deadline := time.Now().Add(timeout)
	for i, r := range res {
		left := time.Until(deadline)
		if left <= 0 {
			return "unknown (timeout)"
		}
		switch porcupine.CheckOperationsTimeout(model, byRes[r], left/time.Duration(len(res)-i)) {
		case porcupine.Illegal:
			verdict = "illegal"
			illegal(r, len(byRes[r]), firstUnexplained(model, byRes[r]))
		case porcupine.Unknown:
			if verdict == "ok" {
				verdict = "unknown (timeout on " + r + ")"
			}
		}
	}
	return verdict
}

// firstUnexplained returns the index (in the operations checked) of the
// operation that ends the shortest prefix (by invocation) of an illegal
// history that is already illegal, found by bisection: usually the answer
// to look at first.
func firstUnexplained(model porcupine.Model, ops []porcupine.Operation) int {
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	lo, hi := 1, len(sorted) // prefix hi is illegal
	for lo < hi {
		mid := (lo + hi) / 2
		if porcupine.CheckOperationsTimeout(model, sorted[:mid], 10*time.Second) == porcupine.Illegal {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return sorted[hi-1].Metadata.(int)
}
