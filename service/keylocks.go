package service

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
)

// stripes serialise this instance's work on one key, so that its own
// requests do not race each other's compare-and-set. Instances still race
// each other; compare-and-set decides those races.
//
// A request waits for its key's stripe no longer than its deadline, and at
// most maxWaiting requests wait for one stripe: beyond them a request is
// refused at once. So a flood on one hot key holds a bounded number of the
// in-flight places, and requests for other keys keep being served.
type stripes struct {
	seed       maphash.Seed
	maxWaiting int32
	s          [stripeCount]stripe
}

const stripeCount = 8192

type stripe struct {
	ch      chan struct{} // holds a token while the stripe is locked
	waiting atomic.Int32
}

// errBusy is returned when too many requests already wait for a key.
var errBusy = errors.New("resource busy")

func newStripes(maxWaiting int) *stripes {
	p := &stripes{seed: maphash.MakeSeed(), maxWaiting: int32(maxWaiting)}
	for i := range p.s {
		p.s[i].ch = make(chan struct{}, 1)
	}
	return p
}

// lock locks key's stripe, waiting until ctx ends. It returns the stripe
// to unlock, or an error wrapping errUnavailable: errBusy when maxWaiting
// requests already wait for it, or ctx's error.
func (p *stripes) lock(ctx context.Context, key string) (*stripe, error) {
	st := p.of(key)
	select {
	case st.ch <- struct{}{}:
		return st, nil
	default:
	}
	if st.waiting.Add(1) > p.maxWaiting {
		st.waiting.Add(-1)
		return nil, fmt.Errorf("%w: %w: %d requests already wait for it; retry with backoff", errUnavailable, errBusy, p.maxWaiting)
	}
	defer st.waiting.Add(-1)
	select {
	case st.ch <- struct{}{}:
		return st, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for the resource's other requests: %w", errUnavailable, ctx.Err())
	}
}

func (st *stripe) unlock() { <-st.ch }

// of returns key's stripe.
func (p *stripes) of(key string) *stripe { return &p.s[maphash.String(p.seed, key)%stripeCount] }
