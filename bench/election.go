package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/bench/internal/load"
	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/internal/devcluster"
)

// electionTTL is the election scenario's lease TTL unless --ttl is given:
// a killed leader's election passes on only when its lease expires.
const electionTTL = 5 * time.Second

// Operations of the election phase's table.
const (
	opKillFailover   = "kill_failover"   // leader's connection closed -> next leader's Campaign returned
	opResignHandover = "resign_handover" // Resign called -> next leader's Campaign returned
)

// ElectionResult is the outcome of the election scenario.
type ElectionResult struct {
	Election   string  `json:"election"`
	Candidates int     `json:"candidates"`
	Rounds     int     `json:"rounds"`
	TTLms      float64 `json:"ttl_ms"`
	// Kills and Resigns are the rounds' changes of leader: the leader's
	// connection closed under it (no release sent: the election passes on
	// when its lease expires, TTL plus the service's grace after its last
	// renewal), and the leader resigning.
	Kills   []ElectionRound `json:"kills"`
	Resigns []ElectionRound `json:"resigns"`
	// Min, median and max over the rounds: until another candidate's
	// Campaign returned its leadership, until the observer saw it, and
	// (kills) the first less the TTL.
	KillElected    Spread `json:"kill_elected_ms"`
	KillObserved   Spread `json:"kill_observed_ms"`
	KillOverTTL    Spread `json:"kill_elected_minus_ttl_ms"`
	ResignElected  Spread `json:"resign_elected_ms"`
	ResignObserved Spread `json:"resign_observed_ms"`
	Leaders        int    `json:"leaders"`         // leaderships won
	CampaignErrors int64  `json:"campaign_errors"` // Campaigns that failed (not ended by the bench)
	// TokenViolations counts leaders whose token was not above the last
	// leader's, Overlaps leaders elected while the last leader's client
	// had not yet given its leadership up (its Lost not closed): both
	// must be 0.
	TokenViolations int      `json:"token_violations"`
	Overlaps        int      `json:"overlaps"`
	Notes           []string `json:"notes,omitempty"`
}

// ElectionRound is one change of leader.
type ElectionRound struct {
	Round     int    `json:"round"`
	From      string `json:"from"` // the leader killed or resigned (its value)
	To        string `json:"to"`
	FromToken uint64 `json:"from_token"`
	ToToken   uint64 `json:"to_token"`
	// ElectedAfterMs: from the kill (or the call of Resign) until the next
	// leader's Campaign returned. ObservedAfterMs: until the observer
	// (Election.Observe) saw the new leader; null if it did not within
	// 10s of the election.
	ElectedAfterMs  float64  `json:"elected_after_ms"`
	ObservedAfterMs *float64 `json:"observed_after_ms"`
	// LedMs (kills): how long the killed leader had led (its Campaign
	// returned) when it was killed.
	LedMs float64 `json:"led_ms,omitempty"`
	// LostBeforeMs (kills): how long before the new leader's election
	// the killed leader's client gave its leadership up (its deadline,
	// when Lost closed).
	LostBeforeMs *float64 `json:"lost_before_ms,omitempty"`
}

// Spread is the least, the median and the most of some values.
type Spread struct {
	N      int     `json:"n"`
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
}

func spreadOf(xs []float64) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	s := slices.Sorted(slices.Values(xs))
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Spread{N: len(s), Min: round2(s[0]), Median: round2(med), Max: round2(s[len(s)-1])}
}

func (s Spread) String() string {
	if s.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%s / %s / %s", fmtMs(s.Min), fmtMs(s.Median), fmtMs(s.Max))
}

// candidate is one candidate: a connection of its own, a client and an
// Election on it.
type candidate struct {
	value  string
	nc     *nats.Conn
	el     *client.Election
	killed atomic.Bool
}

// win is a Campaign that returned a leadership, and what the winner saw
// of the leadership before it at that moment.
type win struct {
	cd           *candidate
	ld           *client.Leadership
	at           time.Time
	prev         *client.Leadership
	prevLost     bool      // the previous leadership's Lost had closed
	prevDeadline time.Time // its client's deadline
}

type observation struct {
	at time.Time
	ch client.LeaderChange
}

type electionRun struct {
	e    *env
	ph   *phase
	name string
	r    *ElectionResult
	won  chan win
	wg   sync.WaitGroup

	mu    sync.Mutex
	last  *client.Leadership
	conns []*nats.Conn
	seen  []observation

	campaignErrors atomic.Int64
}

// runElection runs --candidates candidates, each on a connection of its
// own through the Go client, for one election (leases of TTL --ttl, by
// default 5s in this scenario), and --rounds times kills the leader (its
// connection closed: its client cannot renew and sends no release) and
// then makes the next leader resign, measuring each time how long until
// another candidate's Campaign returned and until an observer saw the new
// leader. Leaders' tokens must rise, and no leader may be elected while
// the last one's client still held its leadership.
func runElection(ctx context.Context, e *env, sum *Summary) error {
	c := e.cfg
	x := &electionRun{e: e, name: e.names("election") + "leader", won: make(chan win, 4*c.candidates)}
	x.r = &ElectionResult{Election: x.name, Candidates: c.candidates, Rounds: c.rounds, TTLms: float64(c.ttl.Milliseconds())}
	x.ph = newPhase("election", e.serviceBackend(), e.rq.InFlight, 0)
	fmt.Fprintf(e.out, "election: %d candidates, TTL %v; %d rounds of killing the leader, then of its successor resigning\n",
		c.candidates, c.ttl, c.rounds)
	var err error
	e.measure(ctx, sum, x.ph, func() { err = x.run(ctx) })
	sum.use(x.ph)
	r := x.r
	r.CampaignErrors = x.campaignErrors.Load()
	var killed, killObs, overTTL, resigned, resignObs []float64
	for _, k := range r.Kills {
		killed, overTTL = append(killed, k.ElectedAfterMs), append(overTTL, k.ElectedAfterMs-r.TTLms)
		if k.ObservedAfterMs != nil {
			killObs = append(killObs, *k.ObservedAfterMs)
		}
	}
	for _, k := range r.Resigns {
		resigned = append(resigned, k.ElectedAfterMs)
		if k.ObservedAfterMs != nil {
			resignObs = append(resignObs, *k.ObservedAfterMs)
		}
	}
	r.KillElected, r.KillObserved, r.KillOverTTL = spreadOf(killed), spreadOf(killObs), spreadOf(overTTL)
	r.ResignElected, r.ResignObserved = spreadOf(resigned), spreadOf(resignObs)
	sum.Election = r
	if err == nil && (r.TokenViolations > 0 || r.Overlaps > 0) {
		err = fmt.Errorf("election: %d tokens not above the last leader's, %d leaders elected while the last one's client held on", r.TokenViolations, r.Overlaps)
	}
	return err
}

// run starts the observer and the candidates, and runs the rounds.
func (x *electionRun) run(ctx context.Context) error {
	c := x.e.cfg
	cctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel() // waiting Campaigns give up (and cancel their waits)
		x.wg.Wait()
		x.mu.Lock()
		last := x.last
		x.mu.Unlock()
		if last != nil {
			rctx, done := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
			_ = last.Resign(rctx)
			done()
		}
		x.mu.Lock()
		closeAll(x.conns)
		x.mu.Unlock()
	}()
	obs, _, err := x.client()
	if err != nil {
		return err
	}
	oel, err := obs.NewElection(x.name)
	if err != nil {
		return err
	}
	changes := oel.Observe(cctx)
	x.wg.Go(func() {
		for ch := range changes {
			x.mu.Lock()
			x.seen = append(x.seen, observation{time.Now(), ch})
			x.mu.Unlock()
		}
	})
	for i := range c.candidates {
		if err := x.candidate(cctx, fmt.Sprintf("candidate-%d", i)); err != nil {
			return err
		}
	}
	leader, ok := x.next(ctx, time.Now().Add(c.timeout+c.ttl+10*time.Second))
	if !ok {
		return errors.New("election: no candidate was elected")
	}
	for round := 1; round <= c.rounds && ctx.Err() == nil; round++ {
		// The leader leads a random time within its first renewal
		// interval (a third of the TTL; its last write was its grant, or
		// the renewal the client makes after a wait), so that the kill
		// falls at a random point of its renewal cycle, as a crash would.
		select {
		case <-time.After(time.Until(leader.at.Add(rand.N(c.ttl / 3)))):
		case <-ctx.Done():
			return nil
		}
		// Kill: the connection closes under the client, which can no
		// longer renew and sends no release; its lease expires.
		t0 := time.Now()
		leader.cd.killed.Store(true)
		leader.cd.nc.Close()
		x.ph.event(fmt.Sprintf("round %d: closed the connection of leader %s", round, leader.cd.value))
		next, ok := x.next(ctx, t0.Add(c.ttl+c.timeout+30*time.Second))
		if !ok {
			x.r.Notes = append(x.r.Notes, fmt.Sprintf("round %d: no new leader after the kill of %s", round, leader.cd.value))
			break
		}
		x.r.Kills = append(x.r.Kills, x.round(ctx, opKillFailover, round, t0, leader, next))
		if err := x.candidate(cctx, leader.cd.value); err != nil { // the killed candidate comes back
			return err
		}
		leader = next

		t1 := time.Now()
		if err := leader.ld.Resign(ctx); err != nil {
			x.r.Notes = append(x.r.Notes, fmt.Sprintf("round %d: resign of %s: %v", round, leader.cd.value, err))
		}
		x.ph.event(fmt.Sprintf("round %d: leader %s resigned", round, leader.cd.value))
		if next, ok = x.next(ctx, t1.Add(c.ttl+c.timeout+30*time.Second)); !ok {
			x.r.Notes = append(x.r.Notes, fmt.Sprintf("round %d: no new leader after %s resigned", round, leader.cd.value))
			break
		}
		x.r.Resigns = append(x.r.Resigns, x.round(ctx, opResignHandover, round, t1, leader, next))
		leader = next
	}
	return nil
}

// client returns a client on a new connection of the caller user, and
// the connection.
func (x *electionRun) client() (*client.Client, *nats.Conn, error) {
	conns, err := x.e.connect(devcluster.Caller, x.e.url, 1)
	if err != nil {
		return nil, nil, err
	}
	x.mu.Lock()
	x.conns = append(x.conns, conns[0])
	x.mu.Unlock()
	cl, err := client.New(conns[0], client.WithPrefix(x.e.cfg.prefix), client.WithRequestTimeout(x.e.cfg.timeout))
	return cl, conns[0], err
}

// candidate starts a candidate of value on a connection of its own.
func (x *electionRun) candidate(ctx context.Context, value string) error {
	cl, nc, err := x.client()
	if err != nil {
		return err
	}
	el, err := cl.NewElection(x.name, client.TTL(x.e.cfg.ttl))
	if err != nil {
		return err
	}
	cd := &candidate{value: value, nc: nc, el: el}
	x.wg.Go(func() { x.campaign(ctx, cd) })
	return nil
}

// campaign campaigns until ctx ends or the candidate is killed, and
// again whenever its leadership ends.
func (x *electionRun) campaign(ctx context.Context, cd *candidate) {
	for ctx.Err() == nil && !cd.killed.Load() {
		ld, err := cd.el.Campaign(ctx, cd.value)
		at := time.Now()
		if err != nil {
			if ctx.Err() != nil || cd.killed.Load() {
				return
			}
			x.campaignErrors.Add(1)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		w := win{cd: cd, ld: ld, at: at}
		x.mu.Lock()
		if prev := x.last; prev != nil {
			w.prev, w.prevDeadline = prev, prev.Expires()
			select {
			case <-prev.Lost():
				w.prevLost = true
			default:
			}
		}
		x.last = ld
		x.mu.Unlock()
		x.won <- w // buffered beyond the leaders a run can have
		select {
		case <-ld.Lost():
		case <-ctx.Done():
			return
		}
	}
}

// next returns the next leadership won, waiting until deadline.
func (x *electionRun) next(ctx context.Context, deadline time.Time) (win, bool) {
	select {
	case w := <-x.won:
		x.r.Leaders++
		if w.prev != nil && w.ld.Token() <= w.prev.Token() {
			x.r.TokenViolations++
			x.r.Notes = append(x.r.Notes, fmt.Sprintf("%s elected with token %d, the last leader had %d", w.cd.value, w.ld.Token(), w.prev.Token()))
		}
		if w.prev != nil && !w.prevLost {
			x.r.Overlaps++
			x.r.Notes = append(x.r.Notes, fmt.Sprintf("%s elected (token %d) while the last leader's client held token %d", w.cd.value, w.ld.Token(), w.prev.Token()))
		}
		return w, true
	case <-ctx.Done():
	case <-time.After(time.Until(deadline)):
	}
	return win{}, false
}

// round records one change of leader from old to w, begun at t0 (the kill
// or the call of Resign), once the observer saw it (or 10s passed).
func (x *electionRun) round(ctx context.Context, op string, n int, t0 time.Time, old, w win) ElectionRound {
	r := ElectionRound{Round: n, From: old.cd.value, To: w.cd.value, FromToken: old.ld.Token(), ToToken: w.ld.Token(),
		ElectedAfterMs: msOf(w.at.Sub(t0))}
	x.ph.rec.Get(op, 0).Record(w.at.Sub(t0), load.CodeOK)
	if op == opKillFailover {
		r.LedMs = msOf(t0.Sub(old.at))
		if !w.prevDeadline.IsZero() {
			v := msOf(w.at.Sub(w.prevDeadline))
			r.LostBeforeMs = &v
		}
	}
	for deadline := w.at.Add(10 * time.Second); ctx.Err() == nil; time.Sleep(10 * time.Millisecond) {
		if at, ok := x.observed(w.ld.Token()); ok {
			v := msOf(at.Sub(t0))
			r.ObservedAfterMs = &v
			break
		}
		if time.Now().After(deadline) {
			x.r.Notes = append(x.r.Notes, fmt.Sprintf("round %d (%s): the observer did not see leader %s in 10s", n, op, w.cd.value))
			break
		}
	}
	return r
}

// observed returns when the observer first saw a leader of token, or a
// later one.
func (x *electionRun) observed(token uint64) (time.Time, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, o := range x.seen {
		if o.ch.Leader && o.ch.Token >= token {
			return o.at, true
		}
	}
	return time.Time{}, false
}

func printElection(w io.Writer, r *ElectionResult) {
	fmt.Fprintf(w, "\n== election: %d candidates, each on its own connection, lease TTL %s ==\n", r.Candidates, fmtMs(r.TTLms))
	rows := func(kind string, rs []ElectionRound) {
		for _, k := range rs {
			obs := "not seen"
			if k.ObservedAfterMs != nil {
				obs = fmtMs(*k.ObservedAfterMs)
			}
			extra := ""
			if kind == "kill" {
				extra = fmt.Sprintf("; killed after leading %s", fmtMs(k.LedMs))
			}
			if k.LostBeforeMs != nil {
				extra += fmt.Sprintf(", its client gave up %s before the new election", fmtMs(*k.LostBeforeMs))
			}
			fmt.Fprintf(w, "round %d %s: %s (token %d) -> %s (token %d): elected after %s, observed after %s%s\n",
				k.Round, kind, k.From, k.FromToken, k.To, k.ToToken, fmtMs(k.ElectedAfterMs), obs, extra)
		}
	}
	rows("kill", r.Kills)
	rows("resign", r.Resigns)
	fmt.Fprintf(w, "kill (connection closed, no release) -> elected, min / median / max: %s (less the TTL: %s); -> observed: %s\n",
		r.KillElected, r.KillOverTTL, r.KillObserved)
	fmt.Fprintf(w, "resign -> elected: %s; -> observed: %s\n", r.ResignElected, r.ResignObserved)
	fmt.Fprintf(w, "%d leaderships, %d failed campaigns; tokens not above the last leader's: %d; leaders elected while the last one's client held on: %d\n",
		r.Leaders, r.CampaignErrors, r.TokenViolations, r.Overlaps)
	if len(r.Notes) > 0 {
		fmt.Fprintf(w, "notes: %s\n", strings.Join(r.Notes, "; "))
	}
}
