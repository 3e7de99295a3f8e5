//go:build unix

package devcluster

import "syscall"

// lameDuckSignal is the signal that puts nats-server in lame duck mode.
const lameDuckSignal = syscall.SIGUSR2
