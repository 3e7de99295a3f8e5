//go:build !unix

package devcluster

import "os"

// lameDuckSignal stands for nats-server's lame duck signal (SIGUSR2) where
// there is none: an interrupt, which a node takes as a plain shutdown.
var lameDuckSignal = os.Interrupt
