// Command lockd runs the jetlock lock service, and checks its bucket.
//
//	lockd --dev                  # embedded three-node dev cluster + service
//	lockd -s nats://host:4222 --creds svc.creds --store-creds store.creds \
//	      --metrics 127.0.0.1:9090 --audit /var/log/jetlock/audit.json
//	lockd check -s nats://host:4222 --store-creds store.creds [--json] [--fix]
//	lockd check --dev            # the bucket of a running lockd --dev
//	lockd version                # version, commit, Go version (also --version)
//
// The connection flags are named as the nats CLI's: -s/--server,
// --creds, --nkey (a seed file), --user, --password, --inbox-prefix,
// --tlscert, --tlskey, --tlsca, and the store connection's with --store-.
// The names of earlier releases (--url, --tls-cert, --tls-key, --tls-ca)
// still work, with a warning.
//
// With --metrics ADDR, lockd serves /metrics (Prometheus), /healthz (200
// while the process runs) and /readyz (200 and the instance's Health as
// JSON when it is ready; 503 and the problems otherwise) on ADDR.
//
// lockd --dev writes the URLs and the store user of its dev cluster (whose
// service users get new random passwords at every start) to
// <dev-dir>/lockd-dev-store.json, mode 0600, and removes it when it stops;
// lockd check --dev reads it, so that check, and --fix, run with the
// store user's rights. The dev inspector (inspector/inspector) has
// read-only rights: enough for check without --fix (--store-user inspector
// --store-password inspector --store-inbox-prefix _INBOX). The banner also
// prints the dev application user (user app, a new password at every
// start), which has JetStream in an account of its own, for trying
// client/fence.NewKV.
//
// Exit codes: 0 success (check: no drift); 1 the service failed, or check
// found drift that remains; 2 bad flags or values, credentials the server
// refuses, a store user without the rights it needs, servers that cannot
// hold the bucket as configured (JetStream not enabled, more replicas than
// servers), or --dev ports in use: nothing is served, and the message
// names the fix; or check could not reach the bucket or could not apply
// --fix.
//
// Every flag can also be set through the environment variable named in
// `lockd serve --help` and `lockd check --help`, all of them JETLOCK_*:
// lockd reads none of the nats CLI's NATS_* variables, so a shell set up
// for `nats` does not change whom lockd connects as. lockd sets the
// garbage collector's target to GOGC=50 unless the environment sets GOGC
// (see internal/gctune and docs/operations.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/alecthomas/kong"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1 // serve: the service failed; check: drift remains
	exitUsage  = 2 // bad flags or values; check: no connection or API error
)

type cli struct {
	Serve    serveCmd    `cmd:"" default:"withargs" help:"Serve lock requests (the default command)."`
	Check    checkCmd    `cmd:"" help:"Compare the bucket stream's live configuration with jetlock's definition. Exit 0: no drift; 1: drift; 2: usage, connection or API error."`
	Handover handoverCmd `cmd:"" help:"Before a NATS server stops: if it leads the bucket's stream, hand the leadership to the most current replica and wait for it (the pre-stop step of deploy/). Exit 0: handed over, or nothing to hand over; 1: failed; 2: usage or connection error."`
	Version  versionCmd  `cmd:"" help:"Print lockd's version, the commit it was built from and its Go version."`

	VersionFlag kong.VersionFlag `name:"version" help:"Print lockd's version and exit (as lockd version)."`
}

// exitError is an error with the exit code it causes; with a nil err, run
// exits with code and prints nothing (the command has said why).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

func usageError(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// stdio is where a command writes its output.
type stdio struct {
	out, err io.Writer
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// kongExit carries the exit code of --help through a panic out of kong.
type kongExit int

// run runs lockd with args until ctx ends (serve) or the command is done,
// and returns the exit code. Every error is one line on stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	var c cli
	parser, err := kong.New(&c, kong.Name("lockd"),
		kong.Description("jetlock: exclusive leases with fencing tokens over NATS.\n\n"+
			"Every flag of a command can also be set through an environment variable, shown beside it in "+
			"\"lockd serve --help\" and \"lockd check --help\" (JETLOCK_SERVER, JETLOCK_CREDS, JETLOCK_NKEY, "+
			"JETLOCK_STORE_CREDS, JETLOCK_STORE_NKEY, ...). lockd reads no NATS_* variable: those are the nats CLI's."),
		kong.Writers(stdout, stderr),
		kong.Vars{"version": versionLine()},
		kong.Exit(func(code int) { panic(kongExit(code)) }),
		kong.BindTo(ctx, (*context.Context)(nil)),
		kong.Bind(&stdio{out: stdout, err: stderr}))
	if err != nil {
		fmt.Fprintln(stderr, "lockd:", err)
		return exitUsage
	}
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(kongExit)
			if !ok {
				panic(r)
			}
			code = int(e)
		}
	}()
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "lockd: %s (see lockd --help)\n", oneLine(err))
		return exitUsage
	}
	for _, w := range append(deprecatedFlags(args), ignoredEnv(os.LookupEnv)...) {
		fmt.Fprintln(stderr, "lockd: warning:", w)
	}
	if err := kctx.Run(); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		} else {
			code = exitFailed
		}
		if ee == nil || ee.err != nil {
			fmt.Fprintln(stderr, "lockd:", oneLine(err))
		}
		return code
	}
	return exitOK
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }
