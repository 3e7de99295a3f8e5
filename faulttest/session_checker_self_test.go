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
