// Command lockd runs the jetlock lock service.
//
//	lockd --dev                  # embedded three-node dev cluster + service
//	lockd --url nats://host:4222 --creds svc.creds --store-creds store.creds
//
// Every flag can also be set through the environment variable named in
// --help.
package main

import (
	"fmt"
	"os"

	"github.com/alecthomas/kong"
)

type cli struct {
	Serve serveCmd `cmd:"" default:"withargs" help:"Serve lock requests (the default command)."`
}

func main() {
	var c cli
	kctx := kong.Parse(&c, kong.Name("lockd"), kong.Description("jetlock: exclusive leases with fencing tokens over NATS."),
		kong.UsageOnError())
	if err := kctx.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "lockd:", err)
		os.Exit(1)
	}
}
