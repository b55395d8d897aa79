#!/usr/bin/env bash
# Makes the test-only TLS material the TLS tests use, with openssl, into DIR:
#   ca.crt/ca.key              the test CA
#   server.crt/server.key      CN=localhost, SAN DNS:localhost, IP:127.0.0.1, signed by the CA
#   client.crt/client.key      CN=guest, so RabbitMQ's EXTERNAL mechanism
#                              (ssl_cert_login_from = common_name) maps it to user guest
#   wrong-ca.crt/wrong-ca.key  an unrelated CA
#   wrong-server.crt/.key      like server.crt but signed by the wrong CA
# RSA 2048, valid 10 years, random serials. Modes: certificates 0644; the
# server keys 0644 on purpose (test-only keys the rabbitmq and postgres OS
# users must read; Postgres wants its own 0600 copy, which
# hack/postgres-tls.sh makes); client.key and the CA keys 0600, owned by the
# caller (root runs the tests; libpq/psql refuse a client key that others can
# read, pgx does not care).
#
# Usage: hack/tls-certs.sh [--force] DIR      make everything; skipped when DIR
#                                            already holds a valid, complete set
#                                            (--force: make a new set anyway)
#        hack/tls-certs.sh --renew-server DIR  new server.crt/server.key (new
#                                            serial) signed by DIR's existing
#                                            CA: the input of a rotation test
set -euo pipefail

say() { echo "tls-certs: $*"; }
die() { echo "tls-certs: error: $*" >&2; exit 1; }
usage() { echo "usage: $0 [--force|--renew-server] DIR" >&2; exit 2; }

mode=make
case ${1:-} in
  --force) mode=force; shift ;;
  --renew-server) mode=renew; shift ;;
  -h|--help) usage ;;
esac
[ $# -eq 1 ] && [ -n "$1" ] || usage
dir=$1
command -v openssl >/dev/null || die "openssl is not installed (apt-get install openssl)"

days=3650
files="ca.crt ca.key server.crt server.key client.crt client.key wrong-ca.crt wrong-ca.key wrong-server.crt wrong-server.key"

# complete: every file is there, no certificate expires within a day, and the
# server and client certificates verify against the CA.
complete() {
  local f
  for f in $files; do [ -s "$dir/$f" ] || return 1; done
  for f in ca server client wrong-ca wrong-server; do
    openssl x509 -in "$dir/$f.crt" -noout -checkend 86400 >/dev/null 2>&1 || return 1
  done
  openssl verify -CAfile "$dir/ca.crt" "$dir/server.crt" "$dir/client.crt" >/dev/null 2>&1 || return 1
  openssl verify -CAfile "$dir/wrong-ca.crt" "$dir/wrong-server.crt" >/dev/null 2>&1 || return 1
}

work=""
cleanup() { if [ -n "$work" ]; then rm -rf "$work"; fi; }
trap cleanup EXIT

newkey() { # path
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1" 2>/dev/null
}

mkca() { # name, CN
  newkey "$work/$1.key"
  openssl req -x509 -new -key "$work/$1.key" -sha256 -days "$days" \
    -subj "/O=Spillway test/CN=$2" \
    -set_serial "0x$(openssl rand -hex 16)" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" \
    -out "$work/$1.crt"
}

mkleaf() { # name, CN, CA name (in $work or $dir), extensions
  local name=$1 cn=$2 ca=$3 ext=$4 cadir=$work
  [ -f "$work/$ca.crt" ] || cadir=$dir
  newkey "$work/$name.key"
  openssl req -new -key "$work/$name.key" -subj "/O=Spillway test/CN=$cn" -out "$work/$name.csr"
  printf '%s\n' "$ext" >"$work/$name.ext"
  openssl x509 -req -in "$work/$name.csr" -CA "$cadir/$ca.crt" -CAkey "$cadir/$ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
    -extfile "$work/$name.ext" -out "$work/$name.crt" 2>/dev/null
  rm -f "$work/$name.csr" "$work/$name.ext"
}

server_ext='basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
subjectAltName=DNS:localhost,IP:127.0.0.1'
client_ext='basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid'

setmode() { # path: the mode its name calls for
  case ${1##*/} in
    ca.key|wrong-ca.key|client.key) chmod 0600 "$1" ;;
    *) chmod 0644 "$1" ;;
  esac
}

# install: move the new files from $work into $dir (a rename each, so a reader
# never sees a half-written file), with their modes.
install() { # names...
  local f
  for f in "$@"; do
    setmode "$work/$f"
    mv -f "$work/$f" "$dir/$f"
  done
}

mkdir -p "$dir"
chmod 0755 "$dir"
work=$(mktemp -d "$dir/.tmp.XXXXXX")

if [ "$mode" = renew ]; then
  [ -s "$dir/ca.crt" ] && [ -s "$dir/ca.key" ] || die "$dir has no ca.crt/ca.key; run $0 $dir first"
  mkleaf server localhost ca "$server_ext"
  install server.key server.crt
  say "renewed $dir/server.crt (serial $(openssl x509 -in "$dir/server.crt" -noout -serial | cut -d= -f2))"
  exit 0
fi

if [ "$mode" = make ] && complete; then
  for f in $files; do setmode "$dir/$f"; done
  say "$dir already holds a valid set (use --force to remake it)"
  exit 0
fi

say "making a CA, server, client and wrong-CA certificates in $dir"
mkca ca "Spillway test CA"
mkleaf server localhost ca "$server_ext"
mkleaf client guest ca "$client_ext"
mkca wrong-ca "Spillway wrong CA"
mkleaf wrong-server localhost wrong-ca "$server_ext"
# CA last: a crash part-way leaves the old set whole or an incomplete new one,
# which the next run's check remakes.
install server.key server.crt client.key client.crt wrong-ca.key wrong-ca.crt \
  wrong-server.key wrong-server.crt ca.key ca.crt
complete || die "the new set in $dir does not verify"
say "done: $files"
