package load

import (
	"cmp"
	"slices"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// Lock sets and semaphores on the service (see docs/protocol.md, "Lock
// sets" and "Semaphores"): requests, and the parts of their answers that
// Result does not carry.

// AcquireSet builds an acquire of the lock set resources (all or none),
// waiting up to wait in their queues.
func (b *Service) AcquireSet(resources []string, reqID, owner string, ttl, wait time.Duration) *nats.Msg {
	return b.Msg(streams.OpAcquire, &streams.AcquireRequest{Resources: resources, RequestID: reqID, Owner: cmp.Or(owner, b.Owner),
		TTLms: ttl.Milliseconds(), WaitMs: wait.Milliseconds()})
}

// ReleaseSet builds the release of the lease of the lock set resources.
func (b *Service) ReleaseSet(resources []string, lease string) *nats.Msg {
	return b.Msg(streams.OpRelease, &streams.ReleaseRequest{Resources: resources, LeaseID: lease})
}

// CancelSet builds the cancel of the acquire reqID of owner (the
// Service's when empty) of the lock set resources.
func (b *Service) CancelSet(resources []string, reqID, owner string) *nats.Msg {
	return b.Msg(streams.OpCancel, &streams.CancelRequest{Resources: resources, RequestID: reqID, Owner: cmp.Or(owner, b.Owner)})
}

// AcquirePermit builds an acquire of one of the limit permits of the
// semaphore sem, waiting up to wait in its queue.
func (b *Service) AcquirePermit(sem, reqID, owner string, limit int, ttl, wait time.Duration) *nats.Msg {
	return b.Msg(streams.OpAcquire, &streams.AcquireRequest{Resource: sem, RequestID: reqID, Owner: cmp.Or(owner, b.Owner),
		Limit: limit, TTLms: ttl.Milliseconds(), WaitMs: wait.Milliseconds()})
}

// ReleasePermit builds the release of permit of the semaphore sem.
func (b *Service) ReleasePermit(sem string, permit int, lease string) *nats.Msg {
	return b.Msg(streams.OpRelease, &streams.ReleaseRequest{Resource: sem, Permit: permit, LeaseID: lease})
}

// CancelPermit builds the cancel of the acquire reqID of owner (the
// Service's when empty) of a permit of the semaphore sem of limit permits.
func (b *Service) CancelPermit(sem string, limit int, reqID, owner string) *nats.Msg {
	return b.Msg(streams.OpCancel, &streams.CancelRequest{Resource: sem, Limit: limit, RequestID: reqID, Owner: cmp.Or(owner, b.Owner)})
}

// GrantReply is a grant's answer in full: the TTL granted (shorter than
// asked after waiting: the service's hand-over TTL), the permit of a
// semaphore, the members of a lock set with a token each.
type GrantReply struct {
	streams.LeaseResponse
	Resources []streams.SetMember `json:"resources"`
}

// TTL returns the TTL granted.
func (g GrantReply) TTL() time.Duration { return time.Duration(g.TTLms) * time.Millisecond }

// ParseGrant turns the answer to an acquire of a set or a permit (or its
// absence) into a result and the grant's answer. A grant without a
// lease_id is CodeInternal (outcome unknown).
func (b *Service) ParseGrant(m *nats.Msg, err error) (Result, GrantReply) {
	var g GrantReply
	res := b.Parse(streams.OpAcquire, m, err)
	if res.Code != CodeOK {
		return res, g
	}
	if err := jsonv2.Unmarshal(m.Data, &g); err != nil || g.LeaseID == "" {
		return Result{Code: streams.CodeInternal, Unknown: true}, g
	}
	return res, g
}

// RetryDelay is how long to wait before sending again a request whose
// outcome is unknown: backoff, or the answer's retry_after_ms when longer
// (at most a second more), as the workload waits.
func RetryDelay(backoff, retryAfter time.Duration) time.Duration {
	return retryDelay(backoff, retryAfter)
}

// Span is a stretch of time during which the bench knew a lease held: from
// its grant's reply to its release's send. The service held it at least
// that long (it granted before replying and ends it after the release
// arrives), so spans that overlap were held at once.
type Span struct{ From, To time.Time }

// MaxOverlap returns the largest number of spans that overlap at one
// moment. Spans that only touch (one ends when the next begins) do not
// overlap; empty spans count for nothing.
func MaxOverlap(spans []Span) int {
	type edge struct {
		t     time.Time
		delta int
	}
	edges := make([]edge, 0, 2*len(spans))
	for _, s := range spans {
		if s.To.After(s.From) {
			edges = append(edges, edge{s.From, 1}, edge{s.To, -1})
		}
	}
	// At equal times, ends before beginnings.
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(a.t.Compare(b.t), cmp.Compare(a.delta, b.delta)) })
	n, most := 0, 0
	for _, e := range edges {
		n += e.delta
		most = max(most, n)
	}
	return most
}
