package main

import (
	"context"
	"fmt"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

type revokeCmd struct {
	Reason   string `required:"" help:"Why (required; goes to the service's audit log)."`
	Permit   int    `help:"End this permit (1 to the semaphore's limit) of the semaphore RESOURCE instead of a lock's lease."`
	JSON     bool   `name:"json" help:"Print the service's reply as JSON; errors as JSON too."`
	Resource string `arg:"" help:"Resource whose lease to end."`
}

// Help is the long help of `jetlock revoke`.
func (c *revokeCmd) Help() string {
	return `Ends the current lease of RESOURCE whoever holds it. The holder's next renewal
is refused (a 'jetlock run' holding it stops its command and exits 79), and
the next grant gets a larger token, so fenced stores reject the evicted
holder's late writes. With --permit K it ends permit K of the semaphore
RESOURCE. Needs operator credentials; without them exit 77.

Example:
  jetlock --user operator --password operator revoke lock:backup:user123 --reason "backup stuck since 03:00"`
}

// Validate checks the flags before anything connects.
func (c *revokeCmd) Validate() error {
	if c.Permit < 0 || c.Permit > streams.MaxLimit {
		return usagef("--permit %d outside [1, %d]", c.Permit, streams.MaxLimit)
	}
	return firstErr(checkResource(c.Resource), checkText("reason", c.Reason, streams.ValidateReason))
}

// Run revokes.
func (c *revokeCmd) Run(g *globals) error {
	var rv *client.Revocation
	err := g.request(func(ctx context.Context, cl *client.Client) (err error) {
		var opts []client.RevokeOption
		if c.Permit != 0 {
			opts = append(opts, client.RevokePermit(c.Permit))
		}
		rv, err = cl.Revoke(ctx, c.Resource, c.Reason, opts...)
		return err
	})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(streams.RevokeResponse{Resource: rv.Resource, Permit: rv.Permit, Revoked: rv.Revoked, Token: rv.Token})
	}
	name := rv.Resource
	if rv.Permit != 0 {
		name = fmt.Sprintf("%s permit %d", rv.Resource, rv.Permit)
	}
	if rv.Revoked {
		fmt.Printf("revoked %s: ended the lease with token %d\n", name, rv.Token)
	} else {
		fmt.Printf("%s: not held, nothing revoked\n", name)
	}
	return nil
}
