#!/bin/sh
# make-ca.sh: a certificate authority and the certificates of a jetlock
# deployment, with openssl.
#
#   deploy/tls/make-ca.sh OUT [SERVER...]
#
# OUT/ca.pem, OUT/ca-key.pem      the CA (keep ca-key.pem offline)
# OUT/<server>/server.pem, server-key.pem, ca.pem
#                                 one directory per server (default nats-a
#                                 nats-b nats-c), to install as
#                                 /etc/nats/tls/ on that server: its
#                                 certificate names the server (DNS SAN) for
#                                 clients and for the route host check of
#                                 deploy/nats (verify_cert_and_check_known_urls)
# OUT/clients/<client>.pem, <client>-key.pem
#                                 client certificates (default lockd orders
#                                 billing operator inspector), with no host
#                                 names, so that they cannot pass for a route
#
# Environment:
#   CLIENTS     client certificate names (default "lockd orders billing operator inspector")
#   EXTRA_SANS  more subject alternative names for every server certificate,
#               e.g. "DNS:nats.example.com,IP:10.0.0.7"
#   DAYS        validity of server and client certificates (default 365)
#   CA_DAYS     validity of the CA (default 3650)
#
# An existing OUT/ca.pem and ca-key.pem are reused: run it again with new
# names to add certificates, or to renew them (see README.md, "Rotate").
set -eu

if [ $# -lt 1 ]; then
	echo "usage: $0 OUT [SERVER...]" >&2
	exit 2
fi
out=$1
shift
servers=${*:-nats-a nats-b nats-c}
clients=${CLIENTS:-lockd orders billing operator inspector}
days=${DAYS:-365}
ca_days=${CA_DAYS:-3650}

umask 077
mkdir -p "$out/clients"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$out/ca.pem" ] || [ ! -f "$out/ca-key.pem" ]; then
	openssl ecparam -name prime256v1 -genkey -noout -out "$out/ca-key.pem"
	openssl req -x509 -new -sha256 -key "$out/ca-key.pem" -days "$ca_days" \
		-subj "/CN=jetlock CA" \
		-addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
		-addext "keyUsage=critical,keyCertSign,cRLSign" \
		-out "$out/ca.pem"
fi

# issue NAME DIR EXTFILE: a key and a certificate signed by the CA.
issue() {
	openssl ecparam -name prime256v1 -genkey -noout -out "$2/$1-key.pem"
	openssl req -new -sha256 -key "$2/$1-key.pem" -subj "/CN=$1" -out "$tmp/$1.csr"
	openssl x509 -req -sha256 -in "$tmp/$1.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" \
		-CAcreateserial -CAserial "$tmp/ca.srl" -days "$days" -extfile "$3" -out "$2/$1.pem"
}

for s in $servers; do
	mkdir -p "$out/$s"
	sans="DNS:$s,DNS:localhost,IP:127.0.0.1"
	if [ -n "${EXTRA_SANS:-}" ]; then
		sans="$sans,$EXTRA_SANS"
	fi
	cat >"$tmp/server.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans
EXT
	issue "$s" "$out/$s" "$tmp/server.ext"
	mv "$out/$s/$s.pem" "$out/$s/server.pem"
	mv "$out/$s/$s-key.pem" "$out/$s/server-key.pem"
	cp "$out/ca.pem" "$out/$s/ca.pem"
done

cat >"$tmp/client.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
EXT
for c in $clients; do
	issue "$c" "$out/clients" "$tmp/client.ext"
done
cp "$out/ca.pem" "$out/clients/ca.pem"
echo "made $out: CA, servers: $servers; clients: $clients"
