package fence

import (
	"context"
	"sync"
	"sync/atomic"
)

// Memory is a Guard that keeps the highest accepted tokens in process
// memory, for a resource that lives in one process (a file, a device, an
// in-memory table). Its state is lost when the process exits; a restarted
// resource must start from state that is at least as new as the data it
// protects, which is only true if that data is gone too.
//
// Memory keeps one small entry per resource ever seen and never forgets
// one. Its methods are safe for concurrent use. The zero value is not
// usable; call NewMemory.
type Memory struct {
	mu       sync.Mutex
	entries  map[string]*memEntry
	rejected atomic.Uint64
}

type memEntry struct {
	// sem holds a value while a Check or Do of this resource runs: a mutex
	// that a waiter can give up on when its context ends.
	sem chan struct{}
	// highest is written only while holding sem; atomic so that Highest
	// can read it without waiting for a running Do.
	highest atomic.Uint64
}

// NewMemory returns an empty in-memory guard.
func NewMemory() *Memory {
	return &Memory{entries: make(map[string]*memEntry)}
}

func (m *Memory) entry(resource string) *memEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[resource]
	if !ok {
		e = &memEntry{sem: make(chan struct{}, 1)}
		m.entries[resource] = e
	}
	return e
}

// Check implements Guard. It waits while a Do of the same resource runs;
// it never returns a store error.
func (m *Memory) Check(ctx context.Context, resource string, token uint64) error {
	return m.Do(ctx, resource, token, nil)
}

// Do checks token like Check and, if it is accepted, runs fn before any
// other Check or Do of the same resource can proceed, so that no newer
// token can be accepted while fn runs. This makes "check, then write" one
// atomic step. Do returns fn's error unchanged; the token stays recorded
// even if fn fails, because a token that was handed out makes every
// smaller one stale whether or not its holder's work succeeded.
//
// fn must not call Check or Do on the same resource (it would wait for
// itself forever). fn may be nil. If ctx ends while Do waits for another
// call on the resource, Do returns ctx.Err() without running fn; once fn
// runs, ending ctx is up to fn.
func (m *Memory) Do(ctx context.Context, resource string, token uint64, fn func() error) error {
	if err := validate(resource, token); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	e := m.entry(resource)
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-e.sem }()

	if h := e.highest.Load(); token < h {
		m.rejected.Add(1)
		return &StaleTokenError{Resource: resource, Token: token, Highest: h}
	}
	e.highest.Store(token)
	if fn == nil {
		return nil
	}
	return fn()
}

// Highest implements Guard. It does not wait for a running Do and never
// returns an error.
func (m *Memory) Highest(_ context.Context, resource string) (uint64, error) {
	m.mu.Lock()
	e, ok := m.entries[resource]
	m.mu.Unlock()
	if !ok {
		return 0, nil
	}
	return e.highest.Load(), nil
}

// Rejected implements Guard.
func (m *Memory) Rejected() uint64 { return m.rejected.Load() }
