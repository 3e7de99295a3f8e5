package client

import (
	"context"
	"fmt"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// This file holds the calls for a lease held across processes, as the
// jetlock command's acquire, renew and release do for shell scripts: the
// script keeps the lease id between calls, and nothing renews the lease in
// the background. A program that holds a lease in one process uses Lease.

// Reply returns the service's reply to the lease's last successful acquire
// or renew: the wire form of the grant, lease id included. Its expires_at
// is the service's view; the client's own deadline is Expires. For a lock
// set (AcquireAll) it carries what the set's reply shares (lease id, TTL,
// expiry, hold limit), with Resource empty and Token 0: the resources and
// their tokens are Resources and TokenOf.
func (l *Lease) Reply() streams.LeaseResponse {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reply
}

func (l *Lease) recordReply(resp *streams.LeaseResponse) {
	l.mu.Lock()
	l.reply = *resp
	l.mu.Unlock()
}

// Renew renews the lease leaseID of resource once, asking for ttl (zero:
// the service's default), and returns the service's reply. A lease that is
// no longer current (expired, released, revoked, past its hold cap)
// returns an error wrapping ErrLeaseLost. A renewal whose outcome is
// unknown is retried like an acquire; renewing twice is harmless.
//
// Renew is for a lease whose holder keeps the id between processes; a
// Lease renews itself.
func (c *Client) Renew(ctx context.Context, resource, leaseID string, ttl time.Duration) (*streams.LeaseResponse, error) {
	req := streams.RenewRequest{Resource: resource, LeaseID: leaseID, TTLms: ttl.Milliseconds()}
	if ttl < 0 {
		return nil, fmt.Errorf("%w: ttl %v", ErrInvalidOption, ttl)
	}
	if err := req.Validate(); err != nil {
		return nil, wrapErr(ErrInvalidRequest, err)
	}
	var resp streams.LeaseResponse
	err := c.retry(ctx, func() error { return c.call(ctx, streams.OpRenew, &req, &resp, 0) })
	if err != nil {
		return nil, err
	}
	return &resp, nil
}

// Release releases the lease leaseID of resource and reports whether it
// was still held (false: it had ended already, which is not an error).
// Like Lease.Release it is idempotent and never ends a newer lease. The
// lease of a lock set is released whole (ReleaseAll): naming one of its
// resources returns an error wrapping ErrInvalidRequest, and the set stays
// held; so does Renew.
func (c *Client) Release(ctx context.Context, resource, leaseID string) (bool, error) {
	req := streams.ReleaseRequest{Resource: resource, LeaseID: leaseID}
	if err := req.Validate(); err != nil {
		return false, wrapErr(ErrInvalidRequest, err)
	}
	var resp streams.ReleaseResponse
	err := c.retry(ctx, func() error { return c.call(ctx, streams.OpRelease, &req, &resp, 0) })
	if err != nil {
		return false, err
	}
	return resp.Released, nil
}
