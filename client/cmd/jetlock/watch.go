package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/streams"
)

type watchCmd struct {
	Bucket   string        `default:"jetlock" env:"JETLOCK_BUCKET" help:"KV bucket of the lock state."`
	For      time.Duration `name:"for" help:"Stop after this long (default: until Ctrl-C)." placeholder:"D"`
	Renewals bool          `help:"Also print renewals."`
	JSON     bool          `name:"json" help:"One JSON object per event; an error ends the stream as a JSON error line."`
	Prefix   string        `arg:"" optional:"" help:"Only resources that start with this (default: all)."`
}

// Help is the long help of `jetlock watch`.
func (c *watchCmd) Help() string {
	return `Prints the leases held now ("held"), then grants, releases and expiries as they
happen, read from the lock bucket through a KV watcher: needs inspector
credentials (read access to the bucket), without them exit 77. How a lease
ended: "released", "expired", "revoked" (with the operator's reason),
"cancelled" (its acquire was cancelled), or "handed-over" (a release,
expiry or revoke that gave the resource to the next waiter in the same
write, whose "granted" follows). A lease held by a session shows the
session's owner (session=OWNER; "session" when it has none or has ended
already); its leases end "released" when the session is closed, "expired"
when it was not kept alive. Never prints lease ids or session ids. Stops on
Ctrl-C or after --for.

Example:
  jetlock --user inspector --password inspector watch --for 1h lock:backup:`
}

// Validate checks the flags before anything connects.
func (c *watchCmd) Validate() error {
	if err := (&streams.ListRequest{Prefix: c.Prefix}).Validate(); err != nil {
		return usagef("prefix %q: %s", c.Prefix, clean(err))
	}
	if err := (streams.BucketConfig{Bucket: c.Bucket, AllowSingleReplica: true, Replicas: 1}).Validate(); err != nil {
		return usagef("--bucket: %s", clean(err))
	}
	return checkDuration("for", c.For, time.Millisecond, 366*24*time.Hour)
}

// watchEvent is one line of output.
type watchEvent struct {
	Time      string `json:"time"`
	Event     string `json:"event"`
	Resource  string `json:"resource"`
	Owner     string `json:"owner"`
	Token     uint64 `json:"token"`
	ExpiresAt string `json:"expires_at,omitempty"`
	// Reason is a revoke's reason.
	Reason string `json:"reason,omitempty"`
	// InSession marks a lease held by a session, SessionOwner names the
	// session's owner (empty when it has none, or ended before it was
	// read), as the list reply does.
	InSession    bool   `json:"in_session,omitempty"`
	SessionOwner string `json:"session_owner,omitempty"`
}

// Run watches until Ctrl-C or --for.
func (c *watchCmd) Run(g *globals) error {
	s, err := g.connect()
	if err != nil {
		return err
	}
	defer s.close()
	ctx, stop := s.untilInterrupted(c.For)
	defer stop()
	js, err := jetstream.New(s.nc)
	if err != nil {
		return s.fail(err)
	}
	bctx, bcancel := context.WithTimeout(ctx, 2*g.Timeout)
	kv, err := js.KeyValue(bctx, c.Bucket)
	bcancel()
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return exitf(exitFailure, "bucket %s not found (is this jetlock's cluster and account?)", c.Bucket)
		}
		return s.fail(err)
	}
	w, err := kv.Watch(ctx, streams.LeaseKeyPrefix+">")
	if err != nil {
		return s.fail(err)
	}
	defer w.Stop() //nolint:errcheck // ending anyway
	last := map[string]*streams.Record{}
	initial := true
	owners := sessionOwners{kv: kv, timeout: g.Timeout, known: map[string]string{}}
	for {
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(s.ctx), errPermission) {
				return s.fail(ctx.Err())
			}
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return kindf(exitUnavailable, streams.CodeUnavailable, "the watch ended")
			}
			if e == nil {
				initial = false
				continue
			}
			for _, ev := range c.events(ctx, e, last, initial, owners.of) {
				c.print(ev)
			}
		}
	}
}

// events turns one bucket entry into the events it means, keeping last,
// the current record of every key. sessionOwner names the owner of a
// lease's session.
func (c *watchCmd) events(ctx context.Context, e jetstream.KeyValueEntry, last map[string]*streams.Record, initial bool,
	sessionOwner func(ctx context.Context, hash string) string) []watchEvent {
	resource, err := streams.DecodeResource(strings.TrimPrefix(e.Key(), streams.LeaseKeyPrefix))
	if err != nil || !strings.HasPrefix(resource, c.Prefix) {
		return nil
	}
	at := streams.FormatTime(e.Created())
	prev := last[e.Key()]
	var out []watchEvent
	inSession := func(ev watchEvent, rec *streams.Record) watchEvent {
		if rec.Session != "" {
			ev.InSession, ev.SessionOwner = true, sessionOwner(ctx, rec.Session)
		}
		return ev
	}
	ended := func(how, reason string) {
		if prev != nil {
			out = append(out, inSession(watchEvent{Time: at, Event: how, Resource: resource, Owner: prev.Owner, Token: prev.Token, Reason: reason}, prev))
		}
	}
	switch e.Operation() {
	case jetstream.KeyValuePut:
		rec, err := streams.ParseLease(e.Value(), e.Revision())
		if err != nil {
			return nil // not a lease record: nobody's lease
		}
		fresh := rec.Token == 0
		rec.Token = rec.TokenAt(e.Revision())
		last[e.Key()] = rec
		ev := inSession(watchEvent{Time: at, Resource: resource, Owner: rec.Owner, Token: rec.Token, ExpiresAt: rec.ExpiresAt}, rec)
		switch {
		case initial:
			ev.Event = "held"
		case fresh:
			ended("handed-over", "")
			ev.Event = "granted"
		case c.Renewals:
			ev.Event = "renewed"
		default:
			return out
		}
		out = append(out, ev)
	default: // a delete marker: the lease ended
		delete(last, e.Key())
		if initial {
			return nil
		}
		m := streams.DecodeEndMark(e.Value())
		switch {
		case m == nil:
			ended(endHow(prev, at), "")
		case endWords[m.Why] != "":
			ended(endWords[m.Why], m.Reason)
		default: // a mark of a release before end marks said why
			ended(endHow(prev, m.EndedAt), "")
		}
	}
	return out
}

// endWords names the events of an end mark's why. A session's leases end
// with its close ("session_close") or its expiry ("session_expiry"); a why
// not known here is told by endHow.
var endWords = map[string]string{
	streams.EndRelease: "released", streams.EndExpiry: "expired", streams.EndRevoke: "revoked", streams.EndCancel: "cancelled",
	"session_close": "released", "session_expiry": "expired",
}

// sessionOwners reads the owners of sessions from their records in the
// bucket, once per session. A lease record names its session by the key
// hash of the session's record, never by the session id.
type sessionOwners struct {
	kv      jetstream.KeyValue
	timeout time.Duration
	known   map[string]string // key hash -> owner ("" once ended or unreadable)
}

// maxKnownSessions bounds the owners remembered: a watch may run for
// long, through many sessions.
const maxKnownSessions = 10_000

// of returns the owner of the session whose key hash is hash, "" when it
// has none or has ended already.
func (o *sessionOwners) of(ctx context.Context, hash string) string {
	if owner, ok := o.known[hash]; ok {
		return owner
	}
	gctx, cancel := context.WithTimeout(ctx, o.timeout)
	e, err := o.kv.Get(gctx, streams.SessionKey(hash))
	cancel()
	owner := ""
	switch {
	case err == nil:
		if rec, err := streams.ParseSession(e.Value(), e.Revision()); err == nil {
			owner = rec.Owner
		}
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return "" // not known now; asked again at the next event
	}
	if len(o.known) >= maxKnownSessions {
		clear(o.known)
	}
	o.known[hash] = owner
	return owner
}

// endHow guesses how prev ended at endedAt (a wire time), for a mark that
// does not say: "expired" when that is past its expiry, else "released".
func endHow(prev *streams.Record, endedAt string) string {
	if prev == nil {
		return "released"
	}
	exp, err1 := time.Parse(time.RFC3339Nano, prev.ExpiresAt)
	end, err2 := time.Parse(time.RFC3339Nano, endedAt)
	if err1 == nil && err2 == nil && !end.Before(exp) {
		return "expired"
	}
	return "released"
}

func (c *watchCmd) print(ev watchEvent) {
	if c.JSON {
		_ = printJSON(ev)
		return
	}
	line := fmt.Sprintf("%s  %-8s %s  owner=%s token=%d", ev.Time, ev.Event, ev.Resource, dash(ev.Owner), ev.Token)
	if ev.ExpiresAt != "" {
		line += " expires=" + ev.ExpiresAt
	}
	if ev.InSession {
		line += " session=" + sessionLabel(true, ev.SessionOwner)
	}
	if ev.Reason != "" {
		line += " reason=" + strconv.Quote(ev.Reason)
	}
	fmt.Println(line)
}

// parseWire parses a wire time ("" is the zero time).
func parseWire(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}
