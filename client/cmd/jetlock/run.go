package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

// runCmd is `jetlock run`: acquire, run the command in its own process
// group while the client renews, release when it exits.
type runCmd struct {
	Wait      time.Duration  `help:"Wait up to this long for the lock (default: try once; exit 75 if held)." placeholder:"D"`
	TTL       time.Duration  `name:"ttl" help:"Lease TTL (default: the service's, 30s); renewed every third of it." placeholder:"D"`
	MaxHold   time.Duration  `help:"Longest the lease may be held, renewals included; the command is stopped then (default: the deployment's cap, 24h)." placeholder:"D"`
	Owner     string         `help:"Owner text shown to others (default: HOST:PID)."`
	RequestID string         `help:"Request id of the acquire (default: random); reuse it to make a retried run idempotent."`
	Grace     *time.Duration `help:"After a lost lease, how long the command has between SIGTERM and SIGKILL (default: 10s, capped at the most the TTL allows: half the TTL less min(1s, TTL/4), e.g. 14s for a 30s TTL, 1.5s for 5s)." placeholder:"D"`
	Limit     *int           `help:"Run at most N at once across the fleet: RESOURCE is a counting semaphore of N permits (1 to 1000), and the command holds one (JETLOCK_PERMIT in its environment). Every run of RESOURCE must give the same N." placeholder:"N"`

	Resource string   `arg:"" help:"Resource to lock: letters, digits and - _ . / = : @ (1 to 200 bytes). Several, before --, are held as one lock set."`
	Command  []string `arg:"" optional:"" passthrough:"" help:"More resources, then the command and its arguments, after --."`

	// resources are the resources to lock (Resource and those after it,
	// before --), set by Validate.
	resources []string
}

// Help is the long help of `jetlock run`.
func (r *runCmd) Help() string {
	return `Acquires RESOURCE, then runs the command in its own process group with
JETLOCK_RESOURCE, JETLOCK_TOKEN (the fencing token: pass it with every write)
and JETLOCK_LEASE_ID in its environment. jetlock renews the lease while the
command runs, releases it when the command (and its process group) has
exited, and exits with the command's code (128+N if signal N killed it).
SIGINT, SIGTERM and SIGHUP sent to jetlock are forwarded to the command.

Several resources before -- (jetlock run [FLAGS] A B C -- CMD) are held as
one lock set: granted all at once or not at all (waiting in every
resource's queue at once, with --wait), renewed, released and lost whole,
up to 64 resources. Each has its own fencing token: the command gets
JETLOCK_RESOURCE_<n> and JETLOCK_TOKEN_<n> for n = 1.. in sorted order, and
JETLOCK_TOKENS, a JSON object resource -> token; JETLOCK_RESOURCE and
JETLOCK_TOKEN are not set for a set (pass each resource its own token).
These three are set for a single resource too (n = 1).

With --limit N, RESOURCE is a counting semaphore: at most N runs hold one
of its N permits at once, the others wait (--wait) or exit 75. The command
gets JETLOCK_PERMIT (1..N) besides JETLOCK_RESOURCE and JETLOCK_TOKEN; the
token rises per permit, so fence the command's writes per permit, under
"$JETLOCK_RESOURCE#$JETLOCK_PERMIT". Every run of a semaphore must give the
same N (another is refused while it has holders or waiters: exit 2).

When the lease is lost (a renewal refused, a revoke) the command's group gets
SIGTERM (once per process), then SIGKILL after --grace, and jetlock exits 79. When renewals
fail, or the hold limit (--max-hold) comes, the group gets SIGTERM at the
client's deadline (the send time of the last renewal that succeeded, plus the
TTL, less a 1s safety margin) minus --grace, and SIGKILL at that deadline:
before the service can expire the lease (the TTL plus its expiry grace, 2s by
default, after it saw the renewal). With --ttl 30s and the default --grace
10s: SIGTERM 19s and SIGKILL 29s after the last successful renewal was sent,
while the service expires the lease no earlier than 32s after it. --grace may
be at most half the TTL less that margin (14s for a 30s TTL).

Exit 75: the resource is held (no --wait, or it ran out); 69: the service is
unavailable; 2: bad input (nothing started).

The command runs under a small guard process (jetlock itself) that kills
its group (SIGTERM, then SIGKILL by the deadline) if jetlock dies for any
reason, SIGKILL included; on Linux also the orphans that left the group.

The command runs in its own process group: it is not the terminal's
foreground group, so it cannot read from a terminal. One that tries is
frozen by SIGTTIN (SIGTTOU for a write with stty tostop); jetlock then
stops it, releases the lock and exits 128+N. Give it its input another
way (< FILE, < /dev/null).

A renewal that gets through before SIGKILL (a short outage) calls off a
stop begun near the deadline: the command got SIGTERM, and goes on if it
handles it.

Example:
  jetlock run --wait 1m --ttl 30s --owner backup lock:backup:user123 -- ./backup.sh user123
  jetlock run --wait 1m account:17 account:42 -- ./transfer.sh 17 42
  jetlock run --limit 3 --wait 10m encoders -- ./encode.sh video42`
}

// Validate checks the flags before anything connects or starts.
func (r *runCmd) Validate() error {
	if r.resources == nil { // split once
		r.resources, r.Command = splitRun(r.Resource, r.Command)
	}
	if err := checkResources(r.resources); err != nil {
		return err
	}
	if len(r.Command) == 0 || r.Command[0] == "" {
		return usagef("no command after --: jetlock run RESOURCE... -- CMD [ARGS...]")
	}
	if r.Limit != nil {
		if err := checkLimit(*r.Limit); err != nil {
			return err
		}
		if len(r.resources) > 1 {
			return usagef("--limit with %d resources: --limit makes one resource a semaphore; a lock set has none", len(r.resources))
		}
	}
	return firstErr(
		checkDuration("wait", r.Wait, time.Millisecond, 24*time.Hour),
		checkDuration("ttl", r.TTL, time.Second, streams.MaxRecordTTL),
		checkDuration("max-hold", r.MaxHold, time.Second, streams.MaxHoldCeiling),
		checkGrace(r.Grace, r.TTL),
		checkText("owner", r.Owner, streams.ValidateOwner),
		checkText("request-id", r.RequestID, optional(streams.ValidateRequestID)),
	)
}

// defaultGrace is --grace when not given, if the TTL allows it.
const defaultGrace = 10 * time.Second

// checkGrace refuses a --grace outside (0, 1h], or too long for --ttl
// (when given; else for the TTL granted, see runCmd.grace).
func checkGrace(d *time.Duration, ttl time.Duration) error {
	switch {
	case d == nil:
		return nil
	case *d <= 0 || *d > time.Hour:
		return usagef("--grace %s outside (0, 1h]", durationText(*d))
	case ttl > 0 && *d > graceBudget(ttl):
		return graceTooLong(*d, ttl)
	}
	return nil
}

// graceBudget is the longest grace a lease of ttl allows: half the TTL
// less the client's safety margin (client.WithSafetyMargin: 1s, at most a
// quarter of the TTL). The command gets SIGTERM at the client's deadline
// minus the grace and SIGKILL at the deadline, before the service may
// expire the lease; and since renewals are sent a third of the TTL after
// the last, half the TTL leaves at least a sixth of it (5s of 30s) to
// retry a renewal before the command is stopped.
func graceBudget(ttl time.Duration) time.Duration {
	return ttl/2 - min(time.Second, ttl/4)
}

func graceTooLong(d, ttl time.Duration) error {
	return usagef("--grace %s is too long for a TTL of %s: at most %s (half the TTL less the 1s safety margin), so that the command is killed before the lease could expire",
		durationText(d), durationText(ttl), durationText(graceBudget(ttl)))
}

// checkLimit refuses a --limit outside [1, streams.MaxLimit].
func checkLimit(n int) error {
	if n < 1 || n > streams.MaxLimit {
		return usagef("--limit %d outside [1, %d]", n, streams.MaxLimit)
	}
	return nil
}

// Run acquires, runs the command and returns its exit.
func (r *runCmd) Run(g *globals) error {
	return r.hold(g, r.acquire)
}

// hold takes a lease with take (run's acquire, elect's campaign), runs the
// command under it and releases it, and returns the command's exit.
func (r *runCmd) hold(g *globals, take func(g *globals, s *session, sigs <-chan os.Signal) (*client.Lease, error)) error {
	path, err := exec.LookPath(r.Command[0])
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitf(exitNotFound, "%s is not a command in PATH", r.Command[0])
		}
		return exitf(exitCannotExec, "cannot run %s: %v", r.Command[0], err)
	}
	// Signals are caught from here on: before the grant they abandon the
	// acquire, after it they go to the command.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)

	s, err := g.connect()
	if err != nil {
		return err
	}
	defer s.close()
	lease, err := take(g, s, sigs)
	if err != nil {
		return err
	}
	grace, err := r.grace(lease)
	code := 0
	if err == nil {
		code, err = r.supervise(lease, path, grace, sigs)
	}
	// Retries of the release end at the lease's deadline (see Release) or
	// after one request timeout, whichever comes first: past that the lease
	// ends by itself, and waiting longer only delays jetlock's exit.
	rctx, cancel := context.WithTimeout(context.Background(), g.Timeout)
	defer cancel()
	if rerr := lease.Release(rctx); rerr != nil && err == nil {
		why := strings.TrimPrefix(oneLine(clean(rerr)), streams.CodeUnavailable+": ")
		if errors.Is(rerr, context.DeadlineExceeded) {
			why = "no answer in " + g.Timeout.String()
		}
		fmt.Fprintf(os.Stderr, "jetlock: %s: release not confirmed (%s); the lease ends by itself after its TTL\n", streams.CodeUnavailable, why)
	}
	if err != nil {
		return err
	}
	return &exitError{code: code}
}

// grace returns the command's grace: --grace, or its default fitted to the
// lease's TTL. A --grace the TTL does not allow is bad input (nothing has
// started yet).
func (r *runCmd) grace(lease *client.Lease) (time.Duration, error) {
	ttl := time.Duration(lease.Reply().TTLms) * time.Millisecond
	if r.Grace == nil {
		return min(defaultGrace, graceBudget(ttl)), nil
	}
	if *r.Grace > graceBudget(ttl) {
		return 0, graceTooLong(*r.Grace, ttl)
	}
	return *r.Grace, nil
}

// acquire takes the lease, giving up on the first signal.
func (r *runCmd) acquire(g *globals, s *session, sigs <-chan os.Signal) (*client.Lease, error) {
	ctx, cancel := context.WithTimeout(s.ctx, r.Wait+4*g.Timeout)
	defer cancel()
	spec := acquireSpec{resources: r.resources, owner: r.Owner, requestID: r.RequestID, ttl: r.TTL, maxHold: r.MaxHold, wait: r.Wait}
	if r.Limit != nil {
		spec.limit = *r.Limit
	}
	return spec.take(ctx, cancel, s, sigs, 2*g.Timeout, "nothing started")
}

// supervise runs the command under its guard while the lease lasts, and
// returns its exit code, or an exitError when the lease was lost.
func (r *runCmd) supervise(lease *client.Lease, path string, grace time.Duration, sigs <-chan os.Signal) (int, error) {
	env := leaseEnv(os.Environ(), lease)
	renewed := lease.Renewed()
	g, err := startGuarded(path, r.Command, env, grace, lease.Expires())
	if err != nil {
		return 0, err
	}
	defer g.close()
	g.setDeadline(lease.Expires())

	lost := lease.Lost()
	var lostErr error
	expiring := false // lostErr is the deadline's coming near, not a loss
	frozen := 0       // the signal that froze the command
	for {
		select {
		case ev, ok := <-g.events:
			if !ok {
				g.abandon()
				return 0, kindf(exitFailure, codeFailure, "the command's guard process died; its process group was killed")
			}
			switch ev.kind {
			case evExpiring:
				if lostErr == nil {
					lostErr, expiring = r.expiring(lease, grace), true
				}
			case evResumed:
				if expiring {
					lostErr, expiring = nil, false
					fmt.Fprintf(os.Stderr, "jetlock: a renewal got through before the client's deadline (now %s): the stop is called off; the command got SIGTERM and goes on if it handles it\n",
						lease.Expires().Format(time.RFC3339Nano))
				}
			case evFrozen:
				frozen = ev.n
				fmt.Fprintf(os.Stderr, "jetlock: %s: the command was stopped by %s: it read from (or wrote to) the terminal, which it may not do in its own process group; stopping it so that it does not hold the lock (SIGTERM now, SIGKILL in %s); give it its input another way (< FILE, < /dev/null)\n",
					codeFailure, stopSignalName(ev.n), durationText(killIn(lease, grace)))
			case evExited:
				switch {
				case lostErr != nil:
					return 0, &exitError{code: exitLost}
				case frozen != 0:
					return 0, &exitError{code: exitSignalBase + frozen}
				}
				return ev.n, nil
			}
		case <-renewed:
			renewed = lease.Renewed()
			g.setDeadline(lease.Expires())
		case sig := <-sigs:
			g.signal(sig)
		case <-lost:
			lost = nil
			expiring = false // lost: no renewal calls the stop off any more
			if lostErr == nil {
				lostErr = context.Cause(lease.Context())
				fmt.Fprintf(os.Stderr, "jetlock: %s: %s: stopping the command (SIGTERM now, SIGKILL in %v)\n",
					streams.CodeLeaseLost, strings.TrimPrefix(oneLine(clean(lostErr)), "lease lost: "), durationText(killIn(lease, grace)))
			}
			g.stop()
		}
	}
}

// killIn is when the guard sends SIGKILL after it sent SIGTERM now: at the
// end of the grace or at the client's deadline, whichever comes first.
func killIn(lease *client.Lease, grace time.Duration) time.Duration {
	return min(grace, max(0, time.Until(lease.Expires()))).Round(time.Millisecond)
}

// expiring reports that the guard stopped the command because the lease's
// deadline came near without a renewal, and returns the loss.
func (r *runCmd) expiring(lease *client.Lease, grace time.Duration) error {
	deadline := lease.Expires()
	var why string
	if hold := lease.HoldLimit(); !hold.IsZero() && !deadline.Before(hold) {
		why = "the hold cap ends the lease at " + deadline.Format(time.RFC3339Nano)
	} else {
		why = "no renewal confirmed; the client's deadline is " + deadline.Format(time.RFC3339Nano)
	}
	when := "before it"
	if !time.Now().Before(deadline) {
		when = "past it (jetlock or its guard was stopped)"
	}
	fmt.Fprintf(os.Stderr, "jetlock: %s: %s: stopping the command %s (SIGTERM now, SIGKILL in %s)\n",
		streams.CodeLeaseLost, why, when, durationText(killIn(lease, grace)))
	return fmt.Errorf("%w: %s", client.ErrLeaseLost, why)
}

func signalExit(sig os.Signal) int {
	if n := signalNumber(sig); n > 0 {
		return exitSignalBase + n
	}
	return exitFailure
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkText validates a text flag with a contract validator.
func checkText(flag, v string, check func(string) error) error {
	if err := check(v); err != nil {
		return usagef("--%s: %v", flag, clean(err))
	}
	return nil
}

// optional makes a validator accept the empty string ("not given").
func optional(check func(string) error) func(string) error {
	return func(s string) error {
		if s == "" {
			return nil
		}
		return check(s)
	}
}
