#!/usr/bin/env bash
# Runs a PostgreSQL 15 cluster of its own, spillway_tls on 127.0.0.1:5442, that
# takes TLS connections only, for the TLS tests (the system cluster "main" on
# 5432 is never touched). Its certificates come from hack/tls-certs.sh in
# $SPILLWAY_PG_TLS_DIR (default /tmp/spillway-postgres-tls); the server's are
# copied into the cluster's data directory (owner postgres, mode 0600: Postgres
# refuses a key others can read). pg_hba.conf:
#   local   all  postgres                peer      (administration by this script)
#   hostssl test all      127.0.0.1/32   trust     (database test, TLS only)
#   hostnossl all all     0.0.0.0/0      reject
# ssl_ca_file is the CA, so a client certificate, when sent, must be the CA's.
#
#   start    create the cluster if absent (start.conf manual, so the system's
#            PostgreSQL service leaves it alone), configure, start, create
#            database test, check that TLS works and plaintext is refused
#   stop     stop it (the cluster stays for the next start)
#   url      print the pgx URLs: server-verified TLS, and the same with the
#            client certificate (CN=guest)
#   destroy  stop and drop the cluster, delete the certificates
set -euo pipefail

me=postgres-tls
say() { echo "$me: $*"; }
die() { echo "$me: error: $*" >&2; exit 1; }

cd "$(dirname "$0")/.."
repo=$PWD
ver=15
name=spillway_tls
port=5442
dir=${SPILLWAY_PG_TLS_DIR:-/tmp/spillway-postgres-tls}
case $dir in /*) ;; *) dir=$repo/$dir ;; esac
confdir=/etc/postgresql/$ver/$name

url() { echo "postgres://postgres@localhost:$port/test?sslmode=verify-full&sslrootcert=$dir/ca.crt"; }
url_cert() { echo "$(url)&sslcert=$dir/client.crt&sslkey=$dir/client.key"; }

check_tools() {
  local t
  for t in pg_createcluster pg_ctlcluster pg_lsclusters pg_isready psql; do
    command -v "$t" >/dev/null || die "$t is missing (apt-get install postgresql-$ver postgresql-client-$ver)"
  done
  [ -x /usr/lib/postgresql/$ver/bin/postgres ] || die "PostgreSQL $ver is not installed (apt-get install postgresql-$ver)"
  id postgres >/dev/null 2>&1 || die "there is no postgres user"
  [ "$(id -u)" = 0 ] || die "run as root"
}

exists() { [ -f "$confdir/postgresql.conf" ]; }
# status: online, down, ... as pg_lsclusters says
status() { pg_lsclusters -h | awk -v v="$ver" -v n="$name" '$1 == v && $2 == n { print $4 }'; }
datadir() { pg_lsclusters -h | awk -v v="$ver" -v n="$name" '$1 == v && $2 == n { print $6 }'; }
ctl() { pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" "$@"; }
as_postgres_psql() { (cd / && runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -h /var/run/postgresql -p "$port" -d postgres "$@"); }

# put SRC DST MODE OWNER: install SRC as DST when it differs; says whether it did.
put() {
  if [ -f "$2" ] && cmp -s "$1" "$2"; then return 1; fi
  install -m "$3" -o "$4" -g "$4" "$1" "$2.new"
  mv -f "$2.new" "$2"
}

cmd_start() {
  local t0=$SECONDS changed=no data
  check_tools
  "$repo/hack/tls-certs.sh" "$dir" | sed 's/^/  /'

  if ! exists; then
    if ss -Htln "sport = :$port" | grep -q .; then
      die "port $port is taken: $(ss -Htlnp "sport = :$port" | head -n1)"
    fi
    say "creating cluster $ver/$name on port $port"
    pg_createcluster "$ver" "$name" -p "$port" --start-conf manual >/dev/null
  fi
  data=$(datadir)
  [ -n "$data" ] && [ -d "$data" ] || die "cluster $ver/$name has no data directory (pg_lsclusters: $(pg_lsclusters -h | grep " $name " || true))"

  put "$dir/server.crt" "$data/server.crt" 0600 postgres && changed=yes
  put "$dir/server.key" "$data/server.key" 0600 postgres && changed=yes
  put "$dir/ca.crt" "$data/ca.crt" 0600 postgres && changed=yes

  local tmp; tmp=$(mktemp)
  cat >"$tmp" <<EOF
# Written by hack/postgres-tls.sh.
listen_addresses = '127.0.0.1'
ssl = on
ssl_cert_file = '$data/server.crt'
ssl_key_file = '$data/server.key'
ssl_ca_file = '$data/ca.crt'
EOF
  put "$tmp" "$confdir/conf.d/spillway-tls.conf" 0644 postgres && changed=yes
  cat >"$tmp" <<'EOF'
# Written by hack/postgres-tls.sh: TLS only, database test, no password.
# TYPE    DATABASE USER     ADDRESS       METHOD
local     all      postgres               peer
hostssl   test     all      127.0.0.1/32  trust
hostnossl all      all      0.0.0.0/0     reject
EOF
  put "$tmp" "$confdir/pg_hba.conf" 0640 postgres && changed=yes
  rm -f "$tmp"

  case $(status) in
    online)
      if [ "$changed" = yes ]; then
        say "configuration or certificates changed; reloading"
        ctl reload
      else
        say "$ver/$name is already running"
      fi
      ;;
    *)
      say "starting $ver/$name"
      ctl start || die "$ver/$name did not start; see /var/log/postgresql/postgresql-$ver-$name.log"
      ;;
  esac
  local i
  for i in $(seq 1 100); do
    pg_isready -q -h 127.0.0.1 -p "$port" && break
    sleep 0.1
  done
  pg_isready -q -h 127.0.0.1 -p "$port" || die "$ver/$name does not accept connections on $port"

  if [ "$(as_postgres_psql -Atc "select 1 from pg_database where datname = 'test'")" != 1 ]; then
    say "creating database test"
    as_postgres_psql -c 'create database test'
  fi

  # Checks: TLS with the server verified, the same with the client
  # certificate, and plaintext refused.
  local q='select ssl from pg_stat_ssl where pid = pg_backend_pid()'
  [ "$(psql -X -Atc "$q" "$(url)")" = t ] || die "no TLS connection with $(url)"
  [ "$(psql -X -Atc "$q" "$(url_cert)")" = t ] || die "no TLS connection with $(url_cert)"
  if psql -X -Atc 'select 1' "postgres://postgres@localhost:$port/test?sslmode=disable" >/dev/null 2>&1; then
    die "a plaintext connection (sslmode=disable) was let in"
  fi
  say "ready in $((SECONDS - t0)) s: TLS works, plaintext is refused"
  url
}

cmd_stop() {
  check_tools
  if ! exists; then say "there is no cluster $ver/$name"; return 0; fi
  if [ "$(status)" = online ]; then
    ctl stop
    say "stopped $ver/$name"
  else
    say "$ver/$name is not running"
  fi
}

case ${1:-} in
  start) cmd_start ;;
  stop) cmd_stop ;;
  url) url; url_cert ;;
  destroy)
    cmd_stop
    if exists; then pg_dropcluster "$ver" "$name"; say "dropped $ver/$name"; fi
    rm -rf "$dir"
    say "deleted $dir"
    ;;
  *) sed -n '/^#   start/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
