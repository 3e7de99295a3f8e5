package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

// The commands for scripts: acquire hands out a lease whose renewals and
// release are the script's business (jetlock renew, jetlock release).

type acquireCmd struct {
	Wait      time.Duration `help:"Wait up to this long for the lock (default: try once; exit 75 if held)." placeholder:"D"`
	TTL       time.Duration `name:"ttl" help:"Lease TTL (default: the service's, 30s). Nothing renews it: run 'jetlock renew' within it." placeholder:"D"`
	MaxHold   time.Duration `help:"Longest the lease may be held, renewals included (default: the deployment's cap)." placeholder:"D"`
	Owner     string        `help:"Owner text shown to others (default: HOST:PID)."`
	RequestID string        `help:"Request id (default: random); reuse it to make a retried acquire idempotent."`
	JSON      bool          `name:"json" help:"Print the service's reply as JSON (lease_id included); errors as JSON too."`
	Env       bool          `name:"env" help:"Print 'export JETLOCK_RESOURCE=... JETLOCK_TOKEN=... JETLOCK_LEASE_ID=... JETLOCK_TTL=...' (and the per-resource JETLOCK_RESOURCE_<n>, JETLOCK_TOKEN_<n>, JETLOCK_TOKENS) for eval."`
	Resources []string      `arg:"" name:"resource" help:"Resource to lock; several are acquired as one lock set."`
}

// Help is the long help of `jetlock acquire`.
func (a *acquireCmd) Help() string {
	return `Acquires RESOURCE and prints the lease: its lease_id (the only command that
shows it: keep it secret, it alone renews and releases the lease) and its
fencing token. The lease lasts its TTL unless renewed with 'jetlock renew';
prefer 'jetlock run', which renews for you.

--env prints the lease for eval: JETLOCK_RESOURCE, JETLOCK_TOKEN,
JETLOCK_LEASE_ID, and JETLOCK_TTL (--ttl, or the TTL granted), which
'jetlock renew' and 'jetlock release' read; also JETLOCK_RESOURCE_<n> and
JETLOCK_TOKEN_<n> (n = 1.. in sorted order) and JETLOCK_TOKENS (a JSON
object resource -> token). SIGINT or SIGTERM while acquiring (waiting with
--wait) cancels the request at the service, so the lock never goes to the
vanished caller, and exits 128+N.

Several resources are acquired as one lock set: all at once or none, one
lease id and TTL, one fencing token per resource. Renew and release it with
the same resources ('jetlock renew A B C'). --env then leaves
JETLOCK_RESOURCE and JETLOCK_TOKEN unset (each resource has its own token);
--json prints {"lease_id",...,"resources":[{"resource","token"},...]}.

Example:
  eval "$(jetlock acquire --env --ttl 1m lock:backup:user123)"
  ./backup.sh --token "$JETLOCK_TOKEN"; jetlock renew lock:backup:user123  # --ttl from $JETLOCK_TTL
  jetlock release lock:backup:user123   # lease id from $JETLOCK_LEASE_ID

  eval "$(jetlock acquire --env account:17 account:42)"
  ./transfer.sh "$JETLOCK_TOKENS"; jetlock release account:17 account:42`
}

// Validate checks the flags before anything connects.
func (a *acquireCmd) Validate() error {
	if a.JSON && a.Env {
		return usagef("--json and --env exclude each other")
	}
	return firstErr(
		checkResources(a.Resources),
		checkDuration("wait", a.Wait, time.Millisecond, 24*time.Hour),
		checkDuration("ttl", a.TTL, time.Second, streams.MaxRecordTTL),
		checkDuration("max-hold", a.MaxHold, time.Second, streams.MaxHoldCeiling),
		checkText("owner", a.Owner, streams.ValidateOwner),
		checkText("request-id", a.RequestID, optional(streams.ValidateRequestID)),
	)
}

// Run acquires and prints.
func (a *acquireCmd) Run(g *globals) error {
	// Caught from here on: a signal cancels the acquire (see acquire).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, interruptSignals...)
	defer signal.Stop(sigs)
	s, err := g.connect()
	if err != nil {
		return err
	}
	defer s.close()
	lease, err := a.acquire(g, s, sigs)
	if err != nil {
		return err
	}
	// The process exits now, and with it the client's renewer: the lease
	// lasts its TTL unless the script renews it.
	r := lease.Reply()
	set := len(a.Resources) > 1
	switch {
	case a.JSON && set:
		return printJSON(setReply(lease))
	case a.JSON:
		return printJSON(r)
	case a.Env:
		ttl := a.TTL
		if ttl == 0 {
			ttl = time.Duration(r.TTLms) * time.Millisecond
		}
		fmt.Println(exportLine(lease.Resources(), lease.TokenOf, r.LeaseID, durationText(ttl)))
	case set:
		fmt.Printf("acquired %s: tokens %s, ttl %s, expires %s%s\nlease_id %s\n", strings.Join(lease.Resources(), " "),
			setTokens(setReply(lease).Resources), durationText(time.Duration(r.TTLms)*time.Millisecond), r.ExpiresAt,
			holdText(r.HoldUntil), r.LeaseID)
	default:
		fmt.Printf("acquired %s: token %d, ttl %s, expires %s%s\nlease_id %s\n", r.Resource, r.Token,
			durationText(time.Duration(r.TTLms)*time.Millisecond), r.ExpiresAt, holdText(r.HoldUntil), r.LeaseID)
	}
	return nil
}

// interruptSignals end a waiting acquire.
var interruptSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

// acquire takes the lease. The first signal from sigs cancels ctx: the
// client then sends cancel for the request (bounded by --timeout) before
// Acquire returns, so the service neither keeps the caller queued nor
// hands it the lock after it has gone; a lease granted meanwhile is
// released. Without that, the vanished waiter would be granted the lock on
// the next release, and everyone else refused until its wait record
// lapsed.
//
// It takes --wait plus two --timeout at most: the acquire has --wait plus
// one --timeout (its one request's), and the cancel of an acquire given up
// one --timeout more (the client sends it in the background, and jetlock
// waits for it when it closes the connection).
func (a *acquireCmd) acquire(g *globals, s *session, sigs <-chan os.Signal) (*client.Lease, error) {
	ctx, cancel := context.WithTimeout(s.ctx, a.Wait+g.Timeout)
	defer cancel()
	spec := acquireSpec{resources: a.Resources, owner: a.Owner, requestID: a.RequestID, ttl: a.TTL, maxHold: a.MaxHold, wait: a.Wait}
	return spec.take(ctx, cancel, s, sigs, g.Timeout, "the request was cancelled")
}

// acquireSpec is what an acquire asks for, from acquire's, run's or
// elect's flags: one resource, several as one lock set, a permit of a
// semaphore of limit permits, or (with a value) leadership of an
// election, for which it always waits (up to wait, if set).
type acquireSpec struct {
	resources          []string
	owner, requestID   string
	ttl, maxHold, wait time.Duration
	limit              int
	value              string
}

// take acquires the lease within ctx, giving up on the first signal from
// sigs: that cancels ctx, and the client then sends cancel for the request
// before Acquire returns; a lease granted meanwhile is released within
// releaseTimeout. The interrupted error says after what happened.
func (spec acquireSpec) take(ctx context.Context, cancel context.CancelFunc, s *session, sigs <-chan os.Signal, releaseTimeout time.Duration, after string) (*client.Lease, error) {
	owner := spec.owner
	if owner == "" {
		owner = defaultOwner()
	}
	opts := []client.AcquireOption{client.Owner(owner)}
	if spec.ttl > 0 {
		opts = append(opts, client.TTL(spec.ttl))
	}
	if spec.maxHold > 0 {
		opts = append(opts, client.MaxHold(spec.maxHold))
	}
	if spec.requestID != "" {
		opts = append(opts, client.RequestID(spec.requestID))
	}
	caught := make(chan os.Signal, 1)
	stop, watcher := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watcher)
		select {
		case sig := <-sigs:
			caught <- sig
			cancel()
		case <-stop:
		}
	}()
	var lease *client.Lease
	var err error
	switch set := len(spec.resources) > 1; {
	case spec.value != "":
		lease, err = spec.campaign(ctx, s, opts)
	case spec.limit > 0:
		lease, err = spec.permit(ctx, s, opts)
	case spec.wait > 0 && set:
		lease, err = s.c.AcquireAll(ctx, spec.resources, append(opts, client.Wait(spec.wait))...)
	case spec.wait > 0:
		lease, err = s.c.Acquire(ctx, spec.resources[0], append(opts, client.Wait(spec.wait))...)
	case set:
		lease, err = s.c.TryAcquireAll(ctx, spec.resources, opts...)
	default:
		lease, err = s.c.TryAcquire(ctx, spec.resources[0], opts...)
	}
	close(stop)
	<-watcher
	select {
	case sig := <-caught:
		if lease != nil {
			rctx, rcancel := context.WithTimeout(context.Background(), releaseTimeout)
			defer rcancel()
			_ = lease.Release(rctx)
		}
		return nil, kindf(signalExit(sig), codeInterrupted, "%s while acquiring %s; %s", signalName(sig), strings.Join(spec.resources, " "), after)
	default:
	}
	if err != nil {
		return nil, s.fail(err)
	}
	return lease, nil
}

// campaign stands for election spec.resources[0] with spec.value, and
// waits until elected (or spec.wait, if set, has passed).
func (spec acquireSpec) campaign(ctx context.Context, s *session, opts []client.AcquireOption) (*client.Lease, error) {
	if spec.wait > 0 {
		opts = append(opts, client.Wait(spec.wait))
	}
	e, err := s.c.NewElection(spec.resources[0], opts...)
	if err != nil {
		return nil, err
	}
	ld, err := e.Campaign(ctx, spec.value)
	if err != nil {
		return nil, err
	}
	return ld.Lease, nil
}

// permit acquires a permit of semaphore spec.resources[0] of spec.limit
// permits, waiting up to spec.wait.
func (spec acquireSpec) permit(ctx context.Context, s *session, opts []client.AcquireOption) (*client.Lease, error) {
	m, err := s.c.NewSemaphore(spec.resources[0], spec.limit)
	if err != nil {
		return nil, err
	}
	if spec.wait > 0 {
		return m.Acquire(ctx, append(opts, client.Wait(spec.wait))...)
	}
	return m.TryAcquire(ctx, opts...)
}

// defaultOwner is the owner of an acquire without --owner: HOST:PID, as
// 'jetlock run' shows it (empty if that is no valid owner).
func defaultOwner() string {
	host, _ := os.Hostname()
	owner := host + ":" + strconv.Itoa(os.Getpid())
	if streams.ValidateOwner(owner) != nil {
		return ""
	}
	return owner
}

// signalName names sig as kill(1) does.
func signalName(sig os.Signal) string {
	switch sig {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return sig.String()
}

type renewCmd struct {
	LeaseID   string        `name:"lease-id" env:"JETLOCK_LEASE_ID" help:"The lease id printed by 'jetlock acquire'."`
	TTL       time.Duration `name:"ttl" env:"JETLOCK_TTL" help:"New TTL (default: the TTL 'jetlock acquire --env' exported, else the service's default, 30s)." placeholder:"D"`
	JSON      bool          `name:"json" help:"Print the service's reply as JSON (without the lease id); errors as JSON too."`
	Resources []string      `arg:"" name:"resource" help:"Resource of the lease; for a lock set, all its resources."`
}

// Help is the long help of `jetlock renew`.
func (r *renewCmd) Help() string {
	return `Renews a lease acquired with 'jetlock acquire'. Exit 79 (lease_lost) when it is
no longer current: expired, released, revoked, or past its hold limit.
The TTL asked for is --ttl, else $JETLOCK_TTL (set by 'jetlock acquire
--env'), else the service's default (30s), whatever TTL the lease had.

A lock set (acquired with several resources) is renewed whole: name all its
resources, in any order. Exit 79 if any of them no longer holds the lease.

Example:
  JETLOCK_LEASE_ID=... jetlock renew --ttl 1m lock:backup:user123`
}

// Validate checks the flags before anything connects.
func (r *renewCmd) Validate() error {
	return firstErr(checkResources(r.Resources), checkLeaseID(r.LeaseID),
		checkDuration("ttl", r.TTL, time.Second, streams.MaxRecordTTL))
}

// checkLeaseID refuses a lease id that no grant can have: lease ids are
// hex digits (128 random bits, as 'jetlock acquire' prints them).
func checkLeaseID(id string) error {
	if id == "" {
		return usagef("--lease-id (or JETLOCK_LEASE_ID) is required")
	}
	if err := checkText("lease-id", id, streams.ValidateLeaseID); err != nil {
		return err
	}
	if strings.Trim(id, "0123456789abcdef") != "" {
		return usagef("--lease-id %q is not a lease id: lease ids are lowercase hex digits, as 'jetlock acquire' prints them", id)
	}
	return nil
}

// Run renews and prints.
func (r *renewCmd) Run(g *globals) error {
	if len(r.Resources) > 1 {
		return r.runSet(g)
	}
	var resp *streams.LeaseResponse
	err := g.request(func(ctx context.Context, c *client.Client) (err error) {
		resp, err = c.Renew(ctx, r.Resources[0], r.LeaseID, r.TTL)
		return err
	})
	if err != nil {
		return setHint(err, "renew", r.Resources)
	}
	if r.JSON {
		return printJSON(grantView{Resource: resp.Resource, Token: resp.Token, TTLms: resp.TTLms,
			ExpiresAt: resp.ExpiresAt, HoldUntil: resp.HoldUntil})
	}
	fmt.Printf("renewed %s: token %d, ttl %s, expires %s%s\n", resp.Resource, resp.Token,
		durationText(time.Duration(resp.TTLms)*time.Millisecond), resp.ExpiresAt, holdText(resp.HoldUntil))
	return nil
}

// runSet renews a lock set and prints.
func (r *renewCmd) runSet(g *globals) error {
	var resp *streams.SetLeaseResponse
	err := g.request(func(ctx context.Context, c *client.Client) (err error) {
		resp, err = c.RenewAll(ctx, r.Resources, r.LeaseID, r.TTL)
		return err
	})
	if err != nil {
		return setHint(err, "renew", r.Resources)
	}
	if r.JSON {
		return printJSON(setGrantView{TTLms: resp.TTLms, ExpiresAt: resp.ExpiresAt, HoldUntil: resp.HoldUntil, Resources: resp.Resources})
	}
	names := make([]string, len(resp.Resources))
	for i, m := range resp.Resources {
		names[i] = m.Resource
	}
	fmt.Printf("renewed %s: tokens %s, ttl %s, expires %s%s\n", strings.Join(names, " "), setTokens(resp.Resources),
		durationText(time.Duration(resp.TTLms)*time.Millisecond), resp.ExpiresAt, holdText(resp.HoldUntil))
	return nil
}

// grantView is a lease reply without its lease id.
type grantView struct {
	Resource  string `json:"resource"`
	Token     uint64 `json:"token"`
	TTLms     int64  `json:"ttl_ms"`
	ExpiresAt string `json:"expires_at"`
	HoldUntil string `json:"hold_until,omitempty"`
}

type releaseCmd struct {
	LeaseID   string   `name:"lease-id" env:"JETLOCK_LEASE_ID" help:"The lease id printed by 'jetlock acquire'."`
	JSON      bool     `name:"json" help:"Print the service's reply as JSON; errors as JSON too."`
	Resources []string `arg:"" name:"resource" help:"Resource of the lease; for a lock set, all its resources."`
}

// Help is the long help of `jetlock release`.
func (r *releaseCmd) Help() string {
	return `Releases a lease acquired with 'jetlock acquire'. Idempotent: a lease that has
ended already answers "released": false, exit 0. A lock set is released
whole: name all its resources, in any order.

Example:
  jetlock release --lease-id "$JETLOCK_LEASE_ID" lock:backup:user123`
}

// Validate checks the flags before anything connects.
func (r *releaseCmd) Validate() error {
	return firstErr(checkResources(r.Resources), checkLeaseID(r.LeaseID))
}

// Run releases and prints.
func (r *releaseCmd) Run(g *globals) error {
	set := len(r.Resources) > 1
	var released bool
	err := g.request(func(ctx context.Context, c *client.Client) (err error) {
		if set {
			released, err = c.ReleaseAll(ctx, r.Resources, r.LeaseID)
		} else {
			released, err = c.Release(ctx, r.Resources[0], r.LeaseID)
		}
		return err
	})
	if err != nil {
		return setHint(err, "release", r.Resources)
	}
	names := strings.Join(r.Resources, " ")
	switch {
	case r.JSON && set:
		return printJSON(streams.SetReleaseResponse{Resources: slices.Sorted(slices.Values(r.Resources)), Released: released})
	case r.JSON:
		return printJSON(streams.ReleaseResponse{Resource: r.Resources[0], Released: released})
	case released:
		fmt.Printf("released %s\n", names)
	default:
		fmt.Printf("%s: the lease had already ended\n", names)
	}
	return nil
}

// setHint completes the service's refusal of a renew or release that
// names part of a lock set, or more than it (invalid_request, exit 2: the
// set stays held), with how to name it from the shell.
func setHint(err error, cmd string, resources []string) error {
	var ee *exitError
	if !errors.As(err, &ee) || ee.kind != streams.CodeInvalidRequest || !strings.Contains(ee.msg, "lock set") {
		return err
	}
	ee.msg += fmt.Sprintf("; this names %d (%s): 'jetlock %s' names every resource the set was acquired with, in any order (jetlock %s RESOURCE...)",
		len(resources), strings.Join(resources, " "), cmd, cmd)
	return ee
}

type statusCmd struct {
	JSON     bool   `name:"json" help:"Print the service's reply as JSON; errors as JSON too."`
	Limit    int    `help:"Look at RESOURCE as the semaphore of this many permits (as run --limit takes it): each held permit with its number."`
	Resource string `arg:"" help:"Resource to look at."`
}

// Help is the long help of `jetlock status`.
func (c *statusCmd) Help() string {
	return `Shows who holds RESOURCE (never the lease id), its token, when it expires in the
service's view, how many wait, and whether a session holds the lease (with
the session's owner when it is shown to you; never the session id). A
semaphore's name shows the semaphore, each held permit with its number;
--limit N asks for it as the semaphore of N permits.

Example:
  jetlock status --json lock:backup:user123
  jetlock status --limit 3 encoders`
}

// Validate checks the resource before anything connects.
func (c *statusCmd) Validate() error {
	if c.Limit < 0 || c.Limit > streams.MaxLimit {
		return usagef("--limit %d outside [1, %d]", c.Limit, streams.MaxLimit)
	}
	return checkResource(c.Resource)
}

// Run asks and prints.
func (c *statusCmd) Run(g *globals) error {
	var st *client.Status
	err := g.request(func(ctx context.Context, cl *client.Client) (err error) {
		if c.Limit != 0 {
			st, err = semaphoreStatus(ctx, cl, c.Resource, c.Limit)
		} else {
			st, err = cl.Status(ctx, c.Resource)
		}
		return err
	})
	if err != nil {
		return err
	}
	if c.JSON {
		resp := streams.StatusResponse{Resource: st.Resource, Held: st.Held, Owner: st.Owner, Token: st.Token,
			ExpiresAt: wireTime(st.ExpiresAt), Waiters: st.Waiters, HoldUntil: wireTime(st.HoldUntil),
			InSession: st.InSession, SessionOwner: st.SessionOwner, SetSize: st.SetSize, Limit: st.Limit, HeldPermits: len(st.Permits)}
		for _, p := range st.Permits {
			resp.Permits = append(resp.Permits, streams.PermitInfo{Permit: p.Permit, Owner: p.Owner, Token: p.Token, ExpiresAt: wireTime(p.ExpiresAt)})
		}
		return printJSON(resp)
	}
	if st.Limit != 0 {
		printSemaphore(st)
		return nil
	}
	if !st.Held {
		fmt.Printf("%s: free, %d waiting\n", st.Resource, st.Waiters)
		return nil
	}
	in := ""
	if st.InSession {
		in = " in a session"
		if st.SessionOwner != "" {
			in = " in session " + strconv.Quote(st.SessionOwner)
		}
	}
	if st.SetSize > 0 {
		in += fmt.Sprintf(" (one of a lock set of %d)", st.SetSize)
	}
	fmt.Printf("%s: held by %s%s, token %d, expires in %s, %d waiting\n", st.Resource, ownerText(st.Owner), in, st.Token,
		expiresIn(st.ExpiresAt), st.Waiters)
	return nil
}

// semaphoreStatus asks for the semaphore name of limit permits, as a
// Status.
func semaphoreStatus(ctx context.Context, cl *client.Client, name string, limit int) (*client.Status, error) {
	sem, err := cl.NewSemaphore(name, limit)
	if err != nil {
		return nil, err
	}
	ss, err := sem.Status(ctx)
	if err != nil {
		return nil, err
	}
	return &client.Status{Resource: name, Held: ss.Held > 0, Waiters: ss.Waiters, Limit: ss.Limit, Permits: ss.Permits}, nil
}

// printSemaphore prints the status of a semaphore: each held permit.
func printSemaphore(st *client.Status) {
	fmt.Printf("%s: semaphore of %d permits, %d held, %d waiting\n", st.Resource, st.Limit, len(st.Permits), st.Waiters)
	for _, p := range st.Permits {
		fmt.Printf("  permit %d: held by %s, token %d, expires in %s\n", p.Permit, ownerText(p.Owner), p.Token, expiresIn(p.ExpiresAt))
	}
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	return enc.Encode(v)
}

func wireTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return streams.FormatTime(t)
}

func holdText(holdUntil string) string {
	if holdUntil == "" {
		return ""
	}
	return ", held until " + holdUntil + " at most"
}

// ownerText names a holder in status: an owner the service did not show
// (another user's lease, or one acquired without --owner) is still a
// holder.
func ownerText(o string) string {
	if o == "" {
		return "(owner not shown: another user's lease, or none given)"
	}
	return strconv.Quote(o)
}

// expiresIn renders how long until t, by this machine's clock.
func expiresIn(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Until(t).Round(100 * time.Millisecond)
	if d < 0 {
		return "0s (expiring)"
	}
	return d.String()
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	out := "'"
	for _, c := range s {
		if c == '\'' {
			out += `'\''`
			continue
		}
		out += string(c)
	}
	return out + "'"
}
