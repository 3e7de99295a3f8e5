package streams

import (
	"slices"
	"strconv"
)

// Lock sets. An acquire, renew, release or cancel may name several
// resources ("resources") instead of one ("resource"): the lease is granted
// on all of them at once, in one atomic commit, or on none; it is renewed
// and released whole. Each resource keeps its own fencing token (the
// revision of its key's grant), so that each resource's fence works on its
// own.

// Bounds of a lock set. MaxSetSize is the largest any deployment may allow:
// a set's grant after waiting is one atomic batch of two writes per
// resource (the grant and the removal of the waiter's place) plus a
// session check, and JetStream refuses atomic batches of more than 1,000
// messages by default. The service's own cap (lockd --max-set-size) is at
// most this; DefaultSetSize is its default.
const (
	MinSetSize     = 2
	MaxSetSize     = 256
	DefaultSetSize = 64
)

// SetMember is one resource of a set lease and its fencing token.
type SetMember struct {
	Resource string `json:"resource"`
	Token    uint64 `json:"token"`
}

// SetLeaseResponse answers a successful acquire or renew of a set: one
// lease id and TTL for the whole set, a token per resource.
type SetLeaseResponse struct {
	LeaseID   string      `json:"lease_id"`
	TTLms     int64       `json:"ttl_ms"`
	ExpiresAt string      `json:"expires_at"`
	HoldUntil string      `json:"hold_until,omitempty"`
	Resources []SetMember `json:"resources"`
}

// SetReleaseResponse answers the release of a set. Released is false when
// the lease was already gone (from every resource: a set ends whole).
type SetReleaseResponse struct {
	Resources []string `json:"resources"`
	Released  bool     `json:"released"`
}

// SetCancelResponse answers the cancel of a set's acquire.
type SetCancelResponse struct {
	Resources []string `json:"resources"`
	Cancelled bool     `json:"cancelled"`
}

// NormalizeSet checks a set's resource names (between MinSetSize and max,
// each a valid resource, no name twice) and returns them sorted, in a new
// slice: the order every decision and every write of the set uses.
func NormalizeSet(resources []string, max int) ([]string, error) {
	if len(resources) < MinSetSize || len(resources) > max {
		return nil, invalidf("resources names %d resources: a set has %d to %d", len(resources), MinSetSize, max)
	}
	for i, r := range resources {
		if err := ValidateResource(r); err != nil {
			return nil, invalidf("resources[%d]: %w", i, err)
		}
	}
	set := slices.Clone(resources)
	slices.Sort(set)
	for i := 1; i < len(set); i++ {
		if set[i] == set[i-1] {
			return nil, invalidf("resources names %q twice", set[i])
		}
	}
	return set, nil
}

// oneOf checks that a request names a resource or a set, not both.
func oneOf(resource string, resources []string) error {
	switch {
	case resource != "" && resources != nil:
		return invalidf("resource and resources together: name one resource, or a set")
	case resources != nil:
		_, err := NormalizeSet(resources, MaxSetSize)
		return err
	}
	return ValidateResource(resource)
}

// AppendJSON appends r encoded as JSON to b.
func (r *SetLeaseResponse) AppendJSON(b []byte) []byte {
	b = appendField(append(b, '{'), `"lease_id":`, r.LeaseID)
	b = strconv.AppendInt(append(b, `,"ttl_ms":`...), r.TTLms, 10)
	b = appendField(b, `,"expires_at":`, r.ExpiresAt)
	if r.HoldUntil != "" {
		b = appendField(b, `,"hold_until":`, r.HoldUntil)
	}
	b = append(b, `,"resources":[`...)
	for i, m := range r.Resources {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendField(b, `{"resource":`, m.Resource)
		b = strconv.AppendUint(append(b, `,"token":`...), m.Token, 10)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}
