package main

import (
	"fmt"

	"github.com/jetlock/jetlock/internal/version"
)

// versionCmd prints which build of lockd this is (internal/version): the
// first thing to give when reporting a problem, and what an upgrade
// instance by instance checks (docs/compatibility.md).
type versionCmd struct{}

func (versionCmd) Run(out *stdio) error {
	_, err := fmt.Fprintln(out.out, versionLine())
	return err
}

// versionLine is the line `lockd version` and `lockd --version` print.
func versionLine() string { return "lockd " + version.Get().String() }
