#!/bin/sh
# run.sh: the backup-restore story with two shell jobs under `jetlock run`.
#
#   go run ./service/cmd/lockd --dev &          # or any jetlock deployment
#   NATS_URL=nats://127.0.0.1:4222 sh examples/backup-restore/shell/run.sh
#
# JETLOCK and FENCEDSTORE name the two binaries; unset, they are built with
# `go build` (from the repository). The store is an SQLite file in a
# temporary directory. Every wait below is bounded.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
: "${NATS_URL:=nats://127.0.0.1:4222}"
export NATS_URL
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jetlock-shell-XXXXXX")
export WORK STORE_DB="$WORK/store.db"
trap 'rm -rf "$WORK"' EXIT
if [ -z "${JETLOCK:-}" ]; then
	JETLOCK="$WORK/jetlock"
	(cd "$here" && go build -o "$JETLOCK" ../../../client/cmd/jetlock)
fi
if [ -z "${FENCEDSTORE:-}" ]; then
	FENCEDSTORE="$WORK/fencedstore"
	(cd "$here" && go build -o "$FENCEDSTORE" ./fencedstore)
fi
export JETLOCK FENCEDSTORE
say() { echo "driver   $*"; }
wait_for() { # FILE: wait up to 30 s for it
	i=0
	while [ ! -e "$1" ]; do
		i=$((i+1))
		if [ $i -gt 600 ]; then say "gave up waiting for $1"; exit 1; fi
		sleep 0.05
	done
}
LOCK=lock:backup:user123

"$FENCEDSTORE" -db "$STORE_DB" init "user123/content=photos v2" user123/latest_backup=backup-1 "snapshot/backup-1=photos v1"
say "store: user123's content \"photos v2\", latest backup backup-1 (\"photos v1\")"

# 1. The backup takes the lock (TTL 2 s, renewed by jetlock every ~0.7 s).
"$JETLOCK" run --ttl 2s --grace 500ms --owner backup-service "$LOCK" -- sh "$here/backup.sh" 2>&1 &
backup=$!
wait_for "$WORK/backup.ready"

# 2. The restore is asked for while the backup holds the lock: no wait.
code=0
"$JETLOCK" run --owner restore-service "$LOCK" -- sh "$here/restore.sh" 2>"$WORK/restore.err" || code=$?
say "restore without --wait: exit $code ($(cat "$WORK/restore.err"))"

# 3. The backup freezes: jetlock, its guard and the job (a frozen VM), so
#    no renewal goes out. Its lease expires after the TTL plus the
#    service's grace.
pgid=$(cat "$WORK/backup.pgid")
guard=$(pgrep -P "$backup") # jetlock's guard process, the job's parent
kill -STOP "$backup" "$guard"
kill -STOP -"$pgid"
say "backup paused (SIGSTOP to jetlock, its guard and the job's process group)"

# 4. The restore waits in the lock's queue and gets it once the lease expired.
"$JETLOCK" run --wait 20s --ttl 10s --owner restore-service "$LOCK" -- sh "$here/restore.sh"
say "restore finished and released the lock"

# 5. The backup's job wakes first and writes with its old token; then
#    jetlock wakes, finds the lease lost and stops the job.
touch "$WORK/backup.go"
kill -CONT -"$pgid"
wait_for "$WORK/backup.written"
kill -CONT "$guard" "$backup"
code=0
wait "$backup" || code=$?
if [ "$code" = 79 ]; then
	say "backup's jetlock exited 79: lease lost, job stopped"
else
	say "backup's jetlock exited $code, expected 79"
fi

say "store: user123's content \"$("$FENCEDSTORE" -db "$STORE_DB" get user123/content)\", latest backup $("$FENCEDSTORE" -db "$STORE_DB" get user123/latest_backup)"
