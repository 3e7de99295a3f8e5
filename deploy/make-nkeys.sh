#!/bin/sh
# make-nkeys.sh: the nkeys of the users of deploy/nats/accounts.conf, with
# nk (go install github.com/nats-io/nkeys/nk@v0.4.16).
#
#   deploy/make-nkeys.sh OUT
#
# OUT/secrets/<role>.nk   one seed (SU..., secret) per role: service, store,
#                         operator, inspector, orders, billing, sys; mode
#                         0600, owned
#                         by whoever runs this (README.md, "Volumes and
#                         ownership", for lockd's image)
# OUT/jetlock.env         the public keys (U...) as nats-server reads them:
#                         JETLOCK_<ROLE>_NKEY_PUBLIC=U... (no secret)
#
# Seeds that exist are kept (the public keys are computed from them), so
# running it again only adds what is missing. Environment: NK, the nk
# command (default nk).
set -eu

if [ $# -ne 1 ]; then
	echo "usage: $0 OUT" >&2
	exit 2
fi
out=$1
nk=${NK:-nk}

umask 077
mkdir -p "$out/secrets"
env="$out/jetlock.env.tmp"
cat >"$env" <<'HEAD'
# The public nkeys of deploy/nats/accounts.conf (made by make-nkeys.sh);
# the seeds are in secrets/. lockd's variables may be added below
# (systemd/jetlock.env.example): the names do not clash.
HEAD
for pair in service:SERVICE store:STORE operator:OPERATOR inspector:INSPECTOR orders:CALLER_ORDERS billing:CALLER_BILLING sys:SYS; do
	role=${pair%%:*}
	seed="$out/secrets/$role.nk"
	if [ ! -s "$seed" ]; then
		"$nk" -gen user >"$seed.tmp"
		mv "$seed.tmp" "$seed"
	fi
	chmod 0600 "$seed"
	echo "JETLOCK_${pair#*:}_NKEY_PUBLIC=$("$nk" -inkey "$seed" -pubout)" >>"$env"
done
chmod 0644 "$env"
mv "$env" "$out/jetlock.env"
echo "made $out/jetlock.env and $out/secrets/*.nk"
