//go:build unix

package devcluster

import "syscall"

// lameDuckSignal is the signal that puts nats-server in lame duck mode;
// a node process catches it where it exists (canLameDuck).
const (
	lameDuckSignal = syscall.SIGUSR2
	canLameDuck    = true
)
