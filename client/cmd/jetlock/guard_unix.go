//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// guardArg, as jetlock's first argument, makes it a command's guard:
//
//	jetlock __jetlock_guard GRACE DEADLINE PATH ARGV0 ARGS...
//
// with the control pipe as fd 3 and the events pipe as fd 4 (see
// guard.go). GRACE is a Go duration, DEADLINE the client's deadline in Unix
// nanoseconds (jetlock moves it over the pipe from then on).
const guardArg = "__jetlock_guard"

// guardCommand runs the guard when args (jetlock's, less its name) ask
// for it, and returns its exit code and true. The guard is jetlock
// re-executed; main asks before it parses any flag, so that the guard
// starts fast and shares nothing with the commands.
func guardCommand(args []string) (int, bool) {
	if len(args) == 0 || args[0] != guardArg {
		return 0, false
	}
	return guardMain(args[1:]), true
}

// forwardedSignals reach `jetlock run` and are passed on to the command's
// process group.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// guardHeld are the signals the guard catches and drops: those a terminal
// or a supervisor sends to jetlock's whole process group, which jetlock
// forwards itself (and SIGTSTP, so that Ctrl-Z, which stops jetlock and
// its renewals, leaves the guard to stop the command at the deadline).
// They are caught, not ignored, so that the command starts with the
// default disposition of each.
var guardHeld = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU}

// guardMain is the guard process: it starts the command and serves it.
func guardMain(args []string) int {
	if len(args) < 4 || !isPipe(3) || !isPipe(4) {
		fmt.Fprintln(os.Stderr, "jetlock: usage: "+guardArg+" is internal to jetlock run")
		return exitUsage
	}
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	ctl, ev := os.NewFile(3, "jetlock-control"), os.NewFile(4, "jetlock-events")
	grace, err1 := time.ParseDuration(args[0])
	ns, err2 := strconv.ParseInt(args[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		writeEvent(ev, guardEvent{kind: evFailed, n: exitCannotExec, text: "guard: " + err.Error()})
		return exitUsage
	}
	// On the monotonic clock from here on.
	deadline := time.Now().Add(time.Until(time.Unix(0, ns)))
	path, argv := args[2], args[3:]

	signal.Notify(make(chan os.Signal, 1), guardHeld...)
	wake := make(chan os.Signal, 1)
	signal.Notify(wake, syscall.SIGCHLD)
	becomeSubreaper()
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{0, 1, 2},
		Sys:   commandAttr(),
	})
	if err != nil {
		code := exitCannotExec
		if errors.Is(err, syscall.ENOENT) {
			code = exitNotFound
		}
		writeEvent(ev, guardEvent{kind: evFailed, n: code, text: err.Error()})
		return 0
	}
	writeEvent(ev, guardEvent{kind: evStarted, n: pid})
	serveGuard(&pgroup{pgid: pid}, wake, ctl, ev, grace, deadline)
	return 0
}

func isPipe(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFIFO
}

// pgroup is the command's process group, and on Linux every orphan of it
// handed to the guard (a subreaper), even one that left the group.
type pgroup struct {
	pgid   int
	exited bool
	code   int
}

func (g *pgroup) forward(sig int) { _ = syscall.Kill(-g.pgid, syscall.Signal(sig)) }
func (g *pgroup) terminate()      { g.send(syscall.SIGTERM) }
func (g *pgroup) kill()           { g.send(syscall.SIGKILL) }
func (g *pgroup) cont()           { _ = syscall.Kill(-g.pgid, syscall.SIGCONT) }

// send signals the group, then the guard's children that left it (the
// orphans it adopted as a subreaper): each process once, the command
// included, which is both the guard's child and in the group. A child's
// pid cannot be reused before the guard reaps it, which only this
// goroutine does.
func (g *pgroup) send(sig syscall.Signal) {
	_ = syscall.Kill(-g.pgid, sig)
	for _, pid := range children() {
		if pg, err := syscall.Getpgid(pid); err == nil && pg == g.pgid {
			continue // the group's signal reached it
		}
		_ = syscall.Kill(pid, sig)
	}
}

func (g *pgroup) reap() (exited bool, code int, left bool, frozenBy int) {
	children := true
	for range 10_000 {
		var ws syscall.WaitStatus
		// WUNTRACED: a stopped command is reported too (see frozen).
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG|syscall.WUNTRACED, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			children = !errors.Is(err, syscall.ECHILD)
			break
		}
		if pid <= 0 {
			break
		}
		switch {
		case pid != g.pgid:
		case ws.Stopped():
			if sig := ws.StopSignal(); sig == syscall.SIGTTIN || sig == syscall.SIGTTOU {
				frozenBy = int(sig)
			}
		case ws.Exited(), ws.Signaled():
			g.exited, g.code = true, waitCode(ws)
		}
	}
	return g.exited, g.code, children || !errors.Is(syscall.Kill(-g.pgid, 0), syscall.ESRCH), frozenBy
}

// waitCode is an exit status as a shell reports it.
func waitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return exitSignalBase + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// startGuarded starts the guard, which starts the command (path, with
// argv and env) in a process group of its own.
func startGuarded(path string, argv, env []string, grace time.Duration, deadline time.Time) (*guarded, error) {
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, exitf(exitCannotExec, "cannot run %s: %v", argv[0], err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, exitf(exitCannotExec, "cannot run %s: %v", argv[0], err)
	}
	self, err := selfExe()
	if err == nil {
		cmd := exec.Command(self, append([]string{guardArg, grace.String(), strconv.FormatInt(deadline.UnixNano(), 10), path}, argv...)...)
		cmd.Args[0] = os.Args[0]
		cmd.Env = env
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.ExtraFiles = []*os.File{ctlR, evW}
		if err = cmd.Start(); err == nil {
			ctlR.Close()
			evW.Close()
			g := &guarded{ctl: ctlW, events: make(chan guardEvent, 4), wait: func() { _ = cmd.Wait() }}
			go g.readEvents(evR)
			if err := g.started(argv[0]); err != nil {
				g.close()
				return nil, err
			}
			return g, nil
		}
	}
	for _, f := range []*os.File{ctlR, ctlW, evR, evW} {
		f.Close()
	}
	return nil, exitf(exitCannotExec, "cannot run %s: cannot start its guard: %v", argv[0], err)
}

// abandon kills the command's group when its guard died without
// reporting (it was killed): nothing else would.
func (g *guarded) abandon() {
	_ = syscall.Kill(-g.pid, syscall.SIGKILL)
}

// stopSignalName names a signal that froze the command (see guard.go).
func stopSignalName(n int) string {
	switch syscall.Signal(n) {
	case syscall.SIGTTIN:
		return "SIGTTIN"
	case syscall.SIGTTOU:
		return "SIGTTOU"
	}
	return syscall.Signal(n).String()
}

func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}
