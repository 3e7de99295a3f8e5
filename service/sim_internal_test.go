package service

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// A deterministic simulation of the rules that span requests: grants of
// locks, permits and lock sets in sessions by several instances, decided
// by the service's own deciders (decideName, mayRetire) on views that lag
// and restart, committed to an in-memory model of the bucket (revisions,
// compare-and-set, atomic batches with checks), with replies lost and
// instances that die mid-request; one seed drives every choice, and the
// invariants are checked after every step. A failure prints its seed and
// the command that replays it.
//
// It adds to the tests against real clusters; it does not replace them:
// the model is of the bucket's semantics, not of nats-server.

var (
	simSeed = flag.Uint64("sim.seed", 0, "the engine simulation's seed (0: a new one, printed on failure)")
	simOps  = flag.Int("sim.ops", 100_000, "requests the engine simulation drives")
)

// simRules are the rules the simulation's commit loop applies; each can be
// taken out to show that the simulation finds the race it closes.
type simRules struct {
	once       bool // a grant carries its request's message id, and an end names the request it ended
	nameRecord bool // a permit's grant writes its semaphore's name record
	limit      bool // a permit of another limit than the name record's retires it first
	retryProof bool // a set's retry in a session is proven before it is answered held
}

var allRules = simRules{once: true, nameRecord: true, limit: true, retryProof: true}

// simBucket is the model of the bucket: the last write of every key (its
// entry, whose rev is the write's revision) and every write in commit
// order, which the instances' watchers deliver.
type simBucket struct {
	rev  uint64
	last map[string]entry
	log  []simWrite
	ids  map[string]bool // the message ids of every write (the duplicate window, forever)
	// grants counts the commits that granted each request id; twice is
	// the first granted twice.
	grants map[string]int
	twice  string
}

type simWrite struct {
	key string
	e   entry
}

// simMsg is a message of an atomic batch: the write of e at key, or with
// check no write, if key's last revision is still expect.
type simMsg struct {
	key    string
	expect uint64
	check  bool
	e      entry
	msgID  string
}

// commit applies msgs all or nothing: not at all when a message's
// revision is not its key's last, or its message id was seen (a
// duplicate).
func (b *simBucket) commit(msgs []simMsg) bool {
	for _, m := range msgs {
		if b.last[m.key].rev != m.expect || m.msgID != "" && b.ids[m.msgID] {
			return false
		}
	}
	granted := ""
	for _, m := range msgs {
		if m.msgID != "" {
			b.ids[m.msgID] = true
		}
		if m.check {
			continue
		}
		if m.e.held() {
			granted = m.e.rec.RequestID
		}
		b.rev++
		e := m.e
		e.rev = b.rev
		b.last[m.key] = e
		b.log = append(b.log, simWrite{m.key, e})
	}
	if granted != "" && granted != "open" {
		if b.grants[granted]++; b.grants[granted] == 2 && b.twice == "" {
			b.twice = granted
		}
	}
	return true
}

// simView is an instance's view of the bucket: the writes its watcher
// has delivered, a prefix of the log.
type simView struct {
	delivered int
	keys      map[string]entry
}

func (v *simView) catchUp(b *simBucket, n int) {
	for ; n > 0 && v.delivered < len(b.log); n-- {
		w := b.log[v.delivered]
		v.keys[w.key] = w.e
		v.delivered++
	}
}

// simOp is one request in flight: it decides on reads, then commits the
// plan it decided, and decides again after a conflict or a lost reply.
type simOp struct {
	kind     string // lock, permit, set, retry, release, close
	id       string
	inst     int
	names    []string
	limit    int
	session  string
	fresh    bool
	attempts int
	plan     []simMsg
	// done runs once the plan commits and its reply is heard; it reports
	// whether the request is over (false: decide again).
	done func(s *sim) bool
}

type sim struct {
	seed   uint64
	rnd    *rand.Rand
	rules  simRules
	b      simBucket
	views  []simView
	ops    []*simOp
	steps  int
	nextID int
	sets   []*simOp // sets granted, for retries
	failed string
	// granted counts the grants of each kind, and retries answered held.
	granted map[string]int
}

const (
	simNames    = 4
	simMaxLimit = 3
	simSessions = 3
)

func newSim(seed uint64, rules simRules) *sim {
	s := &sim{seed: seed, granted: map[string]int{}, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), rules: rules,
		b: simBucket{last: map[string]entry{}, ids: map[string]bool{}, grants: map[string]int{}}, views: make([]simView, 3)}
	for i := range s.views {
		s.views[i].keys = map[string]entry{}
	}
	for i := range simSessions {
		s.b.commit([]simMsg{{key: s.sessionKey(i), e: entry{rec: &streams.Record{LeaseID: "sess", RequestID: "open"}}}})
	}
	return s
}

func (s *sim) sessionKey(i int) string { return streams.SessionKey(fmt.Sprintf("s%d", i)) }

// read returns key as op reads it: from the stream leader, or from its
// instance's view, which may first catch up a little (reads of several
// keys see several points of the stream).
func (s *sim) read(op *simOp, key string) entry {
	if op.fresh {
		return s.b.last[key]
	}
	v := &s.views[op.inst]
	if s.rnd.IntN(4) == 0 {
		v.catchUp(&s.b, s.rnd.IntN(3))
	}
	return v.keys[key]
}

func (s *sim) name(i int) string { return fmt.Sprintf("n%d", i) }

// start begins a new request of a random kind on a random instance.
func (s *sim) start() {
	s.nextID++
	op := &simOp{id: fmt.Sprintf("r%d", s.nextID), inst: s.rnd.IntN(len(s.views))}
	n := s.name(s.rnd.IntN(simNames))
	switch r := s.rnd.IntN(100); {
	case r < 22:
		op.kind, op.names = "lock", []string{n}
	case r < 47:
		op.kind, op.names, op.limit = "permit", []string{n}, 1+s.rnd.IntN(simMaxLimit)
	case r < 59:
		i := s.rnd.IntN(simNames)
		n, m := s.name(i), s.name((i+1+s.rnd.IntN(simNames-1))%simNames)
		op.kind, op.names, op.session = "set", []string{n, m}, s.sessionKey(s.rnd.IntN(simSessions))
	case r < 69 && len(s.sets) > 0:
		// One of the last sets granted: most older ones have ended.
		set := s.sets[max(0, len(s.sets)-1-s.rnd.IntN(4))]
		op.kind, op.id, op.names, op.session = "retry", set.id, set.names, set.session
	case r < 94:
		op.kind = "release"
	default:
		op.kind, op.session = "close", s.sessionKey(s.rnd.IntN(simSessions))
	}
	s.ops = append(s.ops, op)
}

// step advances op by one step: it commits its plan, or decides. It
// reports whether op is over.
func (s *sim) step(op *simOp) bool {
	if op.plan != nil {
		ok := s.b.commit(op.plan)
		op.plan = nil
		lost := s.rnd.IntN(20) == 0
		switch {
		case ok && !lost:
			if op.done(s) {
				return true
			}
		}
		// A conflict, a lost reply (outcome unknown) or a step taken:
		// decide again, on reads.
		op.fresh = true
	}
	if op.attempts++; op.attempts > maxAttempts {
		return true
	}
	op.done = nil
	switch op.kind {
	case "lock", "set":
		return s.decideLocks(op)
	case "permit":
		return s.decidePermit(op)
	case "retry":
		return s.decideRetry(op)
	case "release":
		return s.decideRelease(op)
	case "close":
		return s.decideClose(op)
	}
	return true
}

// over is the done of a request answered once its plan commits.
func over(*sim) bool { return true }

// msgID is the message id of op's grant at n (a semaphore's queue for a
// permit), as grantMsgID makes it from the request's hash; none without
// the rule.
func (s *sim) msgID(op *simOp, n string) string {
	if !s.rules.once {
		return ""
	}
	return grantMsgID(requestHash(n, op.id, ""))
}

// endOf is the delete that ends the lease e: its marker names the request
// it ended (none without the rule).
func (s *sim) endOf(e entry) entry {
	if !s.rules.once {
		return entry{}
	}
	return entry{end: &streams.EndMark{RequestID: e.rec.RequestID}}
}

// ended reports whether e is the end of op's own lease, as the service
// decides it (an end mark without a time counts within any window).
func (s *sim) ended(e entry, op *simOp) bool {
	return !e.held() && e.end.Ended(op.id, "", time.Time{}, 0)
}

// mine reports whether e holds op's lease.
func mine(e entry, op *simOp) bool { return e.held() && e.rec.RequestID == op.id }

// decideLocks decides a lock's (or a lock set's, in a session) grant.
func (s *sim) decideLocks(op *simOp) bool {
	var msgs []simMsg
	held := 0
	for _, n := range op.names {
		e := s.read(op, streams.LeaseKey(n))
		if mine(e, op) {
			held++
			continue
		}
		if s.ended(e, op) {
			return s.refuse(op) // lease_lost, on a read
		}
		switch decideName(e, 0) {
		case nameRetire:
			return s.planRetire(op, n, e)
		case nameGrant:
			if e.held() {
				return s.refuse(op)
			}
			rec := &streams.Record{LeaseID: op.id, RequestID: op.id}
			if op.session != "" {
				rec.Session, rec.Set = op.session, op.id
			}
			msgs = append(msgs, simMsg{key: streams.LeaseKey(n), expect: e.rev, e: entry{rec: rec}, msgID: s.msgID(op, n)})
		default:
			return s.refuse(op)
		}
	}
	if held > 0 {
		// Its own grant already (a lost reply), or part of it ended: not
		// granted again.
		return true
	}
	if op.session != "" {
		sess := s.read(op, op.session)
		if !sess.held() {
			return s.refuse(op)
		}
		msgs = append(msgs, simMsg{key: op.session, expect: sess.rev, check: true})
	}
	op.plan = msgs
	op.done = func(s *sim) bool {
		if op.kind == "set" {
			s.sets = append(s.sets, op)
		}
		s.granted[op.kind]++
		return true
	}
	return false
}

// refuse ends op without a grant, unless the refusal was decided on a
// view: then it decides again on reads, as the service does.
func (s *sim) refuse(op *simOp) bool {
	if !op.fresh {
		op.fresh = true
		return false
	}
	return true
}

// planRetire plans the retirement of name n's record e: every permit of
// its limit proven free and the record deleted in one batch.
func (s *sim) planRetire(op *simOp, n string, e entry) bool {
	permits := make([]entry, e.sem)
	for k := range e.sem {
		permits[k] = s.read(op, permitKey(n, k+1))
	}
	if !mayRetire(permits) {
		return s.refuse(op)
	}
	for k, p := range permits {
		op.plan = append(op.plan, simMsg{key: permitKey(n, k+1), expect: p.rev, check: true})
	}
	op.plan = append(op.plan, simMsg{key: streams.LeaseKey(n), expect: e.rev})
	op.done = func(*sim) bool { return false } // then decide again
	return false
}

// decidePermit decides a permit's grant.
func (s *sim) decidePermit(op *simOp) bool {
	n := op.names[0]
	e := s.read(op, streams.LeaseKey(n))
	action := decideName(e, op.limit)
	if !s.rules.limit && action == nameRetire && e.sem != 0 {
		action = nameGrant
	}
	switch action {
	case nameRetire:
		return s.planRetire(op, n, e)
	case nameRefuse:
		return s.refuse(op)
	}
	for k := 1; k <= op.limit; k++ {
		p := s.read(op, permitKey(n, k))
		if mine(p, op) {
			return true
		}
		if s.ended(p, op) {
			return s.refuse(op)
		}
		if p.held() {
			continue
		}
		op.plan = []simMsg{{key: permitKey(n, k), expect: p.rev, e: entry{rec: &streams.Record{LeaseID: op.id, RequestID: op.id, Limit: op.limit}}, msgID: s.msgID(op, streams.PermitQueue(n))}}
		if s.rules.nameRecord {
			op.plan = append(op.plan, simMsg{key: streams.LeaseKey(n), expect: e.rev, e: entry{sem: op.limit}})
		}
		op.done = func(s *sim) bool { s.granted["permit"]++; return true }
		return false
	}
	return s.refuse(op)
}

// decideRetry decides a retry of a set's acquire in its session: held
// only while every key holds its lease and its session lives, proven.
func (s *sim) decideRetry(op *simOp) bool {
	var proof []simMsg
	for _, n := range op.names {
		e := s.read(op, streams.LeaseKey(n))
		if !mine(e, op) {
			return s.refuse(op) // lease_lost, on a read
		}
		proof = append(proof, simMsg{key: streams.LeaseKey(n), expect: e.rev, check: true})
	}
	sess := s.read(op, op.session)
	if !sess.held() {
		return s.refuse(op)
	}
	if !s.rules.retryProof {
		s.answeredHeld(op)
		return true
	}
	op.plan = append(proof, simMsg{key: op.session, expect: sess.rev, check: true})
	op.done = func(s *sim) bool { s.answeredHeld(op); return true }
	return false
}

// answeredHeld checks a retry answered held against the bucket.
func (s *sim) answeredHeld(op *simOp) {
	s.granted["retry held"]++
	for _, n := range op.names {
		if !mine(s.b.last[streams.LeaseKey(n)], op) {
			s.fail("a retry of set %s answered held, but %s does not hold it", op.id, n)
		}
	}
	if !s.b.last[op.session].held() {
		s.fail("a retry of set %s answered held after its session %s ended", op.id, op.session)
	}
}

// decideRelease ends a random lease as its holder would: by
// compare-and-set on the revision it holds (a set's keys together).
func (s *sim) decideRelease(op *simOp) bool {
	var held []string
	for _, k := range s.sortedKeys("lease.") {
		if s.b.last[k].held() {
			held = append(held, k)
		}
	}
	if len(held) == 0 {
		return true
	}
	key := held[s.rnd.IntN(len(held))]
	e := s.b.last[key]
	op.plan = []simMsg{{key: key, expect: e.rev, e: s.endOf(e)}}
	if e.rec.Set != "" {
		op.plan = nil
		for _, k := range s.keysOf(e.rec.Set) {
			op.plan = append(op.plan, simMsg{key: k, expect: s.b.last[k].rev, e: s.endOf(s.b.last[k])})
		}
	}
	op.done = over
	return false
}

// decideClose closes a session, ending its sets in the same batch, or
// opens it again once closed.
func (s *sim) decideClose(op *simOp) bool {
	sess := s.read(op, op.session)
	if !sess.held() {
		op.plan = []simMsg{{key: op.session, expect: sess.rev, e: entry{rec: &streams.Record{LeaseID: "sess", RequestID: "open"}}}}
		op.done = over
		return false
	}
	op.plan = []simMsg{{key: op.session, expect: sess.rev}}
	for _, k := range s.sortedKeys("lease.") {
		if e := s.b.last[k]; e.held() && e.rec.Session == op.session {
			op.plan = append(op.plan, simMsg{key: k, expect: e.rev, e: s.endOf(e)})
		}
	}
	op.done = over
	return false
}

func (s *sim) keysOf(set string) []string {
	var keys []string
	for _, k := range s.sortedKeys("lease.") {
		if e := s.b.last[k]; e.held() && e.rec.Set == set {
			keys = append(keys, k)
		}
	}
	return keys
}

// sortedKeys returns the model's keys with prefix in a fixed order, so
// that a seed replays exactly.
func (s *sim) sortedKeys(prefix string) []string {
	var keys []string
	for i := range simNames {
		n := s.name(i)
		if strings.HasPrefix(streams.LeaseKey(n), prefix) {
			keys = append(keys, streams.LeaseKey(n))
			for k := 1; k <= simMaxLimit; k++ {
				keys = append(keys, permitKey(n, k))
			}
		}
	}
	return keys
}

func (s *sim) fail(format string, args ...any) {
	if s.failed == "" {
		s.failed = fmt.Sprintf("step %d: ", s.steps) + fmt.Sprintf(format, args...)
	}
}

// check checks the invariants on the bucket: a name is a lock or a
// semaphore of one limit, never both; a permit is within its limit.
func (s *sim) check() {
	for i := range simNames {
		n := s.name(i)
		lease := s.b.last[streams.LeaseKey(n)]
		limits := map[int]bool{}
		for k := 1; k <= simMaxLimit; k++ {
			p := s.b.last[permitKey(n, k)]
			if !p.held() {
				continue
			}
			limits[p.rec.Limit] = true
			if k > p.rec.Limit {
				s.fail("%s: permit %d held under limit %d", n, k, p.rec.Limit)
			}
			if lease.held() {
				s.fail("%s: held as a lock (%s) and as a semaphore (permit %d of limit %d) at once", n, lease.rec.RequestID, k, p.rec.Limit)
			}
		}
		if len(limits) > 1 {
			s.fail("%s: a semaphore held under limits %v at once", n, limits)
		}
	}
	if s.b.twice != "" {
		s.fail("request %s granted twice", s.b.twice)
	}
}

// run drives ops requests, checking after every step; it returns the
// first violation, or "".
func (s *sim) run(ops int) string {
	started := 0
	for s.failed == "" && (started < ops || len(s.ops) > 0) {
		s.steps++
		switch r := s.rnd.IntN(100); {
		case r < 30 && started < ops && len(s.ops) < 8:
			s.start()
			started++
		case r < 38:
			v := &s.views[s.rnd.IntN(len(s.views))]
			v.catchUp(&s.b, s.rnd.IntN(40))
		case r < 39:
			// A watcher that starts again delivers everything anew.
			s.views[s.rnd.IntN(len(s.views))] = simView{keys: map[string]entry{}}
		case r < 40 && len(s.ops) > 0:
			// An instance dies: its requests in flight end unanswered.
			dead := s.rnd.IntN(len(s.views))
			s.ops = slicesDeleteFunc(s.ops, func(op *simOp) bool { return op.inst == dead })
		default:
			if len(s.ops) == 0 {
				continue
			}
			i := s.rnd.IntN(len(s.ops))
			op := s.ops[i]
			s.ops = append(s.ops[:i], s.ops[i+1:]...)
			if !s.step(op) {
				s.ops = append(s.ops, op)
			}
		}
		s.check()
	}
	return s.failed
}

func slicesDeleteFunc(ops []*simOp, del func(*simOp) bool) []*simOp {
	out := ops[:0]
	for _, op := range ops {
		if !del(op) {
			out = append(out, op)
		}
	}
	return out
}

func TestEngineSimulation(t *testing.T) {
	seed := *simSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	s := newSim(seed, allRules)
	if v := s.run(*simOps); v != "" {
		t.Fatalf("seed %d: %s\nreplay: go test ./service -run 'TestEngineSimulation$' -sim.seed=%d", seed, v, seed)
	}
	for _, kind := range []string{"lock", "permit", "set", "retry held"} {
		if s.granted[kind] < max(1, *simOps/5000) {
			t.Fatalf("seed %d: %d grants of kind %s in %d requests: the simulation exercised too little", seed, s.granted[kind], kind, *simOps)
		}
	}
	t.Logf("seed %d: %d requests, %d steps, %d writes, granted %v", seed, *simOps, s.steps, s.b.rev, s.granted)
}

// With a rule taken out, the simulation finds the race the rule closes,
// each within a few seeds' runs.
func TestEngineSimulationFindsTheRacesWithoutTheirRules(t *testing.T) {
	for name, rules := range map[string]simRules{
		"a request granted twice (no message id, no end mark)":  {nameRecord: true, limit: true, retryProof: true},
		"a lock and a semaphore at once (no name record)":       {once: true, limit: true, retryProof: true},
		"one semaphore under two limits (no limit rule)":        {once: true, nameRecord: true, retryProof: true},
		"a set retry held after its session's close (no proof)": {once: true, nameRecord: true, limit: true},
	} {
		found := ""
		for seed := uint64(1); seed <= 20 && found == ""; seed++ {
			found = newSim(seed, rules).run(20_000)
		}
		if found == "" {
			t.Errorf("%s: not found in 20 seeds", name)
			continue
		}
		t.Logf("%s: %s", name, found)
	}
}
