//go:build !linux

package main

// becomeSubreaper does nothing here: orphans go to init, which reaps them.
func becomeSubreaper() {}
