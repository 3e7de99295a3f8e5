package load

import (
	"container/heap"
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// Session mode (Config.Sessions): the workload opens its sessions first,
// acquires each lease in one of them, keeps the sessions alive instead of
// renewing leases, releases leases one by one as in lease mode, and
// closes the sessions at the end, which releases what they still hold.

// Session states.
const (
	ssNew     uint8 = iota // not open (never sent, or its open's outcome unknown)
	ssLive                 // open, waiting for its next keepalive
	ssKeeping              // a keepalive in flight
	ssLost                 // ended by the service: a keepalive answered lease_lost
	ssClosing              // close sent
	ssClosed
)

// session is one session of the workload.
type session struct {
	id    string // session_id, once opened
	state uint8
	gen   uint32
	// members are the resources whose lease is, or may be, in the session:
	// from the send of their acquire until the resource is free again.
	members map[int32]struct{}
}

// pickSession returns a random open session to acquire in. The caller
// holds w.mu.
func (w *Workload) pickSession() (int32, bool) {
	if w.usable.len() == 0 {
		return 0, false
	}
	return w.usable.ids[w.rng.IntN(w.usable.len())], true
}

// keepDue returns when a session kept alive at now is due again: a third
// of the TTL, jittered by RenewJitter.
func (w *Workload) keepDue(now time.Time) time.Time {
	j := 1 + w.cfg.RenewJitter*(2*w.rng.Float64()-1)
	return now.Add(time.Duration(float64(w.cfg.TTL/3) * j))
}

// KeepaliveInterval is how often each session is kept alive, on average.
func (w *Workload) KeepaliveInterval() time.Duration { return w.cfg.TTL / 3 }

// toLive makes session si open and schedules its keepalive. The caller
// holds w.mu.
func (w *Workload) toLive(si int32, due time.Time) {
	ss := &w.sessions[si]
	ss.gen++
	ss.state = ssLive
	w.usable.add(si)
	heap.Push(&w.keepQ, renewItem{due: due, id: si, gen: ss.gen})
}

// SessionsOpen returns the number of sessions open.
func (w *Workload) SessionsOpen() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.usable.len()
}

// SessionsReleased returns the number of leases the sessions' closes
// released, as their answers counted them.
func (w *Workload) SessionsReleased() int64 { return w.released.Load() }

// OpenSessions opens the workload's sessions (in at most three rounds; a
// retry uses the same request_id, which returns the same session), at
// most rate a second, recording into rec.
func (w *Workload) OpenSessions(ctx context.Context, rec *Recorders, rate float64) {
	for round := 0; round < 3 && ctx.Err() == nil; round++ {
		w.mu.Lock()
		var todo []int32
		for i := range w.sessions {
			if w.sessions[i].state == ssNew {
				todo = append(todo, int32(i))
			}
		}
		w.mu.Unlock()
		if len(todo) == 0 {
			return
		}
		next := 0
		w.gated(ctx, len(todo), rate, func(t time.Time) {
			w.sendOpen(rec, rate, todo[next], t)
			next++
		})
	}
}

// sendOpen opens session si.
func (w *Workload) sendOpen(rec *Recorders, rate float64, si int32, intended time.Time) {
	r := rec.Get(OpSessionOpen, rate)
	m := w.sb.SessionOpen(w.cfg.RunID+"-s"+strconv.Itoa(int(si)), w.cfg.TTL)
	err := w.rq.Send(m, w.cfg.Timeout, func(reply *nats.Msg, at time.Time, err error) {
		res := w.sb.ParseSession(streams.OpSessionOpen, reply, err)
		r.Record(at.Sub(intended), res.Code)
		if res.Code != CodeOK {
			return // open again in the next round
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		ss := &w.sessions[si]
		ss.id, ss.members = res.Session, map[int32]struct{}{}
		w.toLive(si, w.keepDue(at))
	})
	if err != nil {
		r.Fail(SendCode(err))
	}
}

// nextKeepalive takes the open session whose keepalive is due first; ok
// is false when none is open. The caller holds w.mu.
func (w *Workload) nextKeepalive() (si int32, ok bool) {
	for w.keepQ.Len() > 0 {
		it := heap.Pop(&w.keepQ).(renewItem)
		if ss := &w.sessions[it.id]; ss.state == ssLive && ss.gen == it.gen {
			ss.state = ssKeeping
			return it.id, true
		}
	}
	return 0, false
}

// sendKeepalive keeps alive the session whose keepalive is due first.
func (w *Workload) sendKeepalive(rec *Recorders, rate float64, intended time.Time) {
	r := rec.Get(OpKeepalive, rate)
	w.mu.Lock()
	si, ok := w.nextKeepalive()
	id := w.sessions[si].id
	w.mu.Unlock()
	if !ok {
		r.Skip()
		return
	}
	sent := time.Now()
	err := w.rq.Send(w.sb.SessionKeepalive(id), w.cfg.Timeout, func(reply *nats.Msg, at time.Time, err error) {
		res := w.sb.ParseSession(streams.OpSessionKeepalive, reply, err)
		r.Record(at.Sub(intended), res.Code)
		w.mu.Lock()
		defer w.mu.Unlock()
		w.keptAlive(si, res.Code, sent, at)
	})
	if err != nil {
		r.Fail(SendCode(err))
		w.mu.Lock()
		w.keptAlive(si, SendCode(err), sent, time.Now())
		w.mu.Unlock()
	}
}

// keptAlive applies the answer code, at, to the keepalive of session si
// sent at sent. Its leases count as renewed by a success; they are lost,
// each counted once, when it was answered lease_lost (the session has
// ended), or when no keepalive succeeded for a TTL (see Losses). The
// caller holds w.mu.
func (w *Workload) keptAlive(si int32, code string, sent, at time.Time) {
	ss := &w.sessions[si]
	if ss.state != ssKeeping {
		return
	}
	switch code {
	case CodeOK:
		for id := range ss.members {
			if s := &w.slots[id]; s.state == stHeld || s.state == stReleasing {
				w.log.RenewedAt(w.names[id], s.g, s.token, sent)
				s.okAt = sent
			}
		}
		w.toLive(si, w.keepDue(at))
	case streams.CodeLeaseLost:
		ss.state = ssLost
		w.usable.remove(si)
		for id := range ss.members {
			s := &w.slots[id]
			if s.state == stHeld && !s.lost {
				s.lost = true
				w.lost.leaseLost.Add(1)
			}
			if s.state == stHeld || s.state == stQuarantined {
				w.held.remove(id)
				w.toFree(id) // the service ended it with its session
			}
		}
	default:
		for id := range ss.members {
			if s := &w.slots[id]; s.state == stHeld && !s.lost && !s.okAt.IsZero() && at.Sub(s.okAt) > w.cfg.TTL {
				s.lost = true
				w.lost.expired.Add(1)
			}
		}
		w.toLive(si, at) // unknown, or refused: keep it alive again soon
	}
}

// CloseSessions closes every open session, at most rate a second,
// recording into rec, and waits for the answers: what the sessions still
// hold is released.
func (w *Workload) CloseSessions(ctx context.Context, rec *Recorders, rate float64) {
	w.mu.Lock()
	var todo []int32
	for i := range w.sessions {
		if st := w.sessions[i].state; st == ssLive || st == ssKeeping {
			todo = append(todo, int32(i))
		}
	}
	w.mu.Unlock()
	next := 0
	w.gated(ctx, len(todo), rate, func(t time.Time) {
		w.sendClose(rec, rate, todo[next], t)
		next++
	})
}

// sendClose closes session si.
func (w *Workload) sendClose(rec *Recorders, rate float64, si int32, intended time.Time) {
	r := rec.Get(OpSessionClose, rate)
	w.mu.Lock()
	ss := &w.sessions[si]
	ss.state = ssClosing
	ss.gen++
	w.usable.remove(si)
	now := time.Now()
	var grants []*Grant
	for id := range ss.members {
		if s := &w.slots[id]; s.state == stHeld {
			w.held.remove(id)
			s.state = stReleasing
			s.gen++
			grants = append(grants, s.g)
		}
	}
	id := ss.id
	w.mu.Unlock()
	for _, g := range grants {
		w.log.ReleasedAt(g, now)
	}
	err := w.rq.Send(w.sb.SessionClose(id), w.cfg.Timeout, func(reply *nats.Msg, at time.Time, err error) {
		res := w.sb.ParseSession(streams.OpSessionClose, reply, err)
		code := res.Code
		if code == CodeOK && !res.Released {
			code = CodeReleasedFalse // the session had ended already
		}
		r.Record(at.Sub(intended), code)
		w.released.Add(int64(res.Leases))
		w.mu.Lock()
		defer w.mu.Unlock()
		w.closed(si, res.Code == CodeOK, at)
	})
	if err != nil {
		r.Fail(SendCode(err))
		for _, g := range grants {
			w.log.ReleasedAt(g, time.Time{})
		}
		w.mu.Lock()
		w.closed(si, false, time.Now())
		w.mu.Unlock()
	}
}

// closed frees the resources of session si once its close was answered
// at (ok), or, when the outcome is unknown, once the session must have
// expired. The caller holds w.mu.
func (w *Workload) closed(si int32, ok bool, at time.Time) {
	ss := &w.sessions[si]
	ss.state = ssClosed
	for id := range ss.members {
		if ok {
			w.toFree(id)
		} else {
			w.toQuarantineUntil(id, at.Add(w.cfg.TTL+5*time.Second))
		}
	}
}
