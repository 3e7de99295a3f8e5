//go:build !linux

package devcluster

import (
	"os"
	"os/exec"
)

// setProcAttr does nothing where no parent-death signal exists: a child
// still goes when its stdin closes (NodeMain watches it), and a Ctrl-C on
// the terminal reaches the children as well as this process.
func setProcAttr(*exec.Cmd) {}

// terminate asks p to shut down with an interrupt, or kills it where that
// cannot be sent (Windows).
func terminate(p *os.Process) error {
	if err := p.Signal(os.Interrupt); err != nil {
		return p.Kill()
	}
	return nil
}
