package main

import "syscall"

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER of prctl(2).
const prSetChildSubreaper = 36

// becomeSubreaper makes jetlock the parent of the command's orphaned
// descendants, so that jetlock can reap those that die and tell when the
// group is gone, even where init is slow to reap (some containers' pid 1
// never does). Best effort.
func becomeSubreaper() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// setDeathSignal has the kernel send the command SIGTERM when jetlock
// dies (even by SIGKILL), so that it does not run on unrenewed. Go starts
// the command from a thread that lives as long as jetlock: no goroutine of
// jetlock locks a thread and exits.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGTERM }
