//go:build !unix

package main

import (
	"os"
	"syscall"
	"time"
)

// forwardedSignals reach `jetlock run`; without process groups the
// command is killed on any of them.
var forwardedSignals = []os.Signal{os.Interrupt}

// childAttr: no process groups here.
func childAttr() *syscall.SysProcAttr { return nil }

// group is the command's process alone: this platform has no process
// groups to signal, so terminate and kill both kill the process.
type group struct {
	p      *os.Process
	killAt time.Time
}

func (g *group) signal(os.Signal) { _ = g.p.Kill() }
func (g *group) terminate()       { _ = g.p.Kill() }
func (g *group) kill()            { _ = g.p.Kill() }

func (g *group) finish(time.Duration, time.Duration) {}
func (g *group) stop(time.Duration)                  {}

func exitCode(ps *os.ProcessState) int { return ps.ExitCode() }

func signalNumber(os.Signal) int { return 2 }
