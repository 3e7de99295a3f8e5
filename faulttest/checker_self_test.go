package faulttest

import (
	"strings"
	"testing"
	"time"
)

// The checker is only worth what it catches: each case is a small history
// with one known flaw (or none, in tricky but legal shapes), and the
// violation kinds Check must report for it.

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// hist builds a history from short op descriptions; times in ms.
type hist []Op

func (h hist) add(o Op) hist {
	o.ID = len(h)
	defaultDeadline(&o)
	return append(h, o)
}

func grant(req, lease string, tok uint64, from, to, ttl int) Op {
	return Op{Kind: KAcquire, Resource: "r", RequestID: req, LeaseID: lease, Token: tok,
		Invoke: ms(from), Complete: ms(to), TTL: ms(ttl), Result: OK}
}

func renew(lease string, tok uint64, from, to, ttl int) Op {
	return Op{Kind: KRenew, Resource: "r", LeaseID: lease, Token: tok, Invoke: ms(from), Complete: ms(to), TTL: ms(ttl), Result: OK}
}

func release(lease string, released bool, from, to int, r Result) Op {
	return Op{Kind: KRelease, Resource: "r", LeaseID: lease, Flag: released, Invoke: ms(from), Complete: ms(to), Result: r}
}

func cancelOp(req string, cancelled bool, from, to int, r Result) Op {
	return Op{Kind: KCancel, Resource: "r", RequestID: req, Flag: cancelled, Invoke: ms(from), Complete: ms(to), Result: r}
}

func status(held bool, tok uint64, from, to int) Op {
	return Op{Kind: KStatus, Resource: "r", Flag: held, Token: tok, Invoke: ms(from), Complete: ms(to), Result: OK}
}

func TestCheckerCatchesViolations(t *testing.T) {
	unknownAcquire := Op{Kind: KAcquire, Resource: "r", RequestID: "a", TTL: ms(1000), Result: Unknown}
	cases := []struct {
		name  string
		h     hist
		log   []uint64
		opt   CheckOptions
		want  []string // violation kinds, in any order; none for a legal history
		anoms int
	}{
		{name: "legal: grant, renew, release, next grant",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 1000)).add(renew("A", 5, 300, 310, 1000)).
				add(release("A", true, 600, 610, OK)).add(grant("b", "B", 7, 620, 630, 1000)),
			log: []uint64{5, 5, 7}},
		{name: "legal: takeover after the holder's deadline",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 1000)).add(grant("b", "B", 7, 900, 1005, 1000)).
				add(release("A", false, 1100, 1110, OK)).add(renew("A", 0, 1200, 1210, 1000).withFail("lease_lost"))},
		{name: "legal: lost reply, status, retry returns the same lease",
			h: hist{}.add(unknownAcquire).add(status(true, 5, 20, 25)).add(grant("a", "A", 5, 30, 35, 1000)).
				add(grant("a", "A", 5, 40, 45, 1000)),
			opt: CheckOptions{Status: true, StrictStatus: true}},
		{name: "legal: unknown release, then another grant",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 3000)).add(release("A", false, 500, 2500, Unknown)).
				add(grant("b", "B", 7, 1000, 1010, 1000))},
		{name: "legal: waiter dequeued by cancel while another holds",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 3000)).add(cancelOp("w", true, 100, 110, OK)).add(renew("A", 5, 200, 210, 3000))},
		{name: "two valid leases",
			h:    hist{}.add(grant("a", "A", 5, 0, 10, 3000)).add(grant("b", "B", 7, 1000, 1010, 1000)),
			want: []string{"overlap", "linearizability"}},
		{name: "acknowledged renewal lost",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 1000)).add(renew("A", 5, 800, 810, 1000)).
				add(grant("b", "B", 7, 1500, 1510, 1000)),
			want: []string{"renewal-lost", "linearizability"}},
		{name: "token went back",
			h: hist{}.add(grant("a", "A", 10, 0, 10, 100)).add(release("A", true, 20, 25, OK)).
				add(grant("b", "B", 7, 100, 110, 100)),
			want: []string{"token", "linearizability"}},
		{name: "token shared by two leases",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 100)).add(release("A", true, 20, 25, OK)).
				add(grant("b", "B", 5, 100, 110, 100)),
			want: []string{"token", "linearizability"}},
		{name: "legal: tokens rise across resources",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 100)).add(grant("b", "B", 7, 20, 30, 100).on("s")).
				add(grant("c", "C", 6, 5, 40, 100).on("t"))},
		{name: "token shared across resources",
			h:    hist{}.add(grant("a", "A", 5, 0, 10, 100)).add(grant("b", "B", 5, 20, 30, 100).on("s")),
			want: []string{"stream-order"}},
		{name: "token went back across resources",
			h:    hist{}.add(grant("a", "A", 9, 0, 10, 100)).add(grant("b", "B", 7, 20, 30, 100).on("s")),
			want: []string{"stream-order"}},
		{name: "one request id, two leases",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 100)).add(release("A", true, 20, 25, OK)).
				add(grant("a", "B", 7, 100, 110, 100)),
			want: []string{"request-id"}},
		{name: "renewal after an acknowledged release",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 1000)).add(release("A", true, 20, 25, OK)).
				add(renew("A", 5, 30, 35, 1000)),
			want: []string{"release-lost", "linearizability"}},
		{name: "grant after an acknowledged cancel",
			h:    hist{}.add(cancelOp("a", false, 0, 5, OK)).add(grant("a", "A", 5, 10, 20, 1000)),
			want: []string{"cancel-lost"}},
		{name: "release answered false while the lease was current",
			h:    hist{}.add(grant("a", "A", 5, 0, 10, 10000)).add(release("A", false, 100, 110, OK)),
			want: []string{"linearizability"}},
		{name: "register accepted a smaller token and an unknown one",
			h:    hist{}.add(grant("a", "A", 5, 0, 10, 100)).add(release("A", true, 20, 25, OK)).add(grant("b", "B", 7, 100, 110, 100)),
			log:  []uint64{5, 7, 5, 99},
			want: []string{"fence", "fence"}},
		{name: "grant without quorum",
			h:    hist{}.add(grant("a", "A", 5, 1000, 1100, 100)),
			opt:  CheckOptions{NoQuorum: []Window{{From: ms(900), To: ms(2000)}}},
			want: []string{"no-quorum"}},
		{name: "stale status read is an anomaly",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 10000)).add(release("A", true, 20, 25, OK)).
				add(status(true, 5, 30, 35)),
			opt: CheckOptions{Status: true}, anoms: 1},
		{name: "stale status read, strict",
			h: hist{}.add(grant("a", "A", 5, 0, 10, 10000)).add(release("A", true, 20, 25, OK)).
				add(status(true, 5, 30, 35)),
			opt: CheckOptions{Status: true, StrictStatus: true}, want: []string{"stale-read"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep := Check(tc.h, map[string][]uint64{"r": tc.log}, tc.opt)
			var got []string
			for _, v := range rep.Violations {
				got = append(got, v.Kind)
			}
			if !sameKinds(got, tc.want) || len(rep.Anomalies) != tc.anoms {
				t.Errorf("violations %q, anomalies %d; want %q, %d\n%v", got, len(rep.Anomalies), tc.want, tc.anoms, rep.Violations)
			}
		})
	}
}

// on moves an operation to resource res.
func (o Op) on(res string) Op {
	o.Resource = res
	return o
}

func (o Op) withFail(code string) Op {
	o.Result, o.Code = Fail, code
	return o
}

// sameKinds compares two lists of kinds as sets (a kind found several
// times counts once).
func sameKinds(got, want []string) bool {
	set := func(l []string) string {
		m := map[string]bool{}
		for _, k := range l {
			m[k] = true
		}
		var out []string
		for _, k := range []string{"overlap", "renewal-lost", "token", "request-id", "release-lost", "cancel-lost",
			"linearizability", "fence", "no-quorum", "stale-read", "lease-id", "renewal",
			"keepalive-lost", "close-lost", "session-closed", "session-lost", "session-id",
			"stream-order", "set-grant", "set-member", "set-partial", "permits", "events", "leaders", "leader-overlap", "values"} {
			if m[k] {
				out = append(out, k)
			}
		}
		return strings.Join(out, ",")
	}
	return set(got) == set(want)
}
