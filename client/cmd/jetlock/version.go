package main

import (
	"fmt"
	"os"

	"github.com/jetlock/jetlock/internal/version"
)

// versionCmd prints which build of jetlock this is (internal/version); it
// needs no connection.
type versionCmd struct{}

func (versionCmd) Run() error {
	_, err := fmt.Fprintln(os.Stdout, versionLine())
	return err
}

// versionLine is the line `jetlock version` and `jetlock --version` print.
func versionLine() string { return "jetlock " + version.Get().String() }
