package client

import (
	"context"
	"fmt"
	"iter"

	"github.com/jetlock/jetlock/streams"
)

// List returns the held leases whose resource name starts with prefix
// ("" for all), in resource order, as the service instance that answers
// knows them; it never returns a lease id. It fetches pages of
// ListPageSize leases as the loop asks for more. An error ends the
// sequence; stop early by breaking out of the loop.
//
//	for st, err := range c.List(ctx, "lock:backup:") {
//		if err != nil {
//			return err
//		}
//		fmt.Println(st.Resource, st.Owner, st.Token)
//	}
func (c *Client) List(ctx context.Context, prefix string, opts ...ListOption) iter.Seq2[*Status, error] {
	lo := listOptions{pageSize: streams.DefaultListLimit}
	var optErr error
	for _, opt := range opts {
		if err := opt(&lo); err != nil && optErr == nil {
			optErr = err
		}
	}
	return func(yield func(*Status, error) bool) {
		if optErr != nil {
			yield(nil, optErr)
			return
		}
		req := streams.ListRequest{Prefix: prefix, Limit: lo.pageSize}
		for {
			var resp streams.ListResponse
			err := c.retry(ctx, func() error { return c.call(ctx, streams.OpList, &req, &resp, 0) })
			if err != nil {
				yield(nil, err)
				return
			}
			for _, li := range resp.Leases {
				st := &Status{Resource: li.Resource, Held: true, Owner: li.Owner, Token: li.Token,
					ExpiresAt: parseTime(li.ExpiresAt), Waiters: li.Waiters, HoldUntil: parseTime(li.HoldUntil),
					InSession: li.InSession, SessionOwner: li.SessionOwner, SetSize: li.SetSize, Permit: li.Permit}
				if !yield(st, nil) {
					return
				}
			}
			if resp.Next == "" {
				return
			}
			req.After = resp.Next
		}
	}
}

// ListOption configures List.
type ListOption func(*listOptions) error

type listOptions struct{ pageSize int }

// ListPageSize sets how many leases one list request asks for. The default
// is 100; at most 1000.
func ListPageSize(n int) ListOption {
	return func(o *listOptions) error {
		if n < 1 || n > streams.MaxListLimit {
			return fmt.Errorf("%w: list page size %d outside [1, %d]", ErrInvalidOption, n, streams.MaxListLimit)
		}
		o.pageSize = n
		return nil
	}
}

// Revocation is the outcome of Revoke.
type Revocation struct {
	Resource string
	// Permit is the permit revoked, when RevokePermit named one.
	Permit int
	// Revoked is false when nobody held the resource.
	Revoked bool
	// Token is the token of the lease that was ended.
	Token uint64
}

// Revoke ends the current lease of resource, whoever holds it: the
// holder's next renewal is refused (its Lost closes), and the next grant
// gets a larger token, so the resource's fence rejects the evicted
// holder's late writes. reason is required; the service writes it to its
// audit log. Revoke needs an operator's rights (the admin subject): a
// caller without them gets ErrPermission at once, once the NATS server has
// refused the request. An invalid resource or an empty reason is
// ErrInvalidRequest; no answer is ErrUnavailable. With RevokePermit it
// ends one permit of the semaphore resource instead.
func (c *Client) Revoke(ctx context.Context, resource, reason string, opts ...RevokeOption) (*Revocation, error) {
	if err := streams.ValidateResource(resource); err != nil {
		return nil, wrapErr(ErrInvalidRequest, err)
	}
	if reason == "" {
		return nil, fmt.Errorf("%w: a reason is required", ErrInvalidRequest)
	}
	req := streams.RevokeRequest{Resource: resource, Reason: reason}
	for _, opt := range opts {
		if err := opt(&req); err != nil {
			return nil, err
		}
	}
	var resp streams.RevokeResponse
	err := c.retry(ctx, func() error {
		return c.call(ctx, streams.OpRevoke, &req, &resp, 0)
	})
	if err != nil {
		return nil, err
	}
	return &Revocation{Resource: resp.Resource, Permit: resp.Permit, Revoked: resp.Revoked, Token: resp.Token}, nil
}

// RevokeOption configures Revoke.
type RevokeOption func(*streams.RevokeRequest) error

// RevokePermit makes Revoke end permit k (1 to the semaphore's limit) of
// the semaphore named by Revoke's resource. The default is the lease of a
// lock.
func RevokePermit(k int) RevokeOption {
	return func(r *streams.RevokeRequest) error {
		if k < 1 || k > streams.MaxLimit {
			return fmt.Errorf("%w: permit %d outside [1, %d]", ErrInvalidOption, k, streams.MaxLimit)
		}
		r.Permit = k
		return nil
	}
}
