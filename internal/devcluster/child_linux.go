package devcluster

import (
	"os"
	"os/exec"
	"syscall"
)

// setProcAttr puts the child in a process group of its own, so that a
// Ctrl-C on the terminal reaches only this process, which then stops its
// children in order; and has the kernel kill the child should this process
// die without stopping it.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// terminate asks p to shut down.
func terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }
