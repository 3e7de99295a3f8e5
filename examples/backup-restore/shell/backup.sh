#!/bin/sh
# backup.sh: the backup job. Run it under the lock:
#
#   jetlock run --ttl 2s --owner backup-service lock:backup:user123 -- sh backup.sh
#
# jetlock hands it the lease in JETLOCK_RESOURCE and JETLOCK_TOKEN; every
# write to the store carries the token. STORE_DB, FENCEDSTORE and WORK come
# from the driver (run.sh).
set -eu
store() { "$FENCEDSTORE" -db "$STORE_DB" "$@"; }
say() { echo "backup   $*"; }

say "holds $JETLOCK_RESOURCE with token $JETLOCK_TOKEN"
content=$(store get user123/content)
say "read user123's content \"$content\" for snapshot backup-2"
echo $$ > "$WORK/backup.pgid" # the process group the driver pauses
touch "$WORK/backup.ready"

# Here the job freezes (the driver stops it with SIGSTOP, like a long GC
# pause or a frozen VM) until well past its lease's TTL. The wait below
# only gives the driver a moment to do that; it is bounded (30 s).
i=0
while [ ! -e "$WORK/backup.go" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done

say "resumes, unaware; records backup-2 as the latest backup with token $JETLOCK_TOKEN"
if store write "$JETLOCK_RESOURCE" "$JETLOCK_TOKEN" snapshot/backup-2="$content" user123/latest_backup=backup-2 >"$WORK/backup.write" 2>&1; then
	say "store: $(cat "$WORK/backup.write")"
else
	say "store: $(cat "$WORK/backup.write")"
fi
touch "$WORK/backup.written"

# The rest of the job (uploading the snapshot, cleaning up): jetlock, which
# resumed too, has seen the lease lost and stops this with SIGTERM.
i=0
while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
say "finished (jetlock should have stopped it)"
