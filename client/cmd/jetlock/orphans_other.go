//go:build !linux

package main

import "syscall"

// becomeSubreaper does nothing here: orphans go to init, which reaps them.
func becomeSubreaper() {}

// setDeathSignal does nothing here: no parent-death signal.
func setDeathSignal(*syscall.SysProcAttr) {}
