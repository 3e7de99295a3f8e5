package faulttest

import "testing"

// Small histories with sessions, each with one known flaw (or none, in
// tricky but legal shapes), and the violation kinds Check must report.

const sessA = "5e55a" // a session id, as the checker sees it: any string

func openOp(req, session string, from, to, ttl int) Op {
	return Op{Kind: KOpen, RequestID: req, Session: session, Invoke: ms(from), Complete: ms(to), TTL: ms(ttl), Result: OK}
}

func keepaliveOp(session string, from, to, ttl int) Op {
	return Op{Kind: KKeepalive, Session: session, Invoke: ms(from), Complete: ms(to), TTL: ms(ttl), Result: OK}
}

func closeOp(session string, closed bool, from, to int, r Result) Op {
	return Op{Kind: KClose, Session: session, Flag: closed, Invoke: ms(from), Complete: ms(to), Result: r}
}

// grantIn is a grant in session; its lease has no deadline of its own.
func grantIn(session, req, lease string, tok uint64, from, to int) Op {
	o := grant(req, lease, tok, from, to, 1000)
	o.Session = session
	return o
}

func TestCheckerCatchesSessionViolations(t *testing.T) {
	cases := []struct {
		name  string
		h     hist
		log   []uint64
		opt   CheckOptions
		want  []string
		anoms int
	}{
		{name: "legal: open, acquire, keepalives, close, next grant",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "a", "A", 5, 20, 30)).
				add(keepaliveOp(sessA, 300, 310, 1000)).add(keepaliveOp(sessA, 600, 610, 1000)).
				add(closeOp(sessA, true, 900, 910, OK)).add(status(false, 0, 950, 960)).
				add(grant("b", "B", 7, 970, 980, 1000)),
			log: []uint64{5, 5, 7}, opt: CheckOptions{Status: true, StrictStatus: true}},
		{name: "legal: session no longer kept alive, taken over after its deadline",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "a", "A", 5, 20, 30)).
				add(keepaliveOp(sessA, 300, 310, 1000)).add(grant("b", "B", 7, 1250, 1310, 1000)).
				add(keepaliveOp(sessA, 1400, 1410, 0).withFail("lease_lost")).
				add(closeOp(sessA, false, 1500, 1510, OK)).add(release("A", false, 1600, 1610, OK))},
		{name: "legal: close sent while an acquire in the session is in flight",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "a", "A", 5, 20, 200)).
				add(closeOp(sessA, true, 100, 150, OK)).add(grant("b", "B", 7, 160, 170, 1000)),
		},
		{name: "legal: unknown close, then closed:false, then another grant",
			h: hist{}.add(openOp("s", sessA, 0, 10, 10000)).add(grantIn(sessA, "a", "A", 5, 20, 30)).
				add(closeOp(sessA, false, 100, 2600, Unknown)).add(closeOp(sessA, false, 2700, 2710, OK)).
				add(grant("b", "B", 7, 2800, 2810, 1000))},
		{name: "legal: a waiting acquire in the session cancelled, answered lease_lost",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "w", "", 0, 100, 500).withFail("lease_lost")).
				add(cancelOp("w", true, 200, 210, OK))},
		{name: "legal: an acquire answered lease_lost after the deadline, then a late keepalive finds the session",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "a", "", 0, 1100, 1110).withFail("lease_lost")).
				add(keepaliveOp(sessA, 1120, 1130, 1000))},
		{name: "grant to another while the session's deadline has not passed",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "a", "A", 5, 20, 30)).
				add(grant("b", "B", 7, 500, 510, 1000)),
			want: []string{"overlap", "linearizability"}},
		{name: "acknowledged keepalive lost: grant to another within the deadline it set",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "a", "A", 5, 20, 30)).
				add(keepaliveOp(sessA, 800, 810, 1000)).add(grant("b", "B", 7, 1500, 1510, 1000)),
			want: []string{"keepalive-lost", "linearizability"}},
		{name: "grant in a session after its close was answered",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "z", "Z", 3, 20, 30).on("s")).
				add(closeOp(sessA, true, 100, 110, OK)).add(grantIn(sessA, "a", "A", 5, 200, 210)),
			want: []string{"session-closed"}},
		{name: "keepalive after the close was answered",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "a", "A", 5, 20, 30)).
				add(closeOp(sessA, true, 100, 110, OK)).add(keepaliveOp(sessA, 200, 210, 1000)),
			want: []string{"close-lost"}},
		{name: "open retried after the close was answered",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(closeOp(sessA, true, 100, 110, OK)).
				add(openOp("s", sessA, 200, 210, 1000)),
			want: []string{"close-lost"}},
		{name: "a second close answered closed:true",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(closeOp(sessA, true, 100, 110, OK)).
				add(closeOp(sessA, true, 200, 210, OK)),
			want: []string{"close-lost"}},
		{name: "a session's lease released after the close was answered",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "a", "A", 5, 20, 30)).
				add(closeOp(sessA, true, 100, 110, OK)).add(release("A", true, 200, 210, OK)),
			want: []string{"close-lost", "linearizability"}},
		{name: "closed:false while the session was current",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(grantIn(sessA, "a", "A", 5, 20, 30)).
				add(closeOp(sessA, false, 100, 110, OK)),
			want: []string{"session-lost", "linearizability"}},
		{name: "keepalive answered lease_lost before the deadline",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(keepaliveOp(sessA, 300, 310, 1000)).
				add(keepaliveOp(sessA, 600, 610, 0).withFail("lease_lost")),
			want: []string{"session-lost"}},
		{name: "a waiting acquire in the session answered lease_lost while it was current",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(keepaliveOp(sessA, 300, 310, 1000)).
				add(grantIn(sessA, "w", "", 0, 100, 600).withFail("lease_lost")),
			want: []string{"session-lost"}},
		{name: "session kept alive after a keepalive was answered lease_lost",
			h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(keepaliveOp(sessA, 1100, 1110, 0).withFail("lease_lost")).
				add(keepaliveOp(sessA, 1200, 1210, 1000)),
			want: []string{"session-lost"}},
		{name: "legal: an open whose reply was lost, retried once its session could have expired",
			h: hist{}.add(Op{Kind: KOpen, RequestID: "s", TTL: ms(1000), Invoke: ms(0), Complete: ms(5), Result: Unknown}).
				add(Op{Kind: KOpen, RequestID: "s", TTL: ms(1000), Invoke: ms(1200), Complete: ms(1210), Retry: true}.withFail("lease_lost"))},
		{name: "an open whose reply was lost, retried and answered ended within its TTL",
			h: hist{}.add(Op{Kind: KOpen, RequestID: "s", TTL: ms(1000), Invoke: ms(0), Complete: ms(5), Result: Unknown}).
				add(Op{Kind: KOpen, RequestID: "s", TTL: ms(1000), Invoke: ms(200), Complete: ms(210), Retry: true}.withFail("lease_lost")),
			want: []string{"session-lost"}},
		{name: "an open answered ended, then the same open answered with a session",
			h: hist{}.add(Op{Kind: KOpen, RequestID: "s", TTL: ms(1000), Invoke: ms(0), Complete: ms(5), Result: Unknown}).
				add(Op{Kind: KOpen, RequestID: "s", TTL: ms(1000), Invoke: ms(1200), Complete: ms(1210), Retry: true}.withFail("lease_lost")).
				add(openOp("s", sessA, 1300, 1310, 1000)),
			want: []string{"session-lost"}},
		{name: "one open, two sessions",
			h:    hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(openOp("s", "5e55b", 20, 30, 1000)),
			want: []string{"session-id"}},
		{name: "keepalive without quorum",
			h:    hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(keepaliveOp(sessA, 1000, 1100, 1000)),
			opt:  CheckOptions{NoQuorum: []Window{{From: ms(900), To: ms(2000)}}},
			want: []string{"no-quorum"}},
		{name: "stale status read after the close is an anomaly",
			h: hist{}.add(openOp("s", sessA, 0, 10, 10000)).add(grantIn(sessA, "a", "A", 5, 20, 30)).
				add(closeOp(sessA, true, 100, 110, OK)).add(status(true, 5, 200, 210)),
			opt: CheckOptions{Status: true}, anoms: 1},
		{name: "stale status read after the close, strict",
			h: hist{}.add(openOp("s", sessA, 0, 10, 10000)).add(grantIn(sessA, "a", "A", 5, 20, 30)).
				add(closeOp(sessA, true, 100, 110, OK)).add(status(true, 5, 200, 210)),
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

// setIn is a grant of the lock set res in session; permitIn, of permit k
// of the semaphore sem (3 permits) in session. Neither has a deadline of
// its own.
func setIn(session, req, lease string, res []string, toks []uint64, from, to int) Op {
	o := setGrant(req, lease, res, toks, from, to, 1000)
	o.Session = session
	return o
}

func permitIn(session, req, lease string, k int, tok uint64, from, to int) Op {
	o := permitGrant(req, lease, k, tok, from, to, 1000)
	o.Session = session
	return o
}

// checkCase is a small history (with the register's log and the bucket's
// writes) and the violation kinds and number of anomalies Check must
// report for it.
type checkCase struct {
	name   string
	h      hist
	log    map[string][]uint64
	bucket []BucketWrite
	opt    CheckOptions
	want   []string
	anoms  int
}

// runCheckCases checks each case as a subtest of t.
func runCheckCases(t *testing.T, cases []checkCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opt := tc.opt
			opt.Bucket = tc.bucket
			rep := Check(tc.h, tc.log, opt)
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

// A lock set or a permit held in a session is valid only while the
// session is: every rule on a single lease in a session applies to each
// resource of the set and to the permit.
func TestCheckerCatchesSessionSetAndPermitViolations(t *testing.T) {
	runCheckCases(t, sessionSetAndPermitCases)
}

// setXY is a lock set; waitingPermitIn a waiting acquire of a permit in
// session sessA whose reply named no permit.
var (
	setXY           = []string{"x", "y"}
	waitingPermitIn = Op{Kind: KAcquire, Resource: sem, Limit: 3, Session: sessA, RequestID: "w", Wait: ms(1000), Invoke: ms(100), Complete: ms(500)}
)

var sessionSetAndPermitCases = []checkCase{
	{name: "legal: a set and a permit in a session kept alive, closed, then taken by others",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(setIn(sessA, "a", "A", setXY, []uint64{5, 6}, 20, 30)).
			add(permitIn(sessA, "p", "P", 1, 7, 40, 50)).add(permitGrant("b", "B", 2, 8, 60, 70, 5000)).
			add(permitGrant("c", "C", 3, 9, 80, 90, 5000)).add(keepaliveOp(sessA, 300, 310, 1000)).
			add(statusOf("y", true, 6, 2, 400, 410)).add(closeOp(sessA, true, 900, 910, OK)).
			add(statusOf("y", false, 0, 0, 915, 918)).add(grant("x1", "X1", 10, 920, 930, 1000).on("x")).
			add(permitGrant("d", "D", 1, 11, 940, 950, 1000)).add(semStatus(3, 960, 970, permit(1, 11), permit(2, 8), permit(3, 9))),
		log: map[string][]uint64{"x": {5, 10}, "y": {6}, "pool#1": {7, 11}, "pool#2": {8}},
		opt: CheckOptions{Status: true, StrictStatus: true}},
	{name: "legal: a session no longer kept alive; its set and permit taken over after its deadline",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(setIn(sessA, "a", "A", setXY, []uint64{5, 6}, 20, 30)).
			add(permitIn(sessA, "p", "P", 1, 7, 40, 50)).add(permitGrant("b", "B", 2, 8, 60, 70, 5000)).
			add(permitGrant("c", "C", 3, 9, 80, 90, 5000)).add(grant("y1", "Y1", 10, 1050, 1060, 1000).on("y")).
			add(permitGrant("d", "D", 1, 11, 1070, 1080, 1000)).add(keepaliveOp(sessA, 1200, 1210, 0).withFail("lease_lost")).
			add(setRelease("A", []string{"y", "x"}, false, 1300, 1310)).add(permitRelease("P", 1, false, 1320, 1330)),
		log: map[string][]uint64{"x": {5}, "y": {6, 10}, "pool#1": {7, 11}}},
	{name: "legal: close sent while a set acquire in the session is in flight; the set free at once",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(setIn(sessA, "a", "A", setXY, []uint64{5, 6}, 20, 200)).
			add(closeOp(sessA, true, 100, 150, OK)).add(setGrant("b", "B", setXY, []uint64{7, 8}, 160, 170, 1000))},
	{name: "legal: a waiting permit acquire in the session cancelled, answered lease_lost",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(waitingPermitIn.withFail("lease_lost")).
			add(permitCancel("w", true, 200, 210))},
	{name: "a resource of a set held in a session granted to another while the session is current",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(setIn(sessA, "a", "A", setXY, []uint64{5, 6}, 20, 30)).
			add(grant("y1", "Y1", 7, 500, 510, 1000).on("y")),
		want: []string{"overlap", "linearizability"}},
	{name: "acknowledged keepalive lost: a set's resource granted within the deadline it set",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(setIn(sessA, "a", "A", setXY, []uint64{5, 6}, 20, 30)).
			add(keepaliveOp(sessA, 800, 810, 1000)).add(grant("y1", "Y1", 7, 1500, 1510, 1000).on("y")),
		want: []string{"keepalive-lost", "linearizability"}},
	{name: "a permit held in a session granted again while the session is current: four permits of three",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(permitIn(sessA, "p", "P", 1, 5, 20, 30)).
			add(permitGrant("b", "B", 2, 6, 40, 50, 5000)).add(permitGrant("c", "C", 3, 7, 60, 70, 5000)).
			add(permitGrant("d", "D", 1, 8, 500, 510, 1000)),
		want: []string{"overlap", "linearizability", "permits"}},
	{name: "a set granted in a session after its close was answered",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(closeOp(sessA, true, 100, 110, OK)).
			add(setIn(sessA, "a", "A", setXY, []uint64{5, 6}, 200, 210)),
		want: []string{"session-closed"}},
	{name: "a permit granted in a session after its close was answered",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(closeOp(sessA, true, 100, 110, OK)).
			add(permitIn(sessA, "p", "P", 1, 5, 200, 210)),
		want: []string{"session-closed"}},
	{name: "a set held in a session released after the close was answered",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(setIn(sessA, "a", "A", setXY, []uint64{5, 6}, 20, 30)).
			add(closeOp(sessA, true, 100, 110, OK)).add(setRelease("A", setXY, true, 200, 210)),
		want: []string{"close-lost", "linearizability"}},
	{name: "a permit held in a session released after the close was answered",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(permitIn(sessA, "p", "P", 2, 5, 20, 30)).
			add(closeOp(sessA, true, 100, 110, OK)).add(permitRelease("P", 2, true, 200, 210)),
		want: []string{"close-lost", "linearizability"}},
	{name: "closed:false while the session held a set and a permit",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(setIn(sessA, "a", "A", setXY, []uint64{5, 6}, 20, 30)).
			add(permitIn(sessA, "p", "P", 1, 7, 40, 50)).add(closeOp(sessA, false, 100, 110, OK)),
		want: []string{"session-lost", "linearizability"}},
	{name: "a waiting set acquire in the session answered lease_lost while it was current",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(keepaliveOp(sessA, 300, 310, 1000)).
			add(Op{Kind: KAcquire, Resources: setXY, Session: sessA, RequestID: "w", Wait: ms(1000), Invoke: ms(100), Complete: ms(600)}.withFail("lease_lost")),
		want: []string{"session-lost"}},
	{name: "a waiting permit acquire in the session answered lease_lost while it was current",
		h:    hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(waitingPermitIn.withFail("lease_lost")),
		want: []string{"session-lost"}},
	{name: "the register accepted a session set's token after the next holder's",
		h: hist{}.add(openOp("s", sessA, 0, 10, 1000)).add(setIn(sessA, "a", "A", setXY, []uint64{5, 6}, 20, 30)).
			add(closeOp(sessA, true, 100, 110, OK)).add(grant("x1", "X1", 7, 200, 210, 1000).on("x")),
		log:  map[string][]uint64{"x": {5, 7, 5}},
		want: []string{"fence"}},
	{name: "stale status read: a set's resource shown held after its session's close",
		h: hist{}.add(openOp("s", sessA, 0, 10, 10000)).add(setIn(sessA, "a", "A", setXY, []uint64{5, 6}, 20, 30)).
			add(closeOp(sessA, true, 100, 110, OK)).add(statusOf("x", true, 5, 2, 200, 210)),
		opt: CheckOptions{Status: true, StrictStatus: true}, want: []string{"stale-read"}},
	{name: "bucket: a session's set ended on one of its resources only when the session ended",
		bucket: []BucketWrite{bother(10), bput(11, "x", "A", 2), bput(12, "y", "A", 2), bother(13),
			{Rev: 14, Key: "session-end"}, bdel(15, "x"), bother(16), bdel(17, "y")},
		want: []string{"set-partial"}},
}
