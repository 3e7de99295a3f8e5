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
