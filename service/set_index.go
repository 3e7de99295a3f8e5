package service

import "github.com/jetlock/jetlock/streams"

// What the tracker knows of lock sets: the lease keys each set's lease
// holds, by the lease id they share, so that a set is ended whole (its
// expiry, its revoke) by one atomic batch of its keys.

// indexSetMember moves the lease key key in the set index from the set
// lease of old (if any) to that of rec (if any). The caller holds t.mu.
func (t *tracker) indexSetMember(key string, old, rec *streams.Record) {
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
	if m := t.setLeases[from]; from != "" && m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(t.setLeases, from)
		}
	}
	if to == "" {
		return
	}
	m := t.setLeases[to]
	if m == nil {
		m = make(map[string]struct{}, rec.SetSize)
		t.setLeases[to] = m
	}
	m[key] = struct{}{}
}

// setKeys returns the lease keys that hold the set lease leaseID, as the
// tracker knows them.
func (t *tracker) setKeys(leaseID string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.setLeases[leaseID]))
	for k := range t.setLeases[leaseID] {
		keys = append(keys, k)
	}
	return keys
}
