package service

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
)

// keyLocks serialise this instance's work on one key, so that its own
// requests do not race each other's compare-and-set. Instances still race
// each other; compare-and-set decides those races.
//
// The locks are per key, not per stripe of keys: a key's lock exists while
// a request holds or waits for it, and the count of those waiting is the
// key's own. A request waits for its key no longer than its deadline, and
// at most maxWaiting requests wait for one key: beyond them a request is
// refused at once. So a flood on one hot key holds a bounded number of the
// in-flight places, and never refuses or delays a request for another key
// (a renewal of another tenant's lease included).
type keyLocks struct {
	seed       maphash.Seed
	maxWaiting int
	shards     [keyLockShards]keyShard
}

// keyLockShards spreads the map of held keys over several mutexes; a
// shard's mutex is held only to find or drop a key's lock, never while
// waiting for one.
const keyLockShards = 64

type keyShard struct {
	mu   sync.Mutex
	held map[string]*keyLock
	free []*keyLock // unused locks, for reuse
}

// keyLock is the lock of one key while anyone holds or waits for it.
type keyLock struct {
	ch    chan struct{} // holds a token while the key is locked
	key   string
	shard *keyShard
	users int // holder and waiters; guarded by shard.mu
}

// errBusy is returned when too many requests already wait for a key.
var errBusy = errors.New("resource busy")

func newKeyLocks(maxWaiting int) *keyLocks {
	p := &keyLocks{seed: maphash.MakeSeed(), maxWaiting: maxWaiting}
	for i := range p.shards {
		p.shards[i].held = make(map[string]*keyLock)
	}
	return p
}

// lock locks key, waiting until ctx ends. It returns the lock to unlock,
// or an error wrapping errUnavailable: errBusy when maxWaiting requests
// already wait for the key, or ctx's error.
func (p *keyLocks) lock(ctx context.Context, key string) (*keyLock, error) {
	sh := &p.shards[maphash.String(p.seed, key)%keyLockShards]
	sh.mu.Lock()
	kl := sh.held[key]
	if kl == nil {
		if n := len(sh.free); n > 0 {
			kl, sh.free = sh.free[n-1], sh.free[:n-1]
		} else {
			kl = &keyLock{ch: make(chan struct{}, 1), shard: sh}
		}
		kl.key = key
		sh.held[key] = kl
	} else if kl.users > p.maxWaiting { // a holder and maxWaiting waiters
		sh.mu.Unlock()
		return nil, fmt.Errorf("%w: %w: %d requests already wait for it; retry with backoff", errUnavailable, errBusy, p.maxWaiting)
	}
	kl.users++
	sh.mu.Unlock()
	select {
	case kl.ch <- struct{}{}:
		return kl, nil
	default:
	}
	select {
	case kl.ch <- struct{}{}:
		return kl, nil
	case <-ctx.Done():
		kl.drop()
		return nil, fmt.Errorf("%w: waiting for the resource's other requests: %w", errUnavailable, ctx.Err())
	}
}

// unlock unlocks the key.
func (kl *keyLock) unlock() {
	<-kl.ch
	kl.drop()
}

// drop ends one holder's or waiter's use of the lock; the last one's
// frees it for reuse.
func (kl *keyLock) drop() {
	sh := kl.shard
	sh.mu.Lock()
	if kl.users--; kl.users == 0 {
		delete(sh.held, kl.key)
		kl.key = ""
		if len(sh.free) < 64 {
			sh.free = append(sh.free, kl)
		}
	}
	sh.mu.Unlock()
}

// waiting returns the number of requests waiting for key (not the holder).
func (p *keyLocks) waiting(key string) int {
	sh := &p.shards[maphash.String(p.seed, key)%keyLockShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if kl := sh.held[key]; kl != nil {
		return kl.users - 1
	}
	return 0
}
