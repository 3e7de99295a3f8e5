#!/bin/sh
# restore.sh: the restore job, under the same lock as the backup:
#
#   jetlock run --wait 20s --ttl 10s --owner restore-service lock:backup:user123 -- sh restore.sh
#
# It restores user123's content from snapshot backup-1, with its token.
set -eu
store() { "$FENCEDSTORE" -db "$STORE_DB" "$@"; }
say() { echo "restore  $*"; }

say "holds $JETLOCK_RESOURCE with token $JETLOCK_TOKEN"
snapshot=$(store get snapshot/backup-1)
out=$(store write "$JETLOCK_RESOURCE" "$JETLOCK_TOKEN" user123/content="$snapshot" user123/latest_backup=backup-1)
say "restored user123 to backup-1 (\"$snapshot\"): $out"
