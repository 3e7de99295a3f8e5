package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

type lsCmd struct {
	JSON   bool   `name:"json" help:"Print the leases as JSON: {\"leases\":[...]} like the service's list reply, all pages in one; errors as JSON too."`
	Prefix string `arg:"" optional:"" help:"Only resources that start with this (default: all)."`
}

// Help is the long help of `jetlock ls`.
func (c *lsCmd) Help() string {
	return `Lists the held locks whose resource starts with PREFIX, in resource order:
resource, owner ("(not shown)": another user's lease, or one acquired
without an owner; it is held all the same), token, expires in (by this
machine's clock), how many
wait, and the session that holds the lease: its owner, "session" when the
owner is not shown (a session of another NATS user, or without an owner),
"-" for a lease of its own. Never shows lease ids or session ids.

Example:
  jetlock ls lock:backup:`
}

// Validate checks the prefix before anything connects.
func (c *lsCmd) Validate() error {
	if err := (&streams.ListRequest{Prefix: c.Prefix}).Validate(); err != nil {
		return usagef("prefix %q: %s", c.Prefix, clean(err))
	}
	return nil
}

// Run lists.
func (c *lsCmd) Run(g *globals) error {
	all := streams.ListResponse{Leases: []streams.LeaseInfo{}}
	err := g.request(func(ctx context.Context, cl *client.Client) error {
		for st, err := range cl.List(ctx, c.Prefix) {
			if err != nil {
				return err
			}
			all.Leases = append(all.Leases, streams.LeaseInfo{Resource: st.Resource, Owner: st.Owner, Token: st.Token,
				ExpiresAt: wireTime(st.ExpiresAt), Waiters: st.Waiters, HoldUntil: wireTime(st.HoldUntil),
				InSession: st.InSession, SessionOwner: st.SessionOwner, SetSize: st.SetSize, Permit: st.Permit})
			if len(all.Leases) >= 100_000 {
				break // bounded: a listing this long is not for a terminal
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(all)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "RESOURCE\tOWNER\tTOKEN\tEXPIRES IN\tWAITERS\tSESSION")
	for _, l := range all.Leases {
		st := parseWire(l.ExpiresAt)
		res := l.Resource
		if l.Permit != 0 {
			res = fmt.Sprintf("%s (permit %d)", res, l.Permit)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", res, cmp.Or(l.Owner, "(not shown)"), strconv.FormatUint(l.Token, 10), expiresIn(st), l.Waiters,
			dash(sessionLabel(l.InSession, l.SessionOwner)))
	}
	return w.Flush()
}

// sessionLabel names the session that holds a lease: its owner, or
// "session" when the owner is not shown; "" for a lease of its own. The
// session id is never shown.
func sessionLabel(inSession bool, owner string) string {
	switch {
	case !inSession:
		return ""
	case owner == "":
		return "session"
	default:
		return owner
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
