// Command jetlock runs a process under a jetlock lock, and inspects and
// revokes locks, from any shell.
//
//	go install github.com/jetlock/jetlock/client/cmd/jetlock@latest
//
//	jetlock run --wait 1m lock:backup:user123 -- ./backup.sh user123
//	jetlock run --limit 3 --wait 10m encoders -- ./encode.sh video42
//	jetlock elect scheduler --value "$(hostname)" -- ./scheduler
//	jetlock leader --watch scheduler
//	jetlock ls lock:backup:
//	jetlock --user operator --password operator revoke lock:backup:user123 --reason "stuck job"
//
// It connects like the nats CLI: --server/-s or NATS_URL, --creds,
// --user/--password, --nkey, --tlscert/--tlskey/--tlsca, or --context NAME
// (a nats CLI context; the flags given override its settings).
//
// Exit codes (see exitcodes.go):
//
//	0    success; `run` and `elect` pass the command's own code through
//	1    any other failure (internal error, too_many_waiters)
//	2    bad input: unknown flag, invalid resource, duration out of bounds,
//	     no command after --, or invalid_request from the service; nothing started
//	69   unavailable: no service answered, or NATS could not be reached
//	75   locked: the resource is held by another lease, or a semaphore
//	     (run --limit) has no free permit (no --wait, or it ran out); elect:
//	     --wait ran out as a standby
//	77   permission denied (revoke needs operator credentials, watch an
//	     inspector's)
//	79   lease lost: `run` (or `elect`) stopped its command (SIGTERM, SIGKILL
//	     after --grace) because renewal was refused or unprovable, the lease
//	     (the leadership) was revoked, or its hold limit passed; `renew` of a
//	     lease that is no longer current
//	126  `run`, `elect`: the command could not be started
//	127  `run`, `elect`: the command was not found
//	128+N `run`, `elect`: the command was killed by signal N (like a shell),
//	     or frozen by it (SIGTTIN, SIGTTOU: it used the terminal; jetlock
//	     stopped it and released the lock); `run`, `acquire`, `elect`:
//	     signal N arrived while acquiring or campaigning (the request is
//	     cancelled at the service first)
//
// Every error is one line on stderr: "jetlock: CODE: message", with the
// wire contract's code where the service gave one, else jetlock's own
// (usage, permission_denied, interrupted, command_not_found,
// cannot_execute, failure). With --json (acquire, renew,
// release, status, ls, revoke, watch, leader) it is one JSON line on stdout
// instead, and stderr stays empty:
//
//	{"error":{"code":"locked","message":"...","exit_code":75,"holder":{...}}}
//
// Durations, in messages as in flags, are written like 1s, 10m, 24h.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/alecthomas/kong"
)

type cli struct {
	globals `embed:""`

	Run     runCmd     `cmd:"" help:"Run a command while holding a lock; stop it if the lock is lost."`
	Acquire acquireCmd `cmd:"" help:"Acquire a lock for a script (the script renews and releases it)."`
	Renew   renewCmd   `cmd:"" help:"Renew a lease acquired with 'jetlock acquire'."`
	Release releaseCmd `cmd:"" help:"Release a lease acquired with 'jetlock acquire'."`
	Status  statusCmd  `cmd:"" help:"Show who holds a resource."`
	Ls      lsCmd      `cmd:"" help:"List held locks (resource, owner, token, expires in, waiters, session)."`
	Revoke  revokeCmd  `cmd:"" help:"End a lease, whoever holds it (operators only)."`
	Watch   watchCmd   `cmd:"" help:"Print grants, releases and expiries as they happen (inspectors only)."`
	Elect   electCmd   `cmd:"" help:"Run a command while this process leads an election; a standby waits."`
	Leader  leaderCmd  `cmd:"" help:"Show an election's leader (value, token); --watch follows it."`
	Version versionCmd `cmd:"" help:"Print jetlock's version, the commit it was built from and its Go version."`

	VersionFlag kong.VersionFlag `name:"version" help:"Print jetlock's version and exit (as jetlock version)."`
}

const description = `jetlock: exclusive leases with fencing tokens over NATS.

Exit codes: 0 success (run: the command's own), 1 other failure, 2 bad input
(nothing started), 69 service unavailable, 75 locked, 77 permission denied,
79 lease lost (run stopped its command), 126/127 command not executable/not
found, 128+N command killed or frozen by signal N (or signal N while
acquiring).

Examples:
  jetlock -s nats://127.0.0.1:4222 run --wait 1m lock:backup:user123 -- ./backup.sh user123
  jetlock run --limit 3 --wait 10m encoders -- ./encode.sh video42
  jetlock elect scheduler --value "$(hostname)" -- ./scheduler
  jetlock ls lock:backup:
  jetlock --user operator --password operator revoke lock:backup:user123 --reason "stuck"
Every command has --help with an example.`

func main() {
	if code, ok := guardCommand(os.Args[1:]); ok {
		os.Exit(code)
	}
	os.Exit(realMain(os.Args[1:]))
}

func realMain(args []string) int {
	var c cli
	parser, err := kong.New(&c, kong.Name("jetlock"), kong.Description(description),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}), kong.Vars{"version": versionLine()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "jetlock:", err)
		return exitUsage
	}
	asJSON := jsonOutput(args)
	kctx, err := parser.Parse(args)
	if err != nil {
		ee := (*exitError)(nil)
		if !errors.As(err, &ee) { // else a Validate method's, wrapped by kong in the command's name
			ee = usagef("%s", err.Error())
		}
		ee.msg += fmt.Sprintf(" (see jetlock %s--help)", commandOf(args))
		ee.report(os.Stdout, os.Stderr, asJSON)
		return ee.code
	}
	err = kctx.Run(&c.globals)
	if err == nil {
		return 0
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		ee = classify(err)
	}
	ee.report(os.Stdout, os.Stderr, asJSON)
	return ee.code
}

// jsonCommands are the commands that have --json.
var jsonCommands = map[string]bool{"acquire": true, "renew": true, "release": true, "status": true, "ls": true, "revoke": true, "watch": true,
	"leader": true}

// jsonOutput reports whether args ask a command that has --json for it.
// It reads args itself, so that an error kong finds in them is JSON too.
func jsonOutput(args []string) bool {
	if !jsonCommands[strings.TrimSpace(commandOf(args))] {
		return false
	}
	for _, a := range args {
		switch {
		case a == "--":
			return false
		case a == "--json", a == "--json=true":
			return true
		}
	}
	return false
}

// commandOf returns "NAME " when args name a command, for the help hint.
func commandOf(args []string) string {
	for _, a := range args {
		switch a {
		case "run", "acquire", "renew", "release", "status", "ls", "revoke", "watch", "elect", "leader":
			return a + " "
		case "--":
			return ""
		}
	}
	return ""
}
