//go:build !unix

package main

import (
	"os"
	"os/exec"
	"strconv"
	"time"
)

// forwardedSignals reach `jetlock run`; without process groups the
// command is killed on any of them.
var forwardedSignals = []os.Signal{os.Interrupt}

// guardCommand is false: the guard runs inside jetlock on this platform.
func guardCommand([]string) (int, bool) { return 0, false }

// startGuarded runs the guard inside jetlock, as a goroutine, over the
// same pipes as on Unix: this platform has no process groups to hand to a
// guard process, so the command is a child of jetlock and dies alone, and
// a jetlock killed outright leaves it running (only fencing stops its late
// writes).
func startGuarded(path string, argv, env []string, grace time.Duration, deadline time.Time) (*guarded, error) {
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, exitf(exitCannotExec, "cannot run %s: %v", argv[0], err)
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, exitf(exitCannotExec, "cannot run %s: %v", argv[0], err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		ctlR.Close()
		ctlW.Close()
		return nil, exitf(exitCannotExec, "cannot run %s: %v", argv[0], err)
	}
	p := &process{p: cmd.Process, done: make(chan struct{})}
	wake := make(chan os.Signal, 1)
	go func() {
		_ = cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		close(p.done)
		wake <- os.Interrupt // any value: the command exited
	}()
	served := make(chan struct{})
	go func() {
		defer close(served)
		serveGuard(p, wake, ctlR, evW, grace, deadline)
		evW.Close()
		ctlR.Close()
	}()
	g := &guarded{pid: cmd.Process.Pid, ctl: ctlW, events: make(chan guardEvent, 4), wait: func() { <-served }}
	go g.readEvents(evR)
	return g, nil
}

// process is the command's process alone: this platform has no process
// groups to signal, so every signal kills the process.
type process struct {
	p    *os.Process
	done chan struct{}
	code int
}

func (p *process) forward(int) { _ = p.p.Kill() }
func (p *process) terminate()  { _ = p.p.Kill() }
func (p *process) kill()       { _ = p.p.Kill() }
func (p *process) cont()       {}

func (p *process) reap() (exited bool, code int, left bool, frozenBy int) {
	select {
	case <-p.done:
		return true, p.code, false, 0
	default:
		return false, 0, true, 0
	}
}

// abandon has nothing to kill here: the guard lives in jetlock.
func (g *guarded) abandon() {}

func signalNumber(os.Signal) int { return 2 }

// stopSignalName is never needed here: nothing stops the command.
func stopSignalName(n int) string { return "signal " + strconv.Itoa(n) }
