package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// The guard is the parent of `jetlock run`'s command. On Unix it is a
// second jetlock process (see guard_unix.go) that starts the command in a
// process group of its own and ends that group — one SIGTERM, then SIGKILL
// — in four cases:
//
//   - jetlock says so (the lease was lost: refused renewal, revoke);
//   - the lease's deadline, as jetlock last reported it, is --grace away
//     and jetlock has not moved it since (renewals failed, or jetlock is
//     stopped or hung), so that SIGKILL comes at the client's deadline at
//     the latest, before the service can expire the lease. Should jetlock
//     move the deadline before SIGKILL (a renewal got through after a
//     short outage), the stop is called off: the lease never ended;
//   - jetlock goes away, for any reason, SIGKILL included: the guard's end
//     of the control pipe reads EOF;
//   - the command is frozen: stopped by SIGTTIN or SIGTTOU, as a process
//     of a background group is when it reads from (or, with stty tostop,
//     writes to) the terminal. Its group is never the terminal's
//     foreground group, so it would stay stopped, holding the lock, until
//     the hold cap. The guard sends SIGTERM and SIGCONT (a stopped process
//     acts on SIGTERM only once continued), and SIGKILL after the grace.
//
// The guard talks with jetlock over two pipes, one line per message.
// jetlock to guard (control):
//
//	deadline NS   the client's deadline is NS nanoseconds from now
//	signal N      forward signal N to the group
//	stop          the lease is lost: SIGTERM now, SIGKILL after the grace
//
// guard to jetlock (events):
//
//	started PID   the command runs, as the leader of group PID
//	failed CODE M the command could not start (CODE 126 or 127, M why)
//	expiring      the deadline came near unmoved: the group got SIGTERM
//	resumed       the deadline moved before SIGKILL: the stop is called off
//	frozen N      the command was stopped by signal N (SIGTTIN, SIGTTOU):
//	              the group got SIGTERM and SIGCONT
//	exited CODE   the command exited with CODE (128+N: signal N) and its
//	              group is gone (or was SIGKILLed and did not go within
//	              guardSettle)
//
// Whenever it stops the group, the guard sends SIGKILL at the earlier of
// the grace's end and the deadline.

// Lines of the guard's protocol.
const (
	msgDeadline = "deadline"
	msgSignal   = "signal"
	msgStop     = "stop"

	evStarted  = "started"
	evFailed   = "failed"
	evExpiring = "expiring"
	evResumed  = "resumed"
	evFrozen   = "frozen"
	evExited   = "exited"
)

// guardSettle is how long the guard waits for the group to go after
// SIGKILL (a process in uninterruptible sleep dies late) before it reports
// the exit anyway.
const guardSettle = time.Second

// guardPoll is how often the guard looks for what is left of a group it is
// stopping (a member that is not its child dies without telling it).
const guardPoll = 20 * time.Millisecond

// guardMsg is one instruction of jetlock to the guard.
type guardMsg struct {
	kind string
	n    int64
}

// guardEvent is one report of the guard to jetlock.
type guardEvent struct {
	kind string
	n    int
	text string
}

// procs is the command and what it started, as the guard reaches them.
type procs interface {
	// forward sends a signal that jetlock caught to the group.
	forward(sig int)
	// terminate sends SIGTERM, and kill SIGKILL, to every process left,
	// each process once; cont sends SIGCONT to the group.
	terminate()
	kill()
	cont()
	// reap collects what has exited and reports whether the command (the
	// leader) has, with its exit code, and whether anything is left; and
	// the signal that froze the command (SIGTTIN, SIGTTOU) when it was
	// stopped by one since the last reap, else 0.
	reap() (exited bool, code int, left bool, frozenBy int)
}

// Why the guard stops the group.
const (
	stopLost     = iota + 1 // jetlock said so
	stopExpiring            // the deadline came near unmoved
	stopGone                // jetlock went away
	stopLeft                // the command exited, leaving processes in its group
	stopFrozen              // the command was frozen
)

// guard decides when the command's group is stopped.
type guard struct {
	p        procs
	grace    time.Duration
	deadline time.Time // the client's deadline as jetlock last reported it
	wake     <-chan os.Signal
	ctl      <-chan guardMsg // closed when jetlock's end of the pipe closes
	emit     func(guardEvent)

	stopping int // why the group is being stopped (stopLost…), 0 if not
	killAt   time.Time
	killedAt time.Time
	exited   bool // the command has exited, with code
	code     int
}

// run supervises the command until it and what it left are gone, and
// returns its exit code. Every wait in it ends by the deadline's timer
// unless jetlock keeps moving the deadline, and once stopping, within
// grace + guardSettle.
func (g *guard) run() int {
	termT, killT := time.NewTimer(time.Until(g.deadline.Add(-g.grace))), time.NewTimer(time.Hour)
	killT.Stop()
	defer termT.Stop()
	defer killT.Stop()
	ticker := time.NewTicker(guardPoll)
	defer ticker.Stop()
	// Timers sleep on the monotonic clock, which stops while the host is
	// suspended; the service's clocks go on. Once a second the wall clock
	// is looked at too, so that a suspend makes the stop late by a second
	// at most, not by the time asleep.
	wallCheck := time.NewTicker(time.Second)
	defer wallCheck.Stop()
	var tick <-chan time.Time
	for {
		if code, over := g.reapStep(killT); over {
			return code
		}
		if g.stopping != 0 {
			tick = ticker.C
		}
		select {
		case m, ok := <-g.ctl:
			g.control(m, ok, termT, killT)
		case <-termT.C:
			if g.stopping == 0 {
				g.emit(guardEvent{kind: evExpiring})
				g.stop(killT, stopExpiring)
			}
		case <-killT.C:
			g.p.kill()
			g.killedAt = time.Now()
		case <-wallCheck.C:
			g.checkWall(killT)
		case <-g.wake:
		case <-tick:
			if !g.killedAt.IsZero() {
				g.p.kill() // orphans handed to the guard since
			}
		}
	}
}

// reapStep collects what has exited and reports, once the command and
// what it left are gone (or killed and settled), its exit code. A frozen
// command is stopped; a command that exited leaving processes in its
// group has them stopped too.
func (g *guard) reapStep(killT *time.Timer) (code int, over bool) {
	done, c, left, frozenBy := g.p.reap()
	if done && !g.exited {
		g.exited, g.code = true, c
	}
	if frozenBy != 0 && !done && g.killedAt.IsZero() {
		g.emit(guardEvent{kind: evFrozen, n: frozenBy})
		g.stop(killT, stopFrozen)
		g.p.cont() // a stopped process acts on SIGTERM once continued
	}
	if g.exited && !left {
		return g.code, true
	}
	if !g.killedAt.IsZero() && time.Since(g.killedAt) > guardSettle {
		if !g.exited {
			g.code = exitSignalBase + 9
		}
		return g.code, true
	}
	if g.exited && g.stopping == 0 {
		// The group outlives its leader only if it left processes
		// behind: they are part of the work under the lock.
		g.stop(killT, stopLeft)
	}
	return 0, false
}

// control acts on message m from jetlock (ok false: its end of the pipe
// closed, so nothing renews the lease any more).
func (g *guard) control(m guardMsg, ok bool, termT, killT *time.Timer) {
	if !ok {
		g.ctl = nil
		g.stop(killT, stopGone)
		return
	}
	switch m.kind {
	case msgDeadline:
		g.moveDeadline(time.Now().Add(time.Duration(m.n)), termT, killT)
	case msgSignal:
		g.p.forward(int(m.n))
	case msgStop:
		g.stop(killT, stopLost)
	}
}

// checkWall stops the group, or kills it, once the wall clock has passed
// the time to (the timers' monotonic clock stops while the host sleeps).
func (g *guard) checkWall(killT *time.Timer) {
	switch {
	case g.stopping == 0 && wallPassed(g.deadline.Add(-g.grace)):
		g.emit(guardEvent{kind: evExpiring})
		g.stop(killT, stopExpiring)
	case g.stopping != 0 && g.killedAt.IsZero() && wallPassed(g.killAt):
		killT.Stop()
		g.p.kill()
		g.killedAt = time.Now()
	}
}

// moveDeadline takes the deadline jetlock reports after a renewal. A stop
// that began only because the deadline came near is called off if the
// new deadline leaves the whole grace again and SIGKILL has not been
// sent: the lease never ended (a short outage). The command got SIGTERM
// all the same; what it makes of it is its own business.
func (g *guard) moveDeadline(d time.Time, termT, killT *time.Timer) {
	switch {
	case g.stopping == 0:
	case g.stopping == stopExpiring && g.killedAt.IsZero() && time.Now().Before(d.Add(-g.grace)):
		g.stopping = 0
		killT.Stop()
		g.emit(guardEvent{kind: evResumed})
	default:
		return
	}
	g.deadline = d
	termT.Reset(time.Until(d.Add(-g.grace)))
}

// stop sends SIGTERM to the group, and arms SIGKILL for the end of the
// grace or the deadline, whichever comes first; why says what started it.
func (g *guard) stop(killT *time.Timer, why int) {
	if g.stopping != 0 {
		return
	}
	g.stopping = why
	g.p.terminate()
	g.killAt = time.Now().Add(g.grace)
	if g.deadline.Before(g.killAt) {
		g.killAt = g.deadline
	}
	killT.Reset(time.Until(g.killAt))
}

// wallPassed reports whether the wall clock has reached t (read with
// time.Now, so carrying both clocks' readings).
func wallPassed(t time.Time) bool { return !time.Now().Round(0).Before(t.Round(0)) }

// serveGuard runs the guard of a started command: it reads jetlock's
// instructions from ctl until EOF, supervises the command, and reports its
// exit on ev.
func serveGuard(p procs, wake <-chan os.Signal, ctl io.Reader, ev io.Writer, grace time.Duration, deadline time.Time) {
	msgs := make(chan guardMsg, 16)
	go readGuardMsgs(ctl, msgs)
	emit := func(e guardEvent) { writeEvent(ev, e) }
	g := &guard{p: p, grace: grace, deadline: deadline, wake: wake, ctl: msgs, emit: emit}
	emit(guardEvent{kind: evExited, n: g.run()})
}

// readGuardMsgs parses jetlock's instructions into msgs, and closes it at
// EOF or on any error (jetlock is gone either way). A line it does not
// understand is skipped.
func readGuardMsgs(r io.Reader, msgs chan<- guardMsg) {
	defer close(msgs)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		kind, arg, _ := strings.Cut(sc.Text(), " ")
		n, _ := strconv.ParseInt(arg, 10, 64)
		msgs <- guardMsg{kind: kind, n: n}
	}
}

// writeEvent writes one event line; an error means jetlock is gone, and
// the guard carries on without it.
func writeEvent(w io.Writer, e guardEvent) {
	line := e.kind
	if e.kind != evExpiring && e.kind != evResumed {
		line += " " + strconv.Itoa(e.n)
	}
	if e.text != "" {
		line += " " + oneLine(e.text)
	}
	_, _ = io.WriteString(w, line+"\n")
}

// parseEvent reads one event line.
func parseEvent(line string) guardEvent {
	kind, rest, _ := strings.Cut(line, " ")
	num, text, _ := strings.Cut(rest, " ")
	n, _ := strconv.Atoi(num)
	return guardEvent{kind: kind, n: n, text: text}
}

// guarded is a command under its guard, as jetlock sees it.
type guarded struct {
	pid    int            // the command's pid, and its process group's id
	ctl    io.WriteCloser // instructions to the guard
	events chan guardEvent
	wait   func() // waits for the guard to end, after ctl is closed
}

// readEvents parses the guard's events into g.events, closed at EOF.
func (g *guarded) readEvents(r io.ReadCloser) {
	defer close(g.events)
	defer r.Close()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		g.events <- parseEvent(sc.Text())
	}
}

// started waits for the guard's first event: the command's pid, or why it
// could not start.
func (g *guarded) started(name string) error {
	ev, ok := <-g.events
	switch {
	case ok && ev.kind == evStarted:
		g.pid = ev.n
		return nil
	case ok && ev.kind == evFailed:
		return exitf(ev.n, "cannot run %s: %s", name, ev.text)
	}
	return exitf(exitCannotExec, "cannot run %s: its guard process did not start it", name)
}

func (g *guarded) send(kind string, n int64) {
	// An error means the guard is gone, which events reports.
	_, _ = fmt.Fprintf(g.ctl, "%s %d\n", kind, n)
}

// setDeadline tells the guard the client's deadline: how long until it,
// by the clock that reaches it first (the monotonic one stops while the
// host is suspended, the wall clock does not).
func (g *guarded) setDeadline(d time.Time) {
	g.send(msgDeadline, int64(min(time.Until(d), d.Round(0).Sub(time.Now().Round(0)))))
}

// signal forwards sig to the command's group.
func (g *guarded) signal(sig os.Signal) {
	if n := signalNumber(sig); n > 0 {
		g.send(msgSignal, int64(n))
	}
}

// stop has the guard stop the group: SIGTERM now, SIGKILL after the grace
// or at the deadline, whichever comes first.
func (g *guarded) stop() { g.send(msgStop, 0) }

// close ends the conversation (which stops the group if it still runs)
// and waits for the guard.
func (g *guarded) close() {
	_ = g.ctl.Close()
	for range g.events {
	}
	g.wait()
}
