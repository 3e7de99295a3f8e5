package faulttest

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

var soak = flag.Duration("soak", 0, "run TestSoak for this long, e.g. -soak=1h (0, the default, skips it)")

// TestSoak runs the workload (sessions, lock sets, semaphores and
// elections included) on one cluster for the -soak duration, in rounds of
// about two minutes, each with a fresh history checked at its end, while
// faults of every kind are injected at random: leader step-downs, an
// isolated follower or leader, no quorum anywhere, paused and cut clients,
// paused and replaced service instances, a node stopped and restarted, the
// whole cluster crashed and restarted.
//
//	go test ./faulttest -run Soak -soak=1h -timeout 2h
func TestSoak(t *testing.T) {
	if *soak == 0 {
		t.Skip("soak is off; run with -soak=1h")
	}
	h := StartHarness(t)
	var live []*Instance
	for node := 0; node < 3; node++ {
		live = append(live, h.Serve(node, ServiceConfig()))
	}
	end := time.Now().Add(*soak)
	total := map[string]int{}
	violations, anomalies := 0, 0
	for round := 0; ; round++ {
		d := min(2*time.Minute, time.Until(end))
		if d < 30*time.Second {
			break
		}
		hist := NewHistory()
		h.Events = hist
		r := &Run{H: h, Hist: hist, Reg: NewRegister(hist)}
		r.W = &Workload{H: h, Hist: hist, Reg: r.Reg, Prefix: fmt.Sprintf("s%d", round), Raw: 14, Go: 4, Sessions: 5,
			Sets: 4, Sems: 4, Candidates: 4, Elections: 2}
		r.W.Prepare()
		f := &faulter{t: t, r: r, live: live}
		r.Drive(t, d, f.run)
		f.pauses.Wait()
		live = f.live
		rep := r.Check(t, CheckOptions{Status: true, NoQuorum: f.noQuorum})
		r.W.Close()
		t.Logf("round %d (%v): faults %v", round, d.Round(time.Second), f.count)
		for k, v := range rep.Counts {
			total[k] += v
		}
		violations += len(rep.Violations)
		anomalies += len(rep.Anomalies)
	}
	t.Logf("soak of %v: %v; %d violations, %d anomalies", *soak, total, violations, anomalies)
}

// faulter injects random faults, one at a time, each repaired before the
// next.
type faulter struct {
	t        *testing.T
	r        *Run
	live     []*Instance
	noQuorum []Window
	count    map[string]int
	pauses   sync.WaitGroup
}

func (f *faulter) run(ctx context.Context) {
	h, hist := f.r.H, f.r.Hist
	f.count = map[string]int{}
	between := func(lo, hi time.Duration) time.Duration { return lo + rand.N(hi-lo) }
	faults := []struct {
		name string
		do   func()
	}{
		{"step-down", func() { _ = h.StepDown() }},
		{"isolate follower", func() {
			h.Isolate((h.C.StreamLeader(lockStream) + 1 + rand.IntN(2)) % 3)
			sleepCtx(ctx, between(2*time.Second, 5*time.Second))
			h.Heal()
		}},
		{"isolate leader", func() {
			if _, err := h.IsolateLeader(); err != nil {
				f.t.Logf("isolate leader: %v", err)
			}
			sleepCtx(ctx, between(time.Second, 4*time.Second))
			h.Heal()
		}},
		{"no quorum", func() {
			h.IsolateAll() // returns once no route crosses the partition
			from := hist.Now()
			sleepCtx(ctx, between(2*time.Second, 6*time.Second))
			f.noQuorum = append(f.noQuorum, Window{From: from, To: hist.Now()})
			h.Heal()
		}},
		{"pause service", func() {
			inst := f.live[rand.IntN(len(f.live))]
			pauseFor(&f.pauses, inst.Proxy, between(500*time.Millisecond, 4*time.Second), hist, fmt.Sprintf("service on node %d", inst.Node))
		}},
		{"pause client", func() {
			ps := f.r.W.ClientProxies()
			i := rand.IntN(len(ps))
			pauseFor(&f.pauses, ps[i], between(time.Second, 6*time.Second), hist, "client "+itoa(i))
		}},
		{"cut client", func() {
			ps := f.r.W.ClientProxies()
			i := rand.IntN(len(ps))
			hist.Event("cut client %d", i)
			ps[i].Cut()
			sleepCtx(ctx, between(500*time.Millisecond, 3*time.Second))
			ps[i].Heal()
		}},
		{"replace service", func() {
			i := rand.IntN(len(f.live))
			old := f.live[i]
			hist.Event("replace the service on node %d", old.Node)
			old.Stop()
			f.live[i] = h.Serve(old.Node, ServiceConfig())
		}},
		{"restart node", func() {
			n := rand.IntN(3)
			hist.Event("stop node %d", n)
			h.C.Stop(n)
			sleepCtx(ctx, between(time.Second, 5*time.Second))
			hist.Event("restart node %d", n)
			if err := h.C.Restart(n); err != nil {
				f.t.Fatal(err)
			}
		}},
		{"crash all", func() {
			h.CrashAll()
			time.Sleep(between(500*time.Millisecond, 3*time.Second))
			h.RestartAll()
		}},
	}
	for ctx.Err() == nil {
		ft := faults[rand.IntN(len(faults))]
		f.count[ft.name]++
		ft.do()
		h.WaitCurrent(20 * time.Second)
		sleepCtx(ctx, between(500*time.Millisecond, 3*time.Second))
	}
}
