package faulttest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jetlock/jetlock/client"
)

// goMargin is the Go clients' safety margin: their lease deadline is
// Expires() + goMargin = send time of the last acknowledged request + TTL.
const goMargin = 100 * time.Millisecond

// goStats counts what the Go clients saw.
type goStats struct {
	grants, lostAtGrant, abandoned atomic.Int64
}

// runGo is a Go-client actor: it waits in the queue of a hot resource
// (sometimes giving up mid-wait, which makes the client cancel), holds the
// lease while writing with its token, and releases it.
func (a *actor) runGo(ctx context.Context) {
	w, h := a.w, a.w.Hist
	cl, err := client.New(a.c.NC, client.WithRequestTimeout(2500*time.Millisecond),
		client.WithSafetyMargin(goMargin), client.WithRetries(3))
	if err != nil {
		panic(err)
	}
	for ctx.Err() == nil && w.next() {
		a.n++
		res, rid := fmt.Sprintf("%s/hot/%d", w.Prefix, a.rng.IntN(w.Hot)), fmt.Sprintf("%s-g%d-%d", w.Prefix, a.id, a.n)
		actx, cancel := context.WithTimeout(ctx, a.between(time.Second, 6*time.Second))
		giveUp := time.AfterFunc(a.between(100*time.Millisecond, 2*time.Second), cancel)
		if a.rng.Float64() >= 0.3 {
			giveUp.Stop()
		}
		op := h.Begin(Op{Client: a.id, Kind: KAcquire, Resource: res, RequestID: rid, TTL: w.TTL, Note: "go client"})
		l, err := cl.Acquire(actx, res, client.TTL(w.TTL), client.RequestID(rid), client.Owner(ownerOf(a.id)))
		giveUp.Stop()
		cancel()
		h.End(op, goResult(err), func(o *Op) {
			if err != nil {
				o.Code = err.Error()
				return
			}
			o.LeaseID, o.Token, o.Deadline = l.ID(), l.Token(), h.At(l.Expires())+goMargin
		})
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				w.goStats.abandoned.Add(1)
			}
			sleepCtx(ctx, a.between(10*time.Millisecond, 100*time.Millisecond))
			continue
		}
		w.goStats.grants.Add(1)
		time.Sleep(20 * time.Millisecond)
		if l.Context().Err() != nil {
			w.goStats.lostAtGrant.Add(1)
		}
		a.holdGo(ctx, res, l)
	}
}

func goResult(err error) Result {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, client.ErrLocked), errors.Is(err, client.ErrLeaseLost), errors.Is(err, client.ErrTooManyWaiters):
		return Fail
	}
	return Unknown // unavailable, or ctx ended (the client then cancelled)
}

func (a *actor) holdGo(ctx context.Context, res string, l *client.Lease) {
	w, h := a.w, a.w.Hist
	until := time.Now().Add(a.between(0, 2*w.TTL))
	expires := l.Expires()
	for ctx.Err() == nil && l.Context().Err() == nil && time.Now().Before(until) {
		if e := l.Expires(); e.After(expires) {
			expires = e
		}
		if time.Now().Before(expires.Add(-100 * time.Millisecond)) {
			w.Reg.Write(a.id, res, l.Token(), "go client")
		}
		sleepCtx(l.Context(), a.between(w.TTL/8, w.TTL/4))
	}
	if e := l.Expires(); e.After(expires) {
		expires = e
	}
	held := h.Begin(Op{Client: a.id, Kind: KHeld, Resource: res, LeaseID: l.ID(), Note: "go client's own deadline"})
	h.End(held, OK, func(o *Op) { o.Deadline = h.At(expires) + goMargin })
	// Release's answer does not say whether the lease was still held.
	rel := h.Begin(Op{Client: a.id, Kind: KRelease, Resource: res, LeaseID: l.ID(), Note: "go client"})
	rctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	err := l.Release(rctx)
	cancel()
	h.End(rel, Unknown, func(o *Op) {
		o.Code = "go client release"
		if err != nil {
			o.Code += ": " + err.Error()
		}
	})
}
