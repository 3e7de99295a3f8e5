package service

import "github.com/jetlock/jetlock/streams"

// What the tracker knows of lock sets: the lease keys each set's lease
// holds, by the lease id they share, so that a set is ended whole (its
// expiry, its revoke) by one atomic batch of its keys.

// setIndex is what the tracker knows of lock sets.
type setIndex struct {
	// t is the tracker whose mu guards the index.
	t *tracker
	// setLeases indexes the lease keys of each lock set's lease, by its
	// lease id.
	setLeases map[string]map[string]struct{}
}

// indexSetMember moves the lease key key in the set index from the set
// lease of old (if any) to that of rec (if any). The caller holds t.mu.
func (ix *setIndex) indexSetMember(key string, old, rec *streams.Record) {
	var from, to string
	if old != nil && old.Set != "" {
		from = old.LeaseID
	}
	if rec != nil && rec.Set != "" {
		to = rec.LeaseID
	}
	if from == to {
		return
	}
	if m := ix.setLeases[from]; from != "" && m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(ix.setLeases, from)
		}
	}
	if to == "" {
		return
	}
	m := ix.setLeases[to]
	if m == nil {
		m = make(map[string]struct{}, rec.SetSize)
		ix.setLeases[to] = m
	}
	m[key] = struct{}{}
}

// setKeys returns the lease keys that hold the set lease leaseID, as the
// tracker knows them.
func (ix *setIndex) setKeys(leaseID string) []string {
	ix.t.mu.Lock()
	defer ix.t.mu.Unlock()
	keys := make([]string, 0, len(ix.setLeases[leaseID]))
	for k := range ix.setLeases[leaseID] {
		keys = append(keys, k)
	}
	return keys
}
