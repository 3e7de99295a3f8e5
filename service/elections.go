package service

import (
	"encoding/json"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// Elections. An election is a lock whose lease carries a value (acquire
// and renew with "value"): the leader is the lease's holder, Proclaim is a
// renewal with a new value, and a campaign is a waiting acquire. Observers
// that may not read the bucket follow the leader through events on
// streams.EventSubject: every instance publishes an event for each change
// it takes in of a lease with a value, its own writes and those its
// watcher delivers, so an event is lost only if every instance missed the
// change; observers order events by the revision they carry and drop
// repeats, and read the status after a gap (events are core NATS: at most
// once each).

// electionEvents returns the events of the change of lease key key from
// the record old (nil: not held), written at oldRev, to e.
func electionEvents(key string, old *streams.Record, oldRev uint64, e entry) []streams.ElectionEvent {
	var cur *streams.Record
	if e.held() {
		cur = e.rec
	}
	if (old == nil || old.Value == "") && (cur == nil || cur.Value == "") {
		return nil
	}
	res := decodedResource(resourceOf(key))
	var evs []streams.ElectionEvent
	switch {
	case old != nil && cur != nil && old.LeaseID == cur.LeaseID:
		if old.Value != cur.Value {
			evs = append(evs, streams.ElectionEvent{Resource: res, Event: streams.EventProclaimed, Token: cur.TokenAt(e.rev), Value: cur.Value, Revision: e.rev})
		}
		return evs
	case old != nil && old.Value != "":
		evs = append(evs, streams.ElectionEvent{Resource: res, Event: streams.EventEnded, Token: old.TokenAt(oldRev), Value: old.Value, Revision: e.rev})
	}
	if cur != nil && cur.Value != "" {
		evs = append(evs, streams.ElectionEvent{Resource: res, Event: streams.EventElected, Token: cur.TokenAt(e.rev), Value: cur.Value, Revision: e.rev})
	}
	return evs
}

// announcer publishes election events on nc under prefix.
func announcer(nc *nats.Conn, prefix string) func([]streams.ElectionEvent) {
	return func(evs []streams.ElectionEvent) {
		for _, ev := range evs {
			body, err := json.Marshal(ev)
			if err == nil {
				// Best effort, like every core NATS message: observers
				// resync on a gap.
				_ = nc.Publish(streams.EventSubject(prefix, ev.Resource), body)
			}
		}
	}
}
