package faulttest

import (
	"testing"

	"github.com/jetlock/jetlock/streams"
)

// Small histories with lock sets, semaphores and elections, each with one
// known flaw (or none, in tricky but legal shapes), and the violation
// kinds Check must report.

// members pairs the sorted resources of a set with their tokens.
func members(res []string, toks ...uint64) []streams.SetMember {
	var out []streams.SetMember
	for i, r := range sortedSet(res) {
		if i < len(toks) {
			out = append(out, streams.SetMember{Resource: r, Token: toks[i]})
		}
	}
	return out
}

func setGrant(req, lease string, res []string, toks []uint64, from, to, ttl int) Op {
	return Op{Kind: KAcquire, Resources: res, RequestID: req, LeaseID: lease, Members: members(res, toks...),
		Invoke: ms(from), Complete: ms(to), TTL: ms(ttl), Result: OK}
}

func setRenew(lease string, res []string, toks []uint64, from, to, ttl int) Op {
	return Op{Kind: KRenew, Resources: res, LeaseID: lease, Members: members(res, toks...),
		Invoke: ms(from), Complete: ms(to), TTL: ms(ttl), Result: OK}
}

func setRelease(lease string, res []string, released bool, from, to int) Op {
	return Op{Kind: KRelease, Resources: res, LeaseID: lease, Flag: released, Invoke: ms(from), Complete: ms(to), Result: OK}
}

func setCancel(req string, res []string, cancelled bool, from, to int) Op {
	return Op{Kind: KCancel, Resources: res, RequestID: req, Flag: cancelled, Invoke: ms(from), Complete: ms(to), Result: OK}
}

const sem = "pool"

func permitGrant(req, lease string, permit int, tok uint64, from, to, ttl int) Op {
	return Op{Kind: KAcquire, Resource: sem, Limit: 3, RequestID: req, LeaseID: lease, Permit: permit, Token: tok,
		Invoke: ms(from), Complete: ms(to), TTL: ms(ttl), Result: OK}
}

func permitRenew(lease string, permit int, tok uint64, from, to, ttl int) Op {
	return Op{Kind: KRenew, Resource: sem, Permit: permit, LeaseID: lease, Token: tok, Invoke: ms(from), Complete: ms(to), TTL: ms(ttl), Result: OK}
}

func permitRelease(lease string, permit int, released bool, from, to int) Op {
	return Op{Kind: KRelease, Resource: sem, Permit: permit, LeaseID: lease, Flag: released, Invoke: ms(from), Complete: ms(to), Result: OK}
}

func permitCancel(req string, cancelled bool, from, to int) Op {
	return Op{Kind: KCancel, Resource: sem, Limit: 3, RequestID: req, Flag: cancelled, Invoke: ms(from), Complete: ms(to), Result: OK}
}

func semStatus(held int, from, to int, permits ...streams.SetMember) Op {
	return Op{Kind: KStatus, Resource: sem, Limit: 3, Flag: held > 0, SetSize: held, Members: permits, Invoke: ms(from), Complete: ms(to), Result: OK}
}

func permit(k int, tok uint64) streams.SetMember {
	return streams.SetMember{Resource: streams.PermitResource(sem, k), Token: tok}
}

const elect = "e"

func campaign(req, lease, value string, tok uint64, from, to, ttl int) Op {
	return Op{Kind: KAcquire, Resource: elect, RequestID: req, LeaseID: lease, Value: value, Token: tok,
		Invoke: ms(from), Complete: ms(to), TTL: ms(ttl), Result: OK}
}

func proclaim(lease, value string, tok uint64, from, to, ttl int) Op {
	return Op{Kind: KRenew, Resource: elect, LeaseID: lease, Value: value, Token: tok, Invoke: ms(from), Complete: ms(to), TTL: ms(ttl), Result: OK}
}

func event(kind string, tok, rev uint64, value string, at int) Op {
	return Op{Client: -2, Kind: KEvent, Resource: elect, Event: kind, Token: tok, Revision: rev, Value: value,
		Invoke: ms(at), Complete: ms(at), Result: OK}
}

func statusOf(res string, held bool, tok uint64, size int, from, to int) Op {
	o := status(held, tok, from, to).on(res)
	o.SetSize = size
	return o
}

// Writes to the bucket, as the watch sees them.
func bput(rev uint64, res, lease string, size int) BucketWrite {
	w := BucketWrite{Rev: rev, Key: streams.LeaseKey(res), Res: res, Put: true, LeaseID: lease, Token: rev}
	if size > 0 {
		w.Set, w.SetSize = "set-"+lease, size
	}
	return w
}

func bdel(rev uint64, res string) BucketWrite {
	return BucketWrite{Rev: rev, Key: streams.LeaseKey(res), Res: res}
}

func bother(rev uint64) BucketWrite { return BucketWrite{Rev: rev, Key: "confirm", Put: true} }

func TestCheckerCatchesPrimitiveViolations(t *testing.T) {
	xy, yx, yz := []string{"x", "y"}, []string{"y", "x"}, []string{"z", "y"}
	cases := []struct {
		name   string
		h      hist
		log    map[string][]uint64
		bucket []BucketWrite
		opt    CheckOptions
		want   []string
	}{
		{name: "legal: set granted, renewed naming it in another order, released; a single grant and an overlapping set follow",
			h: hist{}.add(setGrant("a", "A", yx, []uint64{5, 6}, 0, 10, 1000)).add(setRenew("A", xy, []uint64{5, 6}, 300, 310, 1000)).
				add(statusOf("y", true, 6, 2, 320, 330)).add(setRelease("A", yx, true, 600, 610)).
				add(grant("s", "S", 7, 620, 630, 1000).on("x")).add(statusOf("x", true, 7, 0, 640, 645)).
				add(setGrant("b", "B", yz, []uint64{8, 9}, 650, 660, 1000)),
			log: map[string][]uint64{"x": {5, 5, 7}, "y": {6, 8}, "z": {9}},
			opt: CheckOptions{Status: true, StrictStatus: true}},
		{name: "legal: a waiting set granted after the holder's deadline; a late write refused",
			h: hist{}.add(setGrant("a", "A", xy, []uint64{5, 6}, 0, 10, 1000)).
				add(setGrant("b", "B", xy, []uint64{8, 9}, 500, 1005, 1000)).add(setRelease("A", xy, false, 1100, 1110)),
			log: map[string][]uint64{"x": {5, 8}, "y": {6, 9}}},
		{name: "legal: a set's reply lost, retried: the same lease; cancelled",
			h: hist{}.add(Op{Kind: KAcquire, Resources: xy, RequestID: "a", TTL: ms(1000), Result: Unknown}).
				add(setGrant("a", "A", xy, []uint64{5, 6}, 30, 40, 1000)).add(setGrant("a", "A", yx, []uint64{5, 6}, 50, 60, 1000)).
				add(setCancel("a", yx, true, 100, 110)).add(grant("s", "S", 7, 120, 130, 1000).on("y"))},
		{name: "legal: permits held, one refused, then granted after a release",
			h: hist{}.add(permitGrant("a", "A", 1, 5, 0, 10, 1000)).add(permitGrant("b", "B", 2, 6, 0, 12, 1000)).
				add(permitGrant("c", "C", 3, 7, 0, 14, 1000)).
				add(Op{Kind: KAcquire, Resource: sem, Limit: 3, RequestID: "d", Invoke: ms(20), Complete: ms(30), Result: Fail, Code: "locked"}).
				add(semStatus(3, 40, 50, permit(1, 5), permit(2, 6), permit(3, 7))).
				add(permitRelease("B", 2, true, 100, 110)).add(permitGrant("d", "D", 2, 9, 120, 130, 1000)).
				add(permitRenew("D", 2, 9, 300, 310, 1000)).add(permitCancel("a", true, 400, 410)),
			log: map[string][]uint64{"pool#1": {5}, "pool#2": {6, 9, 9}, "pool#3": {7}}},
		{name: "legal: election events repeated, missing, and with the revision of a later write",
			h: hist{}.add(campaign("a", "A", "va", 5, 0, 10, 1000)).add(event("elected", 5, 5, "va", 11)).add(event("elected", 5, 5, "va", 12)).
				add(proclaim("A", "va2", 5, 300, 310, 1000)).add(event("proclaimed", 5, 9, "va2", 311)).
				add(release("A", true, 600, 610, OK).on(elect)).
				add(campaign("b", "B", "vb", 12, 100, 612, 1000)).
				add(event("ended", 5, 12, "va2", 613)).add(event("elected", 12, 12, "vb", 613)).
				add(event("ended", 5, 15, "va2", 640)).add(event("elected", 12, 15, "vb", 640)).
				add(statusOf(elect, true, 12, 0, 650, 660).withValue("vb"))},
		{name: "legal: bucket: a set granted, renewed and released in one commit each; partial views across gaps",
			bucket: []BucketWrite{bother(10), bput(11, "x", "A", 2), bput(12, "y", "A", 2), bother(13),
				bput(14, "x", "A", 2), bput(15, "y", "A", 2), bdel(16, "x"), bdel(17, "y"), bother(18),
				// B's grant at 20-21: 20 was missed.
				bput(21, "y", "B", 2), bother(22),
				// C held on x and y; its release at 30-31 was missed, x then written again.
				bput(23, "x", "C", 2), bput(24, "y", "C", 2), bother(25), bput(32, "x", "D", 0), bother(33)}},
		{name: "legal: bucket: an expired set's resource taken over before its end is written",
			bucket: []BucketWrite{bother(10), bput(11, "x", "A", 2), bput(12, "y", "A", 2), bother(13),
				bput(14, "y", "B", 0), bother(15), bdel(16, "x"), bother(17)}},
		{name: "set grant whose reply lacks a resource",
			h:    hist{}.add(setGrant("a", "A", xy, []uint64{5}, 0, 10, 1000)),
			want: []string{"set-grant", "linearizability"}},
		{name: "set grant whose reply gives two resources one token",
			h:    hist{}.add(setGrant("a", "A", xy, []uint64{5, 5}, 0, 10, 1000)),
			want: []string{"set-grant", "stream-order"}},
		{name: "a resource of a valid set granted to another",
			h:    hist{}.add(setGrant("a", "A", xy, []uint64{5, 6}, 0, 10, 3000)).add(grant("s", "S", 7, 500, 510, 1000).on("y")),
			want: []string{"overlap", "linearizability"}},
		{name: "two sets sharing a resource granted at once",
			h:    hist{}.add(setGrant("a", "A", xy, []uint64{5, 6}, 0, 10, 3000)).add(setGrant("b", "B", yz, []uint64{7, 8}, 500, 510, 1000)),
			want: []string{"overlap", "linearizability"}},
		{name: "one resource of a set renewed alone",
			h:    hist{}.add(setGrant("a", "A", xy, []uint64{5, 6}, 0, 10, 1000)).add(renew("A", 5, 300, 310, 1000).on("x")),
			want: []string{"set-member", "renewal", "linearizability"}},
		{name: "one resource of a set released alone",
			h:    hist{}.add(setGrant("a", "A", xy, []uint64{5, 6}, 0, 10, 1000)).add(release("A", true, 300, 310, OK).on("x")),
			want: []string{"set-member", "linearizability"}},
		{name: "set renewal answered with another token",
			h:    hist{}.add(setGrant("a", "A", xy, []uint64{5, 6}, 0, 10, 1000)).add(setRenew("A", xy, []uint64{5, 9}, 300, 310, 1000)),
			want: []string{"token", "linearizability"}},
		{name: "status shows a resource of a set with another set_size",
			h:    hist{}.add(setGrant("a", "A", xy, []uint64{5, 6}, 0, 10, 1000)).add(statusOf("x", true, 5, 1, 20, 30)),
			want: []string{"set-partial"}},
		{name: "set cancel answered false while the set was held",
			h:    hist{}.add(setGrant("a", "A", xy, []uint64{5, 6}, 0, 10, 10000)).add(setCancel("a", xy, false, 100, 110)),
			want: []string{"linearizability"}},
		{name: "register accepted a smaller token on a resource of a set",
			h:    hist{}.add(setGrant("a", "A", xy, []uint64{5, 6}, 0, 10, 100)).add(setRelease("A", xy, true, 20, 25)).add(setGrant("b", "B", xy, []uint64{8, 9}, 30, 40, 100)),
			log:  map[string][]uint64{"x": {5, 8}, "y": {6, 9, 6}},
			want: []string{"fence"}},
		{name: "bucket: a set granted in two commits, another write between",
			bucket: []BucketWrite{bother(10), bput(11, "x", "A", 2), bother(12), bput(13, "y", "A", 2), bother(14)},
			want:   []string{"set-partial"}},
		{name: "bucket: a set granted on one resource of its two",
			bucket: []BucketWrite{bother(10), bput(11, "x", "A", 2), bother(12)},
			want:   []string{"set-partial"}},
		{name: "bucket: a set ended on one resource only",
			bucket: []BucketWrite{bother(10), bput(11, "x", "A", 2), bput(12, "y", "A", 2), bother(13), bdel(14, "x"), bput(15, "x", "B", 0)},
			want:   []string{"set-partial"}},
		{name: "bucket: a permit beyond its semaphore's limit",
			bucket: []BucketWrite{bother(10), {Rev: 11, Key: streams.LeaseKey("pool#4"), Res: "pool#4", Put: true, LeaseID: "A", Limit: 3}},
			want:   []string{"permits"}},
		{name: "legal: a name a semaphore, then, once its permit is released, a lock, then a semaphore again after the lock expired",
			h: hist{}.add(permitGrant("a", "A", 1, 5, 0, 10, 1000)).add(permitRelease("A", 1, true, 100, 110)).
				add(grant("b", "B", 7, 105, 120, 1000).on(sem)).add(permitGrant("c", "C", 2, 9, 1100, 1110, 1000)),
			log: map[string][]uint64{"pool#1": {5}, sem: {7}, "pool#2": {9}}},
		{name: "a name held as a lock while a permit of it is valid",
			h:    hist{}.add(permitGrant("a", "A", 1, 5, 0, 10, 1000)).add(grant("b", "B", 7, 100, 120, 1000).on(sem)),
			want: []string{"kind-overlap"}},
		{name: "four valid permits of a semaphore of three",
			h: hist{}.add(permitGrant("a", "A", 1, 5, 0, 10, 1000)).add(permitGrant("b", "B", 2, 6, 0, 12, 1000)).
				add(permitGrant("c", "C", 3, 7, 0, 14, 1000)).add(permitGrant("d", "D", 4, 8, 0, 16, 1000)),
			want: []string{"permits"}},
		{name: "one permit granted twice at once",
			h:    hist{}.add(permitGrant("a", "A", 1, 5, 0, 10, 1000)).add(permitGrant("b", "B", 1, 6, 100, 110, 1000)),
			want: []string{"overlap", "linearizability"}},
		{name: "cancel of a permit's acquire answered false while it held the permit",
			h:    hist{}.add(permitGrant("a", "A", 2, 5, 0, 10, 10000)).add(permitCancel("a", false, 100, 110)),
			want: []string{"linearizability"}},
		{name: "a permit renewed after the cancel of its request was answered",
			h:    hist{}.add(permitGrant("a", "A", 2, 5, 0, 10, 10000)).add(permitCancel("a", true, 100, 110)).add(permitRenew("A", 2, 5, 200, 210, 1000)),
			want: []string{"cancel-lost", "linearizability"}},
		{name: "one request granted two permits",
			h:    hist{}.add(permitGrant("a", "A", 1, 5, 0, 10, 100)).add(permitRelease("A", 1, true, 20, 30)).add(permitGrant("a", "B", 2, 7, 40, 50, 100)),
			want: []string{"request-id"}},
		{name: "register accepted a smaller token on a permit",
			h:    hist{}.add(permitGrant("a", "A", 1, 5, 0, 10, 100)).add(permitRelease("A", 1, true, 20, 30)).add(permitGrant("b", "B", 1, 7, 40, 50, 100)),
			log:  map[string][]uint64{"pool#1": {7, 5}},
			want: []string{"fence"}},
		{name: "semaphore status lists more permits than the limit",
			h:    hist{}.add(semStatus(4, 0, 10, permit(1, 5), permit(2, 6), permit(3, 7), permit(4, 8))),
			want: []string{"permits"}},
		{name: "semaphore status shows a permit with another permit's token",
			h:    hist{}.add(permitGrant("a", "A", 1, 5, 0, 10, 1000)).add(semStatus(1, 20, 30, permit(2, 5))),
			want: []string{"permits"}},
		{name: "a permit's renewal answered for another permit",
			h: hist{}.add(permitGrant("a", "A", 1, 5, 0, 10, 1000)).
				add(func() Op {
					o := permitRenew("A", 1, 5, 300, 310, 1000)
					o.Note = "renewal answered with permit 2"
					return o
				}()),
			want: []string{"permits", "renewal"}},
		{name: "events: the old leader proclaimed after the next was elected",
			h:    hist{}.add(event("elected", 5, 5, "va", 10)).add(event("elected", 8, 8, "vb", 20)).add(event("proclaimed", 5, 9, "va2", 30)),
			want: []string{"leaders"}},
		{name: "events: the next leader elected while the old one's grant is shown later",
			h:    hist{}.add(event("elected", 8, 8, "vb", 20)).add(event("elected", 5, 8, "va", 30)),
			want: []string{"leaders"}},
		{name: "an event shows a new leader while the old leader's lease is valid",
			h:    hist{}.add(campaign("a", "A", "va", 5, 0, 10, 1000)).add(event("elected", 8, 8, "vb", 500)),
			want: []string{"leader-overlap"}},
		{name: "an event shows a value its lease's holder never sent",
			h:    hist{}.add(campaign("a", "A", "va", 5, 0, 10, 1000)).add(event("elected", 5, 5, "vx", 20)),
			want: []string{"values"}},
		{name: "status shows a value its lease's holder never sent",
			h:    hist{}.add(campaign("a", "A", "va", 5, 0, 10, 1000)).add(statusOf(elect, true, 5, 0, 20, 30).withValue("vx")),
			want: []string{"values"}},
		{name: "events: a lease shown holding after it was shown ended",
			h:    hist{}.add(event("elected", 5, 5, "va", 10)).add(event("ended", 5, 7, "va", 20)).add(event("proclaimed", 5, 9, "va2", 30)),
			want: []string{"events"}},
		{name: "events: a token above its revision",
			h:    hist{}.add(event("elected", 9, 5, "va", 10)),
			want: []string{"events"}},
		{name: "events: a token of another resource's lease",
			h:    hist{}.add(grant("s", "S", 5, 0, 10, 100).on("x")).add(event("elected", 5, 5, "va", 20)),
			want: []string{"events"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opt := tc.opt
			opt.Bucket = tc.bucket
			rep := Check(tc.h, tc.log, opt)
			var got []string
			for _, v := range rep.Violations {
				got = append(got, v.Kind)
			}
			t.Logf("violations %q", got)
			if !sameKinds(got, tc.want) || len(rep.Anomalies) != 0 {
				t.Errorf("violations %q, anomalies %v; want %q\n%v", got, rep.Anomalies, tc.want, rep.Violations)
			}
		})
	}
}

func (o Op) withValue(v string) Op {
	o.Value = v
	return o
}

// An acquire of a set or a permit in a session answered lease_lost is
// explained by its session's end (a close sent before the answer, or the
// session's deadline passed); one answered so while its session was
// current, a retry that checkSessions leaves alone, is not.
func TestCheckerExplainsLeaseLostInSessions(t *testing.T) {
	xy := []string{"x", "y"}
	lost := func(o Op, from, to int, retry bool) Op {
		o.Kind, o.Session, o.Invoke, o.Complete, o.Retry = KAcquire, sessA, ms(from), ms(to), retry
		return o.withFail("lease_lost")
	}
	h := hist{}.add(openOp("s", sessA, 0, 10, 1000)).
		add(lost(Op{Resources: xy, RequestID: "a"}, 100, 200, true)).
		add(lost(Op{Resource: sem, Limit: 3, RequestID: "b"}, 1100, 1110, false)).
		add(closeOp(sessA, true, 300, 310, OK)).
		add(lost(Op{Resources: xy, RequestID: "c"}, 290, 320, false))
	got := unexplainedLeaseLost(h)
	if len(got) != 1 || got[0].RequestID != "a" {
		t.Errorf("unexplained: %v; want the retried set acquire a alone", got)
	}
}
