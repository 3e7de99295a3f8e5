package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER of prctl(2).
const prSetChildSubreaper = 36

// becomeSubreaper makes the guard the parent of the command's orphaned
// descendants, even of those that double-forked out of its process group
// (a daemon), so that the guard reaps those that die, sees those that
// live, and kills them with the group. Best effort.
func becomeSubreaper() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// commandAttr puts the command in a process group of its own, whose id is
// its pid, and has the kernel SIGKILL it should the guard die (the guard
// never exits before it; only a SIGKILL of the guard does that, and then
// jetlock kills the group, if it is still there). Go starts the command
// from a thread that lives as long as the guard: no goroutine of the guard
// locks a thread and exits.
func commandAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// children lists the guard's child processes, from /proc (the fourth field
// of /proc/PID/stat is the parent's pid). At most 100,000 are looked at.
func children() []int {
	dir, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer dir.Close()
	names, _ := dir.Readdirnames(100_000)
	self := os.Getpid()
	var pids []int
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		// The command name, in parentheses, may hold spaces.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(self) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// selfExe is the running jetlock binary: /proc/self/exe still leads to it
// when the file was replaced or removed since (an upgrade during a run).
func selfExe() (string, error) { return "/proc/self/exe", nil }
