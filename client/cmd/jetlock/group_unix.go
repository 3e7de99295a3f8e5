//go:build unix

package main

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// forwardedSignals reach `jetlock run` and are passed on to the command's
// process group.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// childAttr puts the command in a process group of its own, whose id is
// its pid (and, on Linux, has it sent SIGTERM should jetlock die).
func childAttr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	setDeathSignal(a)
	return a
}

// group is the command's process group.
type group struct {
	p      *os.Process
	killAt time.Time
}

func (g *group) send(sig syscall.Signal) { _ = syscall.Kill(-g.p.Pid, sig) }

// signal forwards sig to the group.
func (g *group) signal(sig os.Signal) {
	if s, ok := sig.(syscall.Signal); ok {
		g.send(s)
	}
}

func (g *group) terminate() { g.send(syscall.SIGTERM) }
func (g *group) kill()      { g.send(syscall.SIGKILL) }

// alive reports whether any process of the group is left. It is called
// only once the leader has been waited for, and first reaps the members
// that died as jetlock's children (see becomeSubreaper), which would
// otherwise stay in the group as zombies.
func (g *group) alive() bool {
	for range 10_000 {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-g.p.Pid, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			break
		}
	}
	return !errors.Is(syscall.Kill(-g.p.Pid, 0), syscall.ESRCH)
}

// waitGone waits up to d for the group to be empty.
func (g *group) waitGone(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for g.alive() {
		if !time.Now().Before(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// finish waits up to grace for what is left of a group that got SIGTERM,
// kills the rest, and waits up to settle for them to go.
func (g *group) finish(grace, settle time.Duration) {
	if !g.waitGone(max(grace, 0)) {
		g.kill()
		g.waitGone(settle)
	}
}

// stop ends what is left of the group after its leader exited: SIGTERM,
// SIGKILL after grace.
func (g *group) stop(grace time.Duration) {
	if !g.alive() {
		return
	}
	g.terminate()
	g.finish(grace, time.Second)
}

// exitCode is the command's exit status as a shell reports it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignalBase + int(ws.Signal())
	}
	return ps.ExitCode()
}

func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}
