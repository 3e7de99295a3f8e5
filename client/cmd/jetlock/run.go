package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

// runCmd is `jetlock run`: acquire, run the command in its own process
// group while the client renews, release when it exits.
type runCmd struct {
	Wait      time.Duration `help:"Wait up to this long for the lock (default: try once; exit 75 if held)." placeholder:"D"`
	TTL       time.Duration `name:"ttl" help:"Lease TTL (default: the service's, 30s); renewed every third of it." placeholder:"D"`
	MaxHold   time.Duration `help:"Longest the lease may be held, renewals included; the command is stopped then (default: the deployment's cap, 24h)." placeholder:"D"`
	Owner     string        `help:"Owner text shown to others (default: HOST:PID)."`
	RequestID string        `help:"Request id of the acquire (default: random); reuse it to make a retried run idempotent."`
	Grace     time.Duration `default:"10s" help:"After a lost lease, how long the command has between SIGTERM and SIGKILL." placeholder:"D"`

	Resource string   `arg:"" help:"Resource to lock: letters, digits and - _ . / = : @ (1 to 200 bytes)."`
	Command  []string `arg:"" optional:"" passthrough:"" help:"The command and its arguments, after --."`
}

// Help is the long help of `jetlock run`.
func (r *runCmd) Help() string {
	return `Acquires RESOURCE, then runs the command in its own process group with
JETLOCK_RESOURCE, JETLOCK_TOKEN (the fencing token: pass it with every write)
and JETLOCK_LEASE_ID in its environment. jetlock renews the lease while the
command runs, releases it when the command (and its process group) has
exited, and exits with the command's code (128+N if signal N killed it).
SIGINT, SIGTERM and SIGHUP sent to jetlock are forwarded to the command.

When the lease is lost (a renewal refused or not confirmed in time, a
revoke, the hold limit) the command's group gets SIGTERM, then SIGKILL after
--grace, and jetlock exits 79. Exit 75: the resource is held (no --wait, or
it ran out); 69: the service is unavailable; 2: bad input (nothing started).

The command runs in its own process group: it is not the terminal's
foreground group, so it cannot read from a terminal.

Example:
  jetlock run --wait 1m --ttl 30s --owner backup lock:backup:user123 -- ./backup.sh user123`
}

// Validate checks the flags before anything connects or starts.
func (r *runCmd) Validate() error {
	if err := checkResource(r.Resource); err != nil {
		return err
	}
	if len(r.Command) > 0 && r.Command[0] == "--" {
		r.Command = r.Command[1:]
	}
	if len(r.Command) == 0 || r.Command[0] == "" {
		return usagef("no command after --: jetlock run RESOURCE -- CMD [ARGS...]")
	}
	return firstErr(
		checkDuration("wait", r.Wait, time.Millisecond, 24*time.Hour),
		checkDuration("ttl", r.TTL, time.Second, streams.MaxRecordTTL),
		checkDuration("max-hold", r.MaxHold, time.Second, streams.MaxHoldCeiling),
		checkGrace(r.Grace),
		checkText("owner", r.Owner, streams.ValidateOwner),
		checkText("request-id", r.RequestID, optional(streams.ValidateRequestID)),
	)
}

func checkGrace(d time.Duration) error {
	if d <= 0 || d > time.Hour {
		return usagef("--grace %v outside (0, 1h]", d)
	}
	return nil
}

// Run acquires, runs the command and returns its exit.
func (r *runCmd) Run(g *globals) error {
	path, err := exec.LookPath(r.Command[0])
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitf(exitNotFound, "command not found: %s", r.Command[0])
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
	lease, err := r.acquire(g, s, sigs)
	if err != nil {
		return err
	}
	code, err := r.supervise(lease, path, sigs)
	rctx, cancel := context.WithTimeout(context.Background(), 2*g.Timeout)
	defer cancel()
	if rerr := lease.Release(rctx); rerr != nil && err == nil {
		fmt.Fprintf(os.Stderr, "jetlock: release: %s (the lease ends by itself after its TTL)\n", oneLine(clean(rerr)))
	}
	if err != nil {
		return err
	}
	return &exitError{code: code}
}

// acquire takes the lease, giving up on the first signal.
func (r *runCmd) acquire(g *globals, s *session, sigs <-chan os.Signal) (*client.Lease, error) {
	owner := r.Owner
	if owner == "" {
		host, _ := os.Hostname()
		owner = host + ":" + strconv.Itoa(os.Getpid())
		if streams.ValidateOwner(owner) != nil {
			owner = ""
		}
	}
	opts := []client.AcquireOption{client.Owner(owner)}
	if r.TTL > 0 {
		opts = append(opts, client.TTL(r.TTL))
	}
	if r.MaxHold > 0 {
		opts = append(opts, client.MaxHold(r.MaxHold))
	}
	if r.RequestID != "" {
		opts = append(opts, client.RequestID(r.RequestID))
	}
	ctx, cancel := context.WithTimeout(s.ctx, r.Wait+4*g.Timeout)
	defer cancel()
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
	if r.Wait > 0 {
		lease, err = s.c.Acquire(ctx, r.Resource, append(opts, client.Wait(r.Wait))...)
	} else {
		lease, err = s.c.TryAcquire(ctx, r.Resource, opts...)
	}
	close(stop)
	<-watcher
	select {
	case sig := <-caught:
		if lease != nil {
			rctx, rcancel := context.WithTimeout(context.Background(), 2*g.Timeout)
			defer rcancel()
			_ = lease.Release(rctx)
		}
		return nil, exitf(signalExit(sig), "interrupted by %v while acquiring %s; nothing started", sig, r.Resource)
	default:
	}
	if err != nil {
		return nil, s.fail(err)
	}
	return lease, nil
}

// supervise runs the command while the lease lasts and returns its exit
// code, or an exitError when the lease was lost.
func (r *runCmd) supervise(lease *client.Lease, path string, sigs <-chan os.Signal) (int, error) {
	cmd := exec.Command(path, r.Command[1:]...)
	cmd.Args[0] = r.Command[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"JETLOCK_RESOURCE="+lease.Resource(),
		"JETLOCK_TOKEN="+strconv.FormatUint(lease.Token(), 10),
		"JETLOCK_LEASE_ID="+lease.ID())
	cmd.SysProcAttr = childAttr()
	becomeSubreaper()
	if err := cmd.Start(); err != nil {
		return 0, exitf(exitCannotExec, "cannot run %s: %v", r.Command[0], err)
	}
	g := &group{p: cmd.Process}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()

	lost := lease.Lost()
	var lostErr error
	var kill <-chan time.Time
	for {
		select {
		case <-done:
			if lostErr != nil {
				g.finish(time.Until(g.killAt), time.Second)
				return 0, &exitError{code: exitLost}
			}
			// The group outlives its leader only if it left processes
			// behind: they are part of the work under the lock.
			g.stop(r.Grace)
			return exitCode(cmd.ProcessState), nil
		case sig := <-sigs:
			g.signal(sig)
		case <-lost:
			lost = nil
			lostErr = context.Cause(lease.Context())
			fmt.Fprintf(os.Stderr, "jetlock: %s: %s: stopping the command (SIGTERM now, SIGKILL in %v)\n",
				streams.CodeLeaseLost, strings.TrimPrefix(oneLine(clean(lostErr)), "lease lost: "), r.Grace)
			g.terminate()
			g.killAt = time.Now().Add(r.Grace)
			kill = time.After(r.Grace)
		case <-kill:
			kill = nil
			g.kill()
		}
	}
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
