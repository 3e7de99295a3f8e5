//go:build unix && !linux

package main

import (
	"os"
	"syscall"
)

// becomeSubreaper does nothing here: orphans go to init, which reaps them;
// one that left the command's process group is out of the guard's reach.
func becomeSubreaper() {}

// commandAttr puts the command in a process group of its own, whose id is
// its pid. Without a parent-death signal here, a command whose guard was
// SIGKILLed is killed by jetlock, if jetlock is still there.
func commandAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// children lists nothing here: without a subreaper the guard's only child
// is the command, a member of its group.
func children() []int { return nil }

func selfExe() (string, error) { return os.Executable() }
