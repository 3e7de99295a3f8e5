package client

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Lock sets. AcquireAll grants one lease on several resources at once, in
// one atomic commit at the service, or on none of them: never half a set.
// The set has one lease id and one TTL, is renewed and released whole, and
// is lost whole; each resource keeps a fencing token of its own
// (Lease.TokenOf), since each resource's fence compares the tokens of that
// resource only.
//
// A waiting AcquireAll takes its place in the queue of every resource of
// the set at once, in FIFO order with the waiters for single resources, so
// that two callers acquiring overlapping sets in any order cannot deadlock
// each other: there is no "hold some, wait for the rest".

// AcquireAll acquires every resource of resources as one lock set, waiting
// while any of them is held, as Acquire does for one resource: until the
// whole set is granted, ctx ends, or the Wait option's bound passes (then
// it returns a *HeldError, matching ErrLocked, whose Holders name every
// held resource of the set). When ctx ends first, AcquireAll cancels the
// request so that it leaves nothing granted or queued, and returns
// ctx.Err().
//
// resources must name 2 to 64 resources (WithMaxSetSize changes the 64, up
// to the service's own cap, lockd --max-set-size), each a valid resource
// name, none twice, in any order. Otherwise AcquireAll sends nothing and
// returns an error matching ErrInvalidOption (and ErrInvalidRequest, as an
// invalid name does for Acquire). Acquire one resource with Acquire.
//
// The options are Acquire's: TTL, Owner, RequestID, MaxHold and Wait apply
// to the set as a whole. The returned Lease renews and releases the whole
// set and is lost as a whole; its tokens are per resource (TokenOf,
// Resources); its Token is 0 and its Resource "".
func (c *Client) AcquireAll(ctx context.Context, resources []string, opts ...AcquireOption) (*Lease, error) {
	ao, err := c.setAcquireOptions(resources, opts)
	if err != nil {
		return nil, err
	}
	return c.acquire(ctx, "", ao)
}

// TryAcquireAll makes one attempt to acquire every resource of resources
// as one lock set and returns at once: the lease of the whole set, or a
// *HeldError (matching ErrLocked) naming every held resource of the set,
// in which case nothing was granted: the free resources stay free. An
// attempt whose outcome is unknown is retried and, failing that, cancelled
// as TryAcquire's is. resources and options are as for AcquireAll.
func (c *Client) TryAcquireAll(ctx context.Context, resources []string, opts ...AcquireOption) (*Lease, error) {
	ao, err := c.setAcquireOptions(resources, opts)
	if err != nil {
		return nil, err
	}
	return c.acquireOnce(ctx, "", ao, 0)
}

// AcquireAll acquires resources as one lock set for the session, waiting
// as Client.AcquireAll does; the wait also ends when the session is lost
// or closed. The set's lease lives as long as the session, like the leases
// of Session.Acquire: it does not renew itself, and it is lost when the
// session is. The TTL option is refused (ErrInvalidOption).
func (s *Session) AcquireAll(ctx context.Context, resources []string, opts ...AcquireOption) (*Lease, error) {
	read := func() (acquireOptions, error) { return s.c.setAcquireOptions(resources, opts) }
	return s.acquire(ctx, read, func(ctx context.Context, ao acquireOptions) (*Lease, error) {
		return s.c.acquire(ctx, "", ao)
	})
}

// TryAcquireAll makes one attempt to acquire resources as one lock set for
// the session, as Client.TryAcquireAll does; the lease is as AcquireAll's.
func (s *Session) TryAcquireAll(ctx context.Context, resources []string, opts ...AcquireOption) (*Lease, error) {
	read := func() (acquireOptions, error) { return s.c.setAcquireOptions(resources, opts) }
	return s.acquire(ctx, read, func(ctx context.Context, ao acquireOptions) (*Lease, error) {
		return s.c.acquireOnce(ctx, "", ao, 0)
	})
}

// WithMaxSetSize sets the largest lock set AcquireAll (and RenewAll,
// ReleaseAll) accept before sending anything: n resources, from 2 up to
// streams.MaxSetSize (256). The default is 64, the service's default cap
// (lockd --max-set-size); raise it only for a service configured with a
// larger cap, which refuses larger sets itself with ErrInvalidRequest.
func WithMaxSetSize(n int) Option {
	return func(o *options) error {
		if n < streams.MinSetSize || n > streams.MaxSetSize {
			return fmt.Errorf("%w: max set size %d outside [%d, %d]", ErrInvalidOption, n, streams.MinSetSize, streams.MaxSetSize)
		}
		o.maxSetSize = n
		return nil
	}
}

// setAcquireOptions checks a lock set's names and reads the options of
// its acquire.
func (c *Client) setAcquireOptions(resources []string, opts []AcquireOption) (acquireOptions, error) {
	set, err := c.normalizeSet(resources)
	if err != nil {
		return acquireOptions{}, err
	}
	ao, err := readAcquireOptions(opts)
	if err != nil {
		return ao, err
	}
	ao.set = set
	return ao, nil
}

// normalizeSet checks the names of a lock set (2 to the client's maximum,
// each valid, none twice) and returns them sorted, in a new slice. Its
// error matches ErrInvalidOption and ErrInvalidRequest.
func (c *Client) normalizeSet(resources []string) ([]string, error) {
	if n := len(resources); n < streams.MinSetSize || n > c.opts.maxSetSize {
		hint := ""
		if n == 1 {
			hint = " (acquire one resource with Acquire)"
		} else if n > c.opts.maxSetSize {
			hint = " (see WithMaxSetSize)"
		}
		noun := "resources"
		if n == 1 {
			noun = "resource"
		}
		return nil, setError(fmt.Sprintf("%d %s: a lock set has %d to %d%s", n, noun, streams.MinSetSize, c.opts.maxSetSize, hint), nil)
	}
	for i, r := range resources {
		if err := streams.ValidateResource(r); err != nil {
			return nil, setError(fmt.Sprintf("resources[%d] %q: %s", i, r, trimWords(err.Error(), ErrInvalidRequest)), err)
		}
	}
	set := slices.Clone(resources)
	slices.Sort(set)
	for i := 1; i < len(set); i++ {
		if set[i] == set[i-1] {
			return nil, setError(fmt.Sprintf("%q named twice", set[i]), nil)
		}
	}
	return set, nil
}

// setError is the error of a lock set's names, said by detail, caused by
// cause (a contract validator's error, or nil): it matches
// ErrInvalidOption and, like an invalid name given to Acquire,
// ErrInvalidRequest.
func setError(detail string, cause error) error {
	inner := &wrapped{sentinel: ErrInvalidRequest, cause: cause, text: detail}
	return &wrapped{sentinel: ErrInvalidOption, cause: inner, text: ErrInvalidOption.Error() + ": lock set: " + detail}
}

// grant is the reply to an acquire or a renew: a lease's
// (streams.LeaseResponse), or a lock set's (streams.SetLeaseResponse),
// whose tokens are in Resources; the fields they share decode into the
// embedded LeaseResponse.
type grant struct {
	streams.LeaseResponse
	Resources []streams.SetMember `json:"resources"`
}

// setMembers returns the members of the lock set set (sorted) with the
// tokens g grants them, or ErrInternal when g does not grant exactly set.
func setMembers(set []string, g *grant) ([]streams.SetMember, error) {
	if g.LeaseID == "" {
		return nil, fmt.Errorf("%w: lock set: bad reply: no lease_id", ErrInternal)
	}
	tokens := make(map[string]uint64, len(g.Resources))
	for _, m := range g.Resources {
		tokens[m.Resource] = m.Token
	}
	members := make([]streams.SetMember, len(set))
	for i, r := range set {
		t := tokens[r]
		if t == 0 {
			return nil, fmt.Errorf("%w: lock set: bad reply: no token for %q", ErrInternal, r)
		}
		members[i] = streams.SetMember{Resource: r, Token: t}
	}
	if len(tokens) != len(set) {
		return nil, fmt.Errorf("%w: lock set: bad reply: %d resources for a set of %d", ErrInternal, len(tokens), len(set))
	}
	return members, nil
}

// sendRenewSet sends one renew request for the whole lock set and checks
// that the reply renews it, with the tokens of the grant.
func (l *Lease) sendRenewSet(ctx context.Context, resp *streams.LeaseResponse) error {
	names := l.setNames()
	var g grant
	req := streams.RenewRequest{Resources: names, LeaseID: l.id, TTLms: l.want.Milliseconds()}
	if err := l.c.call(ctx, streams.OpRenew, &req, &g, 0); err != nil {
		return err
	}
	members, err := setMembers(names, &g)
	if err != nil {
		return err
	}
	for i, m := range members {
		if m.Token != l.members[i].Token {
			return fmt.Errorf("%w: lock set: renewal's reply gives %s token %d, granted %d", ErrInternal, m.Resource, m.Token, l.members[i].Token)
		}
	}
	*resp = g.LeaseResponse
	return nil
}

// setNames returns the resources of a lock set's lease, sorted; nil for a
// lease of one resource.
func (l *Lease) setNames() []string {
	if l.members == nil {
		return nil
	}
	names := make([]string, len(l.members))
	for i, m := range l.members {
		names[i] = m.Resource
	}
	return names
}

// Resources returns the resources the lease holds, sorted: every resource
// of a lock set (AcquireAll), or the one resource of a lease acquired with
// Acquire. The slice is the caller's.
func (l *Lease) Resources() []string {
	if l.members == nil {
		return []string{l.resource}
	}
	return l.setNames()
}

// TokenOf returns the fencing token of resource, and whether the lease
// holds resource: for a lock set, the token of that member (each resource
// of a set has its own, strictly larger than every earlier grant of that
// resource); for a lease of one resource, Token. Pass it with every write
// to that resource (package fence). It does not change on renewal.
func (l *Lease) TokenOf(resource string) (uint64, bool) {
	if l.members == nil {
		if resource != l.resource {
			return 0, false
		}
		return l.token, true
	}
	i, ok := slices.BinarySearchFunc(l.members, resource, func(m streams.SetMember, r string) int {
		return strings.Compare(m.Resource, r)
	})
	if !ok {
		return 0, false
	}
	return l.members[i].Token, true
}

// about completes a HeldError decoded from a "locked" reply with what was
// asked: resource, or the lock set set.
func (e *HeldError) about(resource string, set []string) {
	if set == nil {
		e.Resource = resource
		if len(e.Holders) == 0 {
			e.Holders = []Holder{{Owner: e.Owner, Token: e.Token, ExpiresAt: e.ExpiresAt}}
		}
		for i := range e.Holders {
			if e.Holders[i].Resource == "" {
				e.Holders[i].Resource = resource
			}
		}
		return
	}
	e.Set = set
	slices.SortFunc(e.Holders, func(a, b Holder) int { return strings.Compare(a.Resource, b.Resource) })
	if len(e.Holders) > 0 {
		h := e.Holders[0]
		e.Resource, e.Owner, e.Token, e.ExpiresAt = h.Resource, h.Owner, h.Token, h.ExpiresAt
	}
}

// RenewAll renews the lease leaseID of the lock set resources once, all of
// it, asking for ttl (zero: the service's default), and returns the
// service's reply: a token per resource. It is Renew for a set whose
// holder keeps the lease id between processes (jetlock acquire with
// several resources); a Lease renews itself. A set that is no longer
// current (any of its resources) returns an error wrapping ErrLeaseLost,
// and nothing changed. resources must be exactly the set's: naming part of
// it, or more, returns an error wrapping ErrInvalidRequest, and the set
// stays held. resources are checked as AcquireAll's are.
func (c *Client) RenewAll(ctx context.Context, resources []string, leaseID string, ttl time.Duration) (*streams.SetLeaseResponse, error) {
	if ttl < 0 {
		return nil, fmt.Errorf("%w: ttl %v", ErrInvalidOption, ttl)
	}
	set, err := c.normalizeSet(resources)
	if err != nil {
		return nil, err
	}
	req := streams.RenewRequest{Resources: set, LeaseID: leaseID, TTLms: ttl.Milliseconds()}
	if err := req.Validate(); err != nil {
		return nil, wrapErr(ErrInvalidRequest, err)
	}
	var resp streams.SetLeaseResponse
	err = c.retry(ctx, func() error { return c.call(ctx, streams.OpRenew, &req, &resp, 0) })
	if err != nil {
		return nil, err
	}
	return &resp, nil
}

// ReleaseAll releases the lease leaseID of the lock set resources, all of
// it, and reports whether it was still held (false: it had ended already,
// which is not an error). It is Release for a set; like Lease.Release it
// is idempotent and never ends a newer lease. Naming part of the set, or
// more, returns an error wrapping ErrInvalidRequest, and the set stays
// held. resources are checked as AcquireAll's are.
func (c *Client) ReleaseAll(ctx context.Context, resources []string, leaseID string) (bool, error) {
	set, err := c.normalizeSet(resources)
	if err != nil {
		return false, err
	}
	req := streams.ReleaseRequest{Resources: set, LeaseID: leaseID}
	if err := req.Validate(); err != nil {
		return false, wrapErr(ErrInvalidRequest, err)
	}
	var resp streams.SetReleaseResponse
	err = c.retry(ctx, func() error { return c.call(ctx, streams.OpRelease, &req, &resp, 0) })
	if err != nil {
		return false, err
	}
	return resp.Released, nil
}
