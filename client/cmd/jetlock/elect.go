package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

// electCmd is `jetlock elect`: stand for an election, and run the command
// while leading (as `jetlock run` runs it while holding a lock).
type electCmd struct {
	Value     string         `help:"The leader's value, shown to everyone by 'jetlock leader' (an address, a host name; 1 to 1024 bytes; default: HOST:PID)."`
	Wait      time.Duration  `help:"Wait as a standby at most this long, then exit 75 (default: until elected)." placeholder:"D"`
	TTL       time.Duration  `name:"ttl" help:"Leadership TTL (default: the service's, 30s): how long a leader that vanished keeps the election; renewed every third of it." placeholder:"D"`
	MaxHold   time.Duration  `help:"Longest one leadership may last; the command is stopped then (default: the deployment's cap, 24h)." placeholder:"D"`
	Owner     string         `help:"Owner text shown to the leader's own NATS user and operators (default: HOST:PID)."`
	RequestID string         `help:"Request id of the campaign (default: random); reuse it to make a retried elect idempotent."`
	Grace     *time.Duration `help:"After leadership is lost, how long the command has between SIGTERM and SIGKILL (as run's --grace)." placeholder:"D"`

	Name    string   `arg:"" help:"Election name: letters, digits and - _ . / = : @ (1 to 200 bytes)."`
	Command []string `arg:"" optional:"" help:"The command and its arguments, after --."`
}

// Help is the long help of `jetlock elect`.
func (e *electCmd) Help() string {
	return `Stands for election NAME with --value, waits as a standby (in FIFO order
with the other candidates) until elected, then runs the command while this
process leads, exactly as 'jetlock run' runs a command while it holds a
lock: in its own process group, with JETLOCK_RESOURCE (NAME), JETLOCK_TOKEN
(the leader's fencing token: pass it with every write, so that a deposed
leader's late writes are refused) and JETLOCK_LEASE_ID in its environment.
When the command exits, jetlock resigns and the next standby is elected at
once; it exits with the command's code.

When leadership is lost (renewals refused or unconfirmed, a revoke, the
hold cap), the command gets SIGTERM, then SIGKILL after --grace, before the
service could elect anyone else, and jetlock exits 79. SIGINT, SIGTERM and
SIGHUP while waiting withdraw the candidacy (exit 128+N); while leading they
go to the command.

'jetlock leader NAME' shows the leader's value and token; --watch follows it.

Example:
  jetlock elect --ttl 10s scheduler --value "$(hostname):8080" -- ./scheduler`
}

// Validate checks the flags before anything connects or starts.
func (e *electCmd) Validate() error {
	if err := checkResource(e.Name); err != nil {
		return err
	}
	if len(e.Command) == 0 || e.Command[0] == "" {
		return usagef("no command after --: jetlock elect NAME [--value V] -- CMD [ARGS...]")
	}
	return firstErr(
		checkText("value", e.Value, streams.ValidateValue),
		checkDuration("wait", e.Wait, time.Millisecond, 366*24*time.Hour),
		checkDuration("ttl", e.TTL, time.Second, streams.MaxRecordTTL),
		checkDuration("max-hold", e.MaxHold, time.Second, streams.MaxHoldCeiling),
		checkGrace(e.Grace, e.TTL),
		checkText("owner", e.Owner, streams.ValidateOwner),
		checkText("request-id", e.RequestID, optional(streams.ValidateRequestID)),
	)
}

// Run campaigns, runs the command while leading and returns its exit.
func (e *electCmd) Run(g *globals) error {
	r := &runCmd{Grace: e.Grace, TTL: e.TTL, Command: e.Command}
	return r.hold(g, e.campaign)
}

// campaign waits until elected, giving up on the first signal.
func (e *electCmd) campaign(g *globals, s *session, sigs <-chan os.Signal) (*client.Lease, error) {
	ctx, cancel := context.WithCancel(s.ctx)
	if e.Wait > 0 {
		ctx, cancel = context.WithTimeout(s.ctx, e.Wait+4*g.Timeout)
	}
	defer cancel()
	value := e.Value
	if value == "" {
		value = defaultOwner()
	}
	if value == "" {
		value = "pid:" + strconv.Itoa(os.Getpid())
	}
	spec := acquireSpec{resources: []string{e.Name}, owner: e.Owner, requestID: e.RequestID, ttl: e.TTL, maxHold: e.MaxHold,
		wait: e.Wait, value: value}
	return spec.take(ctx, cancel, s, sigs, 2*g.Timeout, "withdrawn, nothing started")
}

// leaderCmd is `jetlock leader`: who leads an election, and with --watch
// every change.
type leaderCmd struct {
	Watch bool          `help:"Print every change of the leader until interrupted (or --for)."`
	For   time.Duration `name:"for" help:"With --watch, stop after this long (default: until Ctrl-C)." placeholder:"D"`
	JSON  bool          `name:"json" help:"Print JSON: one object, or one per change with --watch; errors as JSON too."`
	Name  string        `arg:"" help:"Election name."`
}

// Help is the long help of `jetlock leader`.
func (c *leaderCmd) Help() string {
	return `Prints the current leader of election NAME: its value and fencing token
("NAME: no leader" when there is none; exit 0 either way). A status read:
right after a leader change it may show the one before.

--watch prints the current state, then every change as the service
announces it (elected, proclaimed, ended), in order, until Ctrl-C or --for.
Announcements are at most once: after a missed one (a reconnect) and every
few seconds, jetlock reads the status again, and a change found that way is
marked "(resync)". It needs the right to subscribe to the service's events
(callers have it in the dev cluster and in deploy/).

Example:
  jetlock leader scheduler
  jetlock leader --watch --json scheduler`
}

// Validate checks the flags before anything connects.
func (c *leaderCmd) Validate() error {
	if err := checkResource(c.Name); err != nil {
		return err
	}
	if c.For != 0 && !c.Watch {
		return usagef("--for without --watch")
	}
	return checkDuration("for", c.For, time.Millisecond, 366*24*time.Hour)
}

// leaderJSON is one line of leader --json: the state, or a change.
type leaderJSON struct {
	Time     string `json:"time,omitempty"`
	Election string `json:"election"`
	Event    string `json:"event,omitempty"`
	Leader   bool   `json:"leader"`
	Token    uint64 `json:"token,omitempty"`
	Value    string `json:"value,omitempty"`
	Revision uint64 `json:"revision,omitempty"`
	Resync   bool   `json:"resync,omitempty"`
}

// Run prints the leader, or follows it.
func (c *leaderCmd) Run(g *globals) error {
	if c.Watch {
		return c.watch(g)
	}
	var li *client.LeaderInfo
	err := g.request(func(ctx context.Context, cl *client.Client) error {
		e, err := cl.NewElection(c.Name)
		if err != nil {
			return err
		}
		li, err = e.Leader(ctx)
		if errors.Is(err, client.ErrNoLeader) {
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	switch {
	case c.JSON && li == nil:
		return printJSON(leaderJSON{Election: c.Name})
	case c.JSON:
		return printJSON(leaderJSON{Election: c.Name, Leader: true, Token: li.Token, Value: li.Value})
	case li == nil:
		fmt.Printf("%s: no leader\n", c.Name)
	default:
		fmt.Printf("%s: leader %s, token %d\n", c.Name, strconv.Quote(li.Value), li.Token)
	}
	return nil
}

// watch prints the changes of the leader until interrupted or --for.
func (c *leaderCmd) watch(g *globals) error {
	s, err := g.connect()
	if err != nil {
		return err
	}
	defer s.close()
	ctx, stop := s.untilInterrupted(c.For)
	defer stop()
	e, err := s.c.NewElection(c.Name)
	if err != nil {
		return s.fail(err)
	}
	for ch := range e.Observe(ctx) {
		c.print(ch)
	}
	if errors.Is(context.Cause(s.ctx), errPermission) {
		return s.fail(ctx.Err())
	}
	if s.nc.IsClosed() {
		return kindf(exitUnavailable, streams.CodeUnavailable, "the connection closed")
	}
	return nil
}

func (c *leaderCmd) print(ch client.LeaderChange) {
	at := streams.FormatTime(time.Now())
	if c.JSON {
		_ = printJSON(leaderJSON{Time: at, Election: c.Name, Event: ch.Event, Leader: ch.Leader, Token: ch.Token, Value: ch.Value,
			Revision: ch.Revision, Resync: ch.Resync})
		return
	}
	event := ch.Event
	if !ch.Leader && ch.Token == 0 {
		event = "none" // no leader, and none seen
	}
	line := fmt.Sprintf("%s  %-10s %s", at, event, c.Name)
	switch {
	case ch.Leader:
		line += fmt.Sprintf("  token=%d value=%s", ch.Token, strconv.Quote(ch.Value))
	case ch.Token != 0:
		line += fmt.Sprintf("  token=%d (no leader)", ch.Token)
	default:
		line += "  (no leader)"
	}
	if ch.Resync {
		line += " (resync)"
	}
	fmt.Println(line)
}
