#!/usr/bin/env bash
# Runs a PostgreSQL 15 primary and a streaming replica of its own, for the
# database fault tests, as two clusters beside the system one (15/main on 5432,
# which it never stops, reconfigures or restarts):
#
#   node  cluster          port
#   A     15/spillway_ha_a 5433   the primary after `up`
#   B     15/spillway_ha_b 5434   the replica after `up`
#
# Both listen on 127.0.0.1 only and trust every local and 127.0.0.1 connection,
# replication included. Database test and a superuser role root (what `psql
# -h 127.0.0.1 -p 5433 test` logs in as when run by root) exist on the primary
# and so on both. The configuration is in /etc/postgresql/15/spillway_ha_X:
#   conf.d/spillway-ha.conf       wal_level, max_wal_senders, wal_keep_size...,
#                                 and primary_conninfo naming the other node (a
#                                 node only uses it when it runs as a replica)
#   conf.d/spillway-ha-sync.conf  synchronous_standby_names: '*' in sync mode,
#                                 '' in async mode; the same on both nodes, so
#                                 whichever is primary has it
#   pg_hba.conf                   trust
# Which node is primary changes during the faults, so every subcommand asks
# both servers (pg_is_in_recovery(), default_transaction_read_only) rather than
# remembering. The state directory ($SPILLWAY_PG_HA_DIR, default
# /tmp/spillway-postgres-ha) holds only what cannot be asked:
#   rebuild-a, rebuild-b  a node being rebuilt (its data is not to be trusted)
#   basebackup-X.log      the last pg_basebackup's output
#   pgbouncer/            the script's PgBouncer: pgbouncer.ini, userlist.txt,
#                         pgbouncer.pid, pgbouncer.log, its unix socket
#   .lock                 flock of the changing subcommands
# Server logs: /var/log/postgresql/postgresql-15-spillway_ha_X.log.
#
# Subcommands (the last line of each is its result):
#   up [sync|async]  make both clusters exist and run, A the primary and B its
#                    streaming replica, sync (default) or async; repairs whatever
#                    an interrupted run left (roles swapped, a node down or
#                    read-only), rebuilding the replica with pg_basebackup when
#                    needed; a no-op when all is right
#   primary          print the current primary's port (exit 1 if none)
#   replica          print the current replica's port (exit 1 if none)
#   switchover       planned: fast stop of the primary, promote the replica,
#                    start the old primary as its replica; the last line is the
#                    new primary's port
#   crash            kill -9 the primary's postmaster and all its processes,
#                    promote the replica; the crashed node stays down. The last
#                    line is the new primary's port
#   demote           make the primary read-only (default_transaction_read_only,
#                    for its open sessions too) but leave it up, promote the
#                    replica; the last line is the new primary's port
#   rejoin           make the node that is not the primary (crashed, read-only,
#                    stopped) a streaming replica of the primary again
#   status           one line per node: port, role, replication state
#   down             stop and drop both clusters, stop the PgBouncer, delete
#                    the state directory
# In sync mode the primary's commits wait for the replica: after crash or
# demote, and during switchover until the old primary streams again, commits
# on the new primary hang until there is a replica again (rejoin, up).
#
#   pgbouncer up     start the script's PgBouncer (installed with apt-get when
#                    missing, except under CI=true) on 127.0.0.1:6435, in front
#                    of the current primary: databases test_tx (pool_mode
#                    transaction) and test_session (pool_mode session), both
#                    database test; users postgres and root, trust. It does not
#                    follow the roles by itself: after a switchover, crash or
#                    demote, run it again, which rewrites the config and RELOADs
#                    (server connections move as they are released)
#   pgbouncer pause [DB]     PAUSE: wait until DB's server connections are
#                    released (a transaction's end in transaction mode; in
#                    session mode only the client's disconnect: a connected
#                    client keeps working, and pause gives up after
#                    $SPILLWAY_PGBOUNCER_PAUSE_WAIT s, default 30, with DB left
#                    paused); meanwhile and until resume, queries and new
#                    clients wait
#   pgbouncer resume [DB]    RESUME, after pause or kill
#   pgbouncer reconnect [DB] RECONNECT: replace server connections as released
#   pgbouncer kill [DB]      KILL: drop DB's client and server connections at
#                    once. DB then stays killed: new clients wait until
#                    `pgbouncer resume`, which kill does not do itself. A client
#                    that tried to log in while DB was killed makes PgBouncer
#                    wait server_login_retry (15 s) before the next server
#                    connection, so it may lag that long after resume
#   pgbouncer restart        stop the process (SIGTERM: immediate shutdown,
#                    clients are cut off) and start it with the same config
#   pgbouncer stop           stop it (SIGTERM)
#   pgbouncer show           SHOW DATABASES, SHOW POOLS and SHOW SERVERS
# DB is test_tx or test_session; without it, both.
set -euo pipefail

me=postgres-ha
say() { echo "$me: $*"; }
die() { echo "$me: error: $*" >&2; exit 1; }

cd "$(dirname "$0")/.."
repo=$PWD
ver=15
bin=/usr/lib/postgresql/$ver/bin
state=${SPILLWAY_PG_HA_DIR:-/tmp/spillway-postgres-ha}
case $state in /*) ;; *) state=$repo/$state ;; esac
bdir=$state/pgbouncer
bport=6435
bini=$bdir/pgbouncer.ini
bdbs="test_tx test_session"
# The caller's libpq settings (PGTARGETSESSIONATTRS, PGOPTIONS, PGUSER...) must
# not change what this script's own psql and pg_basebackup do.
for v in $(compgen -e); do case $v in PG*) unset "$v" ;; esac; done

name() { echo "spillway_ha_$1"; }
port() { case $1 in a) echo 5433 ;; b) echo 5434 ;; esac; }
peer() { case $1 in a) echo b ;; b) echo a ;; esac; }
confdir() { echo "/etc/postgresql/$ver/$(name "$1")"; }
logfile() { echo "/var/log/postgresql/postgresql-$ver-$(name "$1").log"; }
exists() { [ -f "$(confdir "$1")/postgresql.conf" ]; }
# datadir N: as the cluster's postgresql.conf says (pg_lsclusters is slow).
datadir() {
  sed -n "s/^data_directory = '\(.*\)'.*/\1/p" "$(confdir "$1")/postgresql.conf" 2>/dev/null | grep . ||
    echo "/var/lib/postgresql/$ver/$(name "$1")"
}

# alive PID: the process exists and is no zombie (PID 1 here may not reap
# the orphans a kill leaves).
alive() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }
since() { local d=$(($(now_ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

check_tools() {
  local t
  for t in pg_createcluster pg_ctlcluster pg_dropcluster; do
    command -v "$t" >/dev/null || die "$t is missing (apt-get install postgresql-common)"
  done
  for t in postgres psql pg_basebackup pg_controldata; do
    [ -x "$bin/$t" ] || die "$bin/$t is missing (apt-get install postgresql-$ver)"
  done
  for t in runuser flock timeout; do command -v $t >/dev/null || die "$t is missing (util-linux, coreutils)"; done
  command -v ss >/dev/null || die "ss is missing (iproute2)"
  command -v pgrep >/dev/null || die "pgrep is missing (procps)"
  id postgres >/dev/null 2>&1 || die "there is no postgres user"
  [ "$(id -u)" = 0 ] || die "run as root"
}

# lock: one changing subcommand at a time; the others wait.
lock() {
  install -d -m 0755 "$state"
  exec 9>"$state/.lock"
  flock -w 600 9 || die "another $me run holds $state/.lock"
}

ctl() { # N ACTION [ARGS]: pg_ctlcluster, without the lock's descriptor
  local n=$1; shift
  pg_ctlcluster --skip-systemctl-redirect "$ver" "$(name "$n")" "$@" 9>&-
}

# sql N QUERY: one query as postgres over TCP; prints the unaligned result.
sql() {
  PGCONNECT_TIMEOUT=3 PGSSLMODE=disable "$bin/psql" -X -qAt -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$(port "$1")" \
    -U postgres -d postgres -c "$2" 9>&-
}
# sqlw N QUERY: a write that must not wait: on a read-only node, or in sync
# mode with no replica to confirm it.
sqlw() { PGOPTIONS='-c default_transaction_read_only=off -c synchronous_commit=local' sql "$@"; }

# pm_pid N: the pid of node N's postmaster, when running (postmaster.pid is
# left behind by kill -9, so the process is checked too: its -D is the data
# directory, or the configuration directory when start_node started it).
pm_pid() {
  local data pid; data=$(datadir "$1")
  pid=$(head -n1 "$data/postmaster.pid" 2>/dev/null) || return 0
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" |
    grep -q -e "-D $data " -e "-D $(confdir "$1") " && echo "$pid" || true
}

# node_state N: missing (no cluster), empty (no usable data: never filled, or
# a rebuild did not finish), down, starting (running, not answering yet),
# primary, ro-primary (primary with default_transaction_read_only on: demote),
# replica.
node_state() {
  local n=$1 out
  exists "$n" || { echo missing; return; }
  if [ -e "$state/rebuild-$n" ] || [ ! -f "$(datadir "$n")/PG_VERSION" ]; then echo empty; return; fi
  [ -n "$(pm_pid "$n")" ] || { echo down; return; }
  out=$(sql "$n" "select pg_is_in_recovery()::text || ' ' || current_setting('default_transaction_read_only')" 2>/dev/null) ||
    { echo starting; return; }
  case $out in
    "true "*) echo replica ;;
    "false on") echo ro-primary ;;
    "false off") echo primary ;;
    *) echo starting ;;
  esac
}

# settled_state N: node_state, after waiting (up to 30 s) for a starting node
# to answer; "stuck" when it does not (a replica that cannot reach a
# consistent state, say).
settled_state() {
  local s i
  for i in $(seq 1 300); do
    s=$(node_state "$1")
    [ "$s" = starting ] || { echo "$s"; return; }
    sleep 0.1
  done
  echo stuck
}

timeline() { sql "$1" "select substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)" 2>/dev/null || echo 0; }

# find_primary: the writable primary (of two, after a split, the one on the
# newer timeline); nothing when there is none.
find_primary() {
  local sa sb
  sa=$(node_state a) sb=$(node_state b)
  if [ "$sa" = primary ] && [ "$sb" = primary ]; then
    if [[ $(timeline b) > $(timeline a) ]]; then echo b; else echo a; fi
  elif [ "$sa" = primary ]; then echo a
  elif [ "$sb" = primary ]; then echo b
  fi
}

find_replica() {
  local n
  for n in a b; do [ "$(node_state "$n")" = replica ] && { echo "$n"; return; }; done
  return 0
}

# mode: sync or async, as the nodes' sync file says (both have the same one).
mode() {
  local n
  for n in a b; do
    if [ -f "$(confdir "$n")/conf.d/spillway-ha-sync.conf" ]; then
      grep -q "^synchronous_standby_names = '\*'" "$(confdir "$n")/conf.d/spillway-ha-sync.conf" && echo sync || echo async
      return
    fi
  done
  echo sync
}

# streams P R: R streams from P. synced P R: and with the mode's sync_state.
repl_state() { sql "$1" "select state || ' ' || sync_state from pg_stat_replication where application_name = '$(name "$2")'" 2>/dev/null | head -n1; }
streams() { [[ $(repl_state "$1" "$2") == "streaming "* ]]; }
synced() { [ "$(repl_state "$1" "$2")" = "streaming $(mode)" ]; }

wait_until() { # SECONDS COMMAND...: poll every 0.1 s; false when time runs out
  local end=$(($(now_ms) + $1 * 1000)); shift
  until "$@"; do
    [ "$(now_ms)" -lt "$end" ] || return 1
    sleep 0.1
  done
}
is_state() { [ "$(node_state "$1")" = "$2" ]; }

# put DST MODE TEXT: write TEXT (owner postgres) to DST when it differs; says
# whether it did. Compared in the shell: up's no-op path forks little.
put() {
  local cur=""
  if [ -f "$1" ]; then
    IFS= read -r -d '' cur <"$1" || true
    [ "$cur" = "$3" ] && return 1
  fi
  printf '%s' "$3" >"$1.new"
  chown postgres:postgres "$1.new"; chmod "$2" "$1.new"
  mv -f "$1.new" "$1"
}

# write_config N SYNC: writes node N's files; prints "restart" when the main
# file changed (wal_level and max_connections need one), "reload" when only
# pg_hba.conf or the sync file did, nothing otherwise.
write_config() {
  local n=$1 want=$2 c what="" text
  c=/etc/postgresql/$ver/spillway_ha_$n
  IFS= read -r -d '' text <<EOF || true
# Written by hack/postgres-ha.sh; rewritten by every up.
listen_addresses = '127.0.0.1'
max_connections = 200
# logical, not replica: make bench's logical section decodes the primary's
# WAL through a slot.
wal_level = logical
hot_standby = on
max_wal_senders = 10
wal_keep_size = 512MB
# Lets pg_rewind work on a node that ran ahead, should a test want that.
wal_log_hints = on
# Used only while this node runs as a replica (standby.signal): the other node.
primary_conninfo = 'host=127.0.0.1 port=$([ "$n" = a ] && echo 5434 || echo 5433) user=postgres application_name=spillway_ha_$n sslmode=disable'
recovery_target_timeline = 'latest'
EOF
  put "$c/conf.d/spillway-ha.conf" 0644 "$text" && what=restart
  local names=""
  [ "$want" = sync ] && names='*'
  IFS= read -r -d '' text <<EOF || true
# Written by hack/postgres-ha.sh up $want: the same on both nodes, so a node
# keeps it when it becomes the primary.
synchronous_standby_names = '$names'
EOF
  put "$c/conf.d/spillway-ha-sync.conf" 0644 "$text" && what=${what:-reload}
  IFS= read -r -d '' text <<'EOF' || true
# Written by hack/postgres-ha.sh: fault-test clusters on 127.0.0.1, no passwords.
# TYPE  DATABASE     USER  ADDRESS       METHOD
local   all          all                 trust
local   replication  all                 trust
host    all          all   127.0.0.1/32  trust
host    replication  all   127.0.0.1/32  trust
EOF
  put "$c/pg_hba.conf" 0640 "$text" && what=${what:-reload}
  echo "$what"
}

# strip_auto_conf N: drop from the stopped node's postgresql.auto.conf what
# this script sets elsewhere: pg_basebackup -R appends a primary_conninfo
# without application_name, and a copy of the other node's file may carry its
# read-only setting from a demote.
strip_auto_conf() {
  local f; f=$(datadir "$1")/postgresql.auto.conf
  local re='^[[:space:]]*(primary_conninfo|primary_slot_name|default_transaction_read_only|synchronous_standby_names)[[:space:]]*='
  if [ -f "$f" ] && grep -Eq "$re" "$f"; then
    grep -Ev "$re" "$f" >"$f.new" || true
    chown postgres:postgres "$f.new"; chmod 0600 "$f.new"
    mv -f "$f.new" "$f"
  fi
}

# start_node N: pg_ctl start -w, what pg_ctlcluster start runs too, but
# without the latter's fixed half-second sleeps (it wants three good probes in
# a row), which add 2-3 s to every start. -D is the configuration directory:
# its postgresql.conf names the data directory, pg_hba.conf and the pid file.
start_node() {
  local n=$1
  if [ -z "$(pm_pid "$n")" ]; then
    wait_reaped "$n"
    (cd / && runuser -u postgres -- env -i PATH=/usr/bin:/bin LANG=C.UTF-8 \
      "$bin/pg_ctl" start -w -t 60 -s -D "$(confdir "$n")" -l "$(logfile "$n")" 9>&-) >/dev/null 2>&1 || {
      tail -n 15 "$(logfile "$n")" >&2 2>/dev/null || true
      return 1
    }
  fi
  wait_until 60 sql "$n" 'select 1' >/dev/null 2>&1
}

# wait_reaped N: wait until a killed postmaster of node N is gone from the
# process table. PID 1 here reaps orphans only every second or so, and while
# the zombie is there a new postmaster refuses to start ("lock file
# .s.PGSQL.<port>.lock already exists").
wait_reaped() {
  local f pid
  for f in "$(datadir "$1")/postmaster.pid" "/var/run/postgresql/.s.PGSQL.$(port "$1").lock"; do
    pid=$(head -n1 "$f" 2>/dev/null) || continue
    [ -n "$pid" ] && [ -e "/proc/$pid" ] || continue
    alive "$pid" && continue # another process has the pid now
    wait_until 10 eval "[ ! -e /proc/$pid ]" || die "the killed postmaster $pid of $(name "$1") is not reaped after 10 s"
  done
}

# stop_node N MODE: pg_ctlcluster stop; for immediate, kill -9 what is left.
stop_node() {
  local n=$1 m=$2
  [ -n "$(pm_pid "$n")" ] || return 0
  ctl "$n" stop -m "$m" >/dev/null 2>&1 || true
  [ -z "$(pm_pid "$n")" ] && return 0
  [ "$m" = immediate ] || die "$(name "$n") did not stop (-m $m); see $(logfile "$n")"
  kill_node "$n"
}

# kill_node N: kill -9 the postmaster and every process of the cluster. Each
# child of a postmaster is its own process group (it calls setsid), so there
# is no one group to kill: the postmaster and its children die in one kill,
# then anything left that names the cluster (a backend forked meanwhile).
kill_node() {
  local n=$1 pid kids i left
  pid=$(pm_pid "$n")
  [ -n "$pid" ] || return 0
  kids=$(pgrep -P "$pid" || true)
  # shellcheck disable=SC2086
  kill -9 "$pid" $kids 2>/dev/null || true
  for i in $(seq 1 50); do
    left=$(pgrep -f "^postgres: $ver/$(name "$n"): " || true)
    [ -z "$left" ] && ! alive "$pid" && return 0
    # shellcheck disable=SC2086
    [ -z "$left" ] || kill -9 $left 2>/dev/null || true
    sleep 0.1
  done
  die "processes of $(name "$n") survived kill -9: $(pgrep -af "^postgres: $ver/$(name "$n"): " || true)"
}

controldata() { # N FIELD
  (cd / && runuser -u postgres -- "$bin/pg_controldata" "$(datadir "$1")" 9>&-) | sed -n "s/^$2: *//p"
}

promote() { # N: promote the replica N and wait until it takes writes
  local n=$1
  ctl "$n" promote >/dev/null 2>&1 || true
  wait_until 60 is_state "$n" primary ||
    die "$(name "$n") was promoted but is $(node_state "$n"), not primary; see $(logfile "$n")"
}

make_writable() { # N: undo demote
  sqlw "$1" 'alter system reset default_transaction_read_only' >/dev/null
  sql "$1" 'select pg_reload_conf()' >/dev/null
  wait_until 10 is_state "$1" primary || die "$(name "$1") is still read-only after a reload"
}

# rebuild R P: R becomes a fresh copy of P (pg_basebackup -R) and streams from it.
rebuild() {
  local r=$1 p=$2 data t; data=$(datadir "$1"); t=$(now_ms)
  say "rebuilding $(name "$r") ($(port "$r")) from $(name "$p") ($(port "$p")) with pg_basebackup"
  install -d -m 0755 "$state"
  : >"$state/rebuild-$r"
  stop_node "$r" immediate
  # The old files go in the background: deleting them takes a second or more.
  if [ -e "$data" ]; then
    mv -- "$data" "$data.old-$$"
    (rm -rf -- "$data.old-$$" 9>&- &)
  fi
  install -d -m 0700 -o postgres -g postgres "$data"
  # -c fast: the backup's checkpoint is taken at once instead of spread out.
  # --no-sync: the replica's first start fsyncs its data directory anyway (it
  # starts from a backup, which counts as a crash).
  if ! (cd / && runuser -u postgres -- "$bin/pg_basebackup" -h 127.0.0.1 -p "$(port "$p")" -U postgres \
    -D "$data" -R -X stream -c fast --no-sync 9>&-) >"$state/basebackup-$r.log" 2>&1; then
    cat "$state/basebackup-$r.log" >&2
    die "pg_basebackup of $(name "$p") into $data failed"
  fi
  strip_auto_conf "$r"
  [ -f "$data/standby.signal" ] || die "pg_basebackup -R wrote no $data/standby.signal"
  rm -f "$state/rebuild-$r"
  start_node "$r" || die "$(name "$r") did not start after its rebuild; see $(logfile "$r")"
  wait_until 60 streams "$p" "$r" ||
    die "$(name "$r") does not stream from $(name "$p") 60 s after its rebuild; see $(logfile "$r")"
  say "$(name "$r") rebuilt and streaming in $(since "$t") s"
}

# make_replica R P: R streams from P, by the cheapest way that works: as it
# is, started again when it is a stopped replica, else rebuilt.
make_replica() {
  local r=$1 p=$2 s
  s=$(settled_state "$r")
  case $s in
    replica)
      wait_until 5 streams "$p" "$r" && return 0
      say "$(name "$r") is a replica but does not stream from $(name "$p")"
      ;;
    down)
      if [ -f "$(datadir "$r")/standby.signal" ]; then
        say "starting $(name "$r") (a stopped replica)"
        if start_node "$r" && wait_until 5 streams "$p" "$r"; then return 0; fi
        say "$(name "$r") does not stream from $(name "$p") after its start"
      fi
      ;;
    ro-primary)
      say "$(name "$r") is a read-only primary (demote); resetting default_transaction_read_only"
      sqlw "$r" 'alter system reset default_transaction_read_only' >/dev/null || true
      ;;
  esac
  rebuild "$r" "$p"
}

wait_synced() { # P R
  local p=$1 r=$2 want
  want=$([ "$(mode)" = sync ] && echo '*' || true)
  if [ "$(sql "$p" 'show synchronous_standby_names')" != "$want" ]; then
    sql "$p" 'select pg_reload_conf()' >/dev/null
  fi
  wait_until 30 synced "$p" "$r" ||
    die "$(name "$r") is '$(repl_state "$p" "$r")' on $(name "$p"), not 'streaming $(mode)', after 30 s"
}

# switchover P R: P (the primary) stops cleanly, R (its streaming replica) is
# promoted, P starts as R's replica. A clean shutdown sends the shutdown
# checkpoint to the replica before P exits, so P's WAL ends where R's new
# timeline begins and P can follow R without a rewind.
switchover() {
  local p=$1 r=$2 t0 t ckpt s_stop s_promote s_rejoin
  t0=$(now_ms) t=$t0
  say "stopping $(name "$p") ($(port "$p")), fast shutdown"
  stop_node "$p" fast
  s_stop=$(since "$t") t=$(now_ms)
  ckpt=$(controldata "$p" 'Latest checkpoint location')
  if ! wait_until 10 eval "[ \"\$(sql $r \"select pg_last_wal_receive_lsn() > '$ckpt'\")\" = t ]"; then
    say "$(name "$r") did not receive $(name "$p")'s shutdown checkpoint ($ckpt); starting $(name "$p") again as the primary"
    start_node "$p" || true
    die "switchover abandoned: $(name "$r") is behind"
  fi
  say "promoting $(name "$r") ($(port "$r"))"
  promote "$r"
  s_promote=$(since "$t") t=$(now_ms)
  say "starting $(name "$p") as a replica of $(name "$r")"
  strip_auto_conf "$p"
  install -m 0600 -o postgres -g postgres /dev/null "$(datadir "$p")/standby.signal"
  if ! start_node "$p" || ! wait_until 30 streams "$r" "$p"; then
    say "$(name "$p") does not stream from $(name "$r") after 30 s"
    rebuild "$p" "$r"
  fi
  wait_synced "$r" "$p"
  s_rejoin=$(since "$t")
  say "switchover: stop ${s_stop} s, promote ${s_promote} s, old primary streaming ($(mode)) ${s_rejoin} s, total $(since "$t0") s"
}

ensure_objects() { # P: database test and role root
  local got
  got=$(sql "$1" "select (select count(*) from pg_database where datname = 'test') || ' ' || (select count(*) from pg_roles where rolname = 'root')")
  case $got in 1\ *) ;; *) say "creating database test"; sqlw "$1" 'create database test' >/dev/null ;; esac
  case $got in *\ 1) ;; *) say "creating role root (superuser, what root's psql logs in as)"; sqlw "$1" 'create role root superuser login' >/dev/null ;; esac
}

# create N: a new cluster (initdb, start.conf manual so the system's
# postgresql service leaves it alone). Its data counts as empty, to be
# replaced by a copy of the other node, unless it is A and B has none either.
create() {
  local n=$1 data
  if ss -Htln "sport = :$(port "$n")" | grep -q .; then
    die "port $(port "$n") is taken: $(ss -Htlnp "sport = :$(port "$n")" | head -n1)"
  fi
  data=/var/lib/postgresql/$ver/$(name "$n")
  if [ -e "$data" ]; then
    say "removing $data, left without a cluster by an earlier run"
    rm -rf -- "$data"
  fi
  [ "$n" = b ] && : >"$state/rebuild-b"
  say "creating cluster $ver/$(name "$n") on port $(port "$n")"
  # initdb --no-sync: its fsyncs take seconds here, and a node whose files
  # a machine crash lost is rebuilt by the next up anyway.
  pg_createcluster "$ver" "$(name "$n")" -p "$(port "$n")" --start-conf manual -- --no-sync >"$state/create-$n.log" 2>&1 9>&- ||
    { cat "$state/create-$n.log" >&2; die "pg_createcluster $ver $(name "$n") failed"; }
}

cmd_up() {
  local want=${1:-sync} t0 n what configured sa sb p="" pids="" pid
  case $want in sync|async) ;; *) die "up takes sync or async, not '$want'" ;; esac
  t0=$(now_ms)
  check_tools
  lock
  if ! exists a && exists b && [ -f "$(datadir b)/PG_VERSION" ] && [ ! -e "$state/rebuild-b" ]; then
    : >"$state/rebuild-a" # B has the data; A will be its copy
  fi
  for n in a b; do
    exists "$n" || { create "$n" & pids="$pids $!"; }
  done
  for pid in $pids; do wait "$pid" || die "a cluster could not be created"; done
  configured=""
  for n in a b; do
    what=$(write_config "$n" "$want")
    configured=$configured$what
    if [ -n "$what" ] && [ -n "$(pm_pid "$n")" ]; then
      say "configuration of $(name "$n") changed: $what"
      if [ "$what" = restart ]; then ctl "$n" restart -m fast >/dev/null; else ctl "$n" reload >/dev/null; fi
    fi
  done

  # Fast path: A a writable primary with everything, B streaming from it as
  # the mode says, in one query.
  if [ -z "$configured" ] && [ -n "$(pm_pid a)" ] && [ -n "$(pm_pid b)" ] &&
    [ "$(sql a "select pg_is_in_recovery()::text || ' ' || current_setting('default_transaction_read_only')
         || ' ' || (select count(*) from pg_database where datname = 'test')
         || ' ' || (select count(*) from pg_roles where rolname = 'root')
         || ' ' || current_setting('synchronous_standby_names')
         || (select ' ' || state || ' ' || sync_state from pg_stat_replication where application_name = '$(name b)' limit 1)" 2>/dev/null)" = \
      "false off 1 1 $([ "$want" = sync ] && echo '* streaming sync' || echo ' streaming async')" ]; then
    say "up ($want): primary $(port a), replica $(port b) streaming ($want), nothing to do, in $(since "$t0") s"
    return 0
  fi

  # 1. The node whose data counts: the writable primary, else a read-only
  # one made writable, else whatever starts (a replica promoted, A first).
  sa=$(settled_state a) sb=$(settled_state b)
  if [ "$sa" != primary ] && [ "$sb" != primary ]; then
    if [ "$sa" = ro-primary ]; then say "$(name a) is read-only (demote); making it writable"; make_writable a
    elif [ "$sb" = ro-primary ]; then say "$(name b) is read-only (demote); making it writable"; make_writable b
    else
      for n in a b; do
        [ "$(node_state "$n")" = down ] || continue
        say "starting $(name "$n") ($(port "$n"))"
        start_node "$n" || say "$(name "$n") did not start; it will be rebuilt"
      done
      sa=$(settled_state a) sb=$(settled_state b)
      if [ "$sa" != primary ] && [ "$sb" != primary ]; then
        if [ "$sa" = replica ]; then say "no primary; promoting $(name a)"; promote a
        elif [ "$sb" = replica ]; then say "no primary; promoting $(name b)"; promote b
        else die "no node has data to serve (A $sa, B $sb); run '$0 down', then '$0 up'"
        fi
      fi
    fi
  fi
  p=$(find_primary)
  [ -n "$p" ] || die "no primary after the repairs (A $(node_state a), B $(node_state b))"
  ensure_objects "$p"

  # 2. The other node streams from it; 3. A is the primary.
  make_replica "$(peer "$p")" "$p"
  if [ "$p" = b ]; then
    say "$(name b) is the primary; switching over to $(name a)"
    switchover b a
  fi
  wait_synced a b
  say "up ($want): primary $(port a), replica $(port b) streaming ($want), in $(since "$t0") s"
}

cmd_switchover() {
  local p r t0; t0=$(now_ms)
  check_tools; lock
  p=$(find_primary); [ -n "$p" ] || die "there is no primary; run '$0 up'"
  r=$(peer "$p")
  streams "$p" "$r" || die "$(name "$r") is not a streaming replica of $(name "$p") ($(node_state "$r")); run '$0 rejoin' first"
  switchover "$p" "$r"
  port "$r"
}

cmd_crash() {
  local p r t pid
  check_tools; lock
  p=$(find_primary); [ -n "$p" ] || die "there is no primary; run '$0 up'"
  r=$(peer "$p")
  [ "$(node_state "$r")" = replica ] || die "$(name "$r") is $(node_state "$r"), no replica to promote; run '$0 rejoin' first"
  pid=$(pm_pid "$p")
  t=$(now_ms)
  kill_node "$p"
  say "killed $(name "$p") ($(port "$p"), postmaster $pid) with kill -9"
  promote "$r"
  say "promoted $(name "$r") ($(port "$r")) in $(since "$t") s after the kill; $(name "$p") stays down"
  wait_reaped "$p"
  port "$r"
}

# demote: checks both kinds of session see the change: one opened before it
# (it reads the new default at its next command) and a new one.
cmd_demote() {
  local p r t line pg_pid
  check_tools; lock
  p=$(find_primary); [ -n "$p" ] || die "there is no primary; run '$0 up'"
  r=$(peer "$p")
  [ "$(node_state "$r")" = replica ] || die "$(name "$r") is $(node_state "$r"), no replica to promote; run '$0 rejoin' first"
  t=$(now_ms)
  coproc OLD { exec "$bin/psql" -X -qAt -h 127.0.0.1 -p "$(port "$p")" -U postgres -d test 2>&1 9>&-; }
  pg_pid=$OLD_PID
  echo 'show transaction_read_only;' >&"${OLD[1]}"
  read -r -t 5 line <&"${OLD[0]}" || die "no answer from a session on $(name "$p")"
  [ "$line" = off ] || die "a session on $(name "$p") is already read-only ($line)"
  sql "$p" 'alter system set default_transaction_read_only = on' >/dev/null
  sql "$p" 'select pg_reload_conf()' >/dev/null
  # The open session takes the new default at its next command once it has
  # had the SIGHUP, which comes a moment after pg_reload_conf() returns.
  local i ok=no
  for i in $(seq 1 50); do
    echo 'show transaction_read_only;' >&"${OLD[1]}"
    read -r -t 5 line <&"${OLD[0]}" || break
    [ "$line" = on ] && { ok=yes; break; }
    sleep 0.1
  done
  eval "exec ${OLD[1]}>&-"
  wait "$pg_pid" 2>/dev/null || true
  [ $ok = yes ] || die "a session open on $(name "$p") still has transaction_read_only = '$line'"
  wait_until 5 eval "[ \"\$(sql $p 'show transaction_read_only')\" = on ]" ||
    die "a new session on $(name "$p") is not read-only"
  say "$(name "$p") ($(port "$p")) is read-only for open and new sessions"
  promote "$r"
  say "promoted $(name "$r") ($(port "$r")) in $(since "$t") s; $(name "$p") stays up, read-only"
  port "$r"
}

cmd_rejoin() {
  local p r t0; t0=$(now_ms)
  check_tools; lock
  p=$(find_primary); [ -n "$p" ] || die "there is no primary; run '$0 up'"
  r=$(peer "$p")
  exists "$r" || die "there is no cluster $(name "$r"); run '$0 up'"
  if [ "$(node_state "$r")" = replica ] && streams "$p" "$r"; then
    say "$(name "$r") already streams from $(name "$p")"
  else
    make_replica "$r" "$p"
  fi
  wait_synced "$p" "$r"
  say "rejoin: $(name "$r") ($(port "$r")) streams from $(name "$p") ($(port "$p"), $(mode)), in $(since "$t0") s"
}

cmd_status() {
  local n s rep
  for n in a b; do
    s=$(node_state "$n")
    case $s in
      primary|ro-primary)
        rep=$(sql "$n" "select coalesce(string_agg(application_name || ' ' || state || ' ' || sync_state, ', '), 'no replica') from pg_stat_replication where application_name like 'spillway_ha_%'" 2>/dev/null || echo '?')
        [ "$s" = ro-primary ] && s="read-only primary"
        echo "$(port "$n") $(name "$n") $s, replication: $rep"
        ;;
      replica)
        rep=$(sql "$n" "select coalesce((select status || ' from ' || sender_port from pg_stat_wal_receiver), 'not receiving')" 2>/dev/null || echo '?')
        echo "$(port "$n") $(name "$n") replica, replication: $rep"
        ;;
      *) echo "$(port "$n") $(name "$n") down ($s)" ;;
    esac
  done
}

cmd_down() {
  local n
  check_tools; lock
  bouncer_stop
  for n in a b; do
    if exists "$n"; then
      stop_node "$n" immediate
      pg_dropcluster --stop "$ver" "$(name "$n")" 9>&- || die "pg_dropcluster $ver $(name "$n") failed"
      say "dropped $ver/$(name "$n")"
    fi
    rm -rf -- "/var/lib/postgresql/$ver/$(name "$n")" "/var/lib/postgresql/$ver/$(name "$n")".old-*
  done
  rm -rf -- "$state"
  say "down: both clusters dropped, $state deleted"
}

# --- PgBouncer ---

bouncer_bin() {
  command -v pgbouncer 2>/dev/null || { [ -x /usr/sbin/pgbouncer ] && echo /usr/sbin/pgbouncer; } || true
}

# need_pgbouncer: installs the package when missing (never under CI=true,
# where hack/services.sh is to have done it). Installing may set up Debian's
# own pgbouncer service (6432, /etc/pgbouncer), which this script leaves alone.
need_pgbouncer() {
  [ -n "$(bouncer_bin)" ] && return 0
  [ "${CI:-}" = true ] && die "pgbouncer is not installed (package pgbouncer: apt-get install pgbouncer, or hack/services.sh)"
  [ "$(id -u)" = 0 ] || die "pgbouncer is not installed, and installing the package pgbouncer needs root"
  local log=$state/apt.log
  install -d -m 0755 "$state"
  say "pgbouncer is not installed; installing the package pgbouncer"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer >"$log" 2>&1 9>&-; then
    say "apt-get install failed; running apt-get update and trying again"
    if ! { apt-get update >>"$log" 2>&1 9>&- && DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer >>"$log" 2>&1 9>&-; }; then
      tail -n 15 "$log" >&2
      die "could not install the package pgbouncer (apt-get install -y pgbouncer); see $log"
    fi
  fi
  [ -n "$(bouncer_bin)" ] || die "the package pgbouncer is installed but there is no pgbouncer binary"
  say "installed $("$(bouncer_bin)" --version | head -n1)"
}

bouncer_pid() {
  local pid
  pid=$(cat "$bdir/pgbouncer.pid" 2>/dev/null) || return 0
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "$bini" && echo "$pid" || true
}

# admin SQL: a command on PgBouncer's admin console.
admin() {
  PGCONNECT_TIMEOUT=3 "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$bport" -U postgres -d pgbouncer -c "$1" 9>&-
}

# bouncer_check DB USER: a query through PgBouncer works (bounded: a paused or
# killed database makes it wait).
bouncer_check() {
  [ "$(PGCONNECT_TIMEOUT=3 timeout 10 "$bin/psql" -X -qAt -h 127.0.0.1 -p "$bport" -U "$2" -d "$1" -c 'select current_user' 9>&- 2>&1)" = "$2" ]
}

bouncer_launch() {
  if ss -Htln "sport = :$bport" | grep -q .; then
    die "port $bport is taken: $(ss -Htlnp "sport = :$bport" | head -n1)"
  fi
  rm -f "$bdir/pgbouncer.pid"
  # PgBouncer refuses to run as root; -d: it daemonizes once it listens.
  (cd / && runuser -u postgres -- "$(bouncer_bin)" -d -q "$bini" 9>&-) ||
    { tail -n 15 "$bdir/pgbouncer.log" >&2 2>/dev/null || true; die "pgbouncer did not start; see $bdir/pgbouncer.log"; }
  wait_until 10 eval 'admin "show version" >/dev/null 2>&1' ||
    { tail -n 15 "$bdir/pgbouncer.log" >&2 2>/dev/null || true; die "pgbouncer's admin console does not answer on $bport; see $bdir/pgbouncer.log"; }
}

bouncer_stop() {
  local pid i
  pid=$(bouncer_pid)
  [ -n "$pid" ] || return 0
  # SIGTERM is PgBouncer's immediate shutdown; SIGINT would wait for every
  # session-mode client to leave.
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then
    say "pgbouncer (pid $pid) did not exit in 10 s; killing it"
    kill -9 "$pid" 2>/dev/null || true
    wait_until 5 eval "! alive $pid" || die "pgbouncer (pid $pid) does not die"
  fi
  say "stopped pgbouncer (pid $pid)"
}

bouncer_up() {
  local p t0 text changed=no pid u db; t0=$(now_ms)
  check_tools
  lock
  need_pgbouncer
  p=$(find_primary); [ -n "$p" ] || die "there is no primary; run '$0 up' first"
  install -d -m 0755 -o postgres -g postgres "$bdir"
  IFS= read -r -d '' text <<EOF || true
; Written by hack/postgres-ha.sh pgbouncer up: its own PgBouncer, in front of
; the current primary ($(name "$p")).
[databases]
test_tx = host=127.0.0.1 port=$(port "$p") dbname=test pool_mode=transaction
test_session = host=127.0.0.1 port=$(port "$p") dbname=test pool_mode=session

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir = $bdir
pidfile = $bdir/pgbouncer.pid
logfile = $bdir/pgbouncer.log
auth_type = trust
auth_file = $bdir/userlist.txt
admin_users = postgres, root
pool_mode = session
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
EOF
  put "$bini" 0644 "$text" && changed=yes
  put "$bdir/userlist.txt" 0640 $'"postgres" ""\n"root" ""\n' && changed=yes
  pid=$(bouncer_pid)
  if [ -n "$pid" ] && [ $changed = no ]; then
    say "pgbouncer is already running (pid $pid)"
    for db in $bdbs; do
      # SHOW DATABASES: ... paused, disabled are the last two columns.
      case $(PGCONNECT_TIMEOUT=3 "$bin/psql" -X -qAt -F' ' -h 127.0.0.1 -p "$bport" -U postgres -d pgbouncer -c 'show databases' 9>&- | awk -v d="$db" '$1 == d { print $(NF-1) }') in
        1) say "note: $db is paused or killed; '$0 pgbouncer resume' ends that" ;;
      esac
    done
  else
    if [ -n "$pid" ]; then
      say "configuration changed (primary $(name "$p")); RELOAD"
      admin 'reload' >/dev/null
    else
      say "starting pgbouncer on 127.0.0.1:$bport ($("$(bouncer_bin)" --version | head -n1))"
      bouncer_launch
    fi
    for db in $bdbs; do
      for u in postgres root; do
        bouncer_check "$db" "$u" || die "no query through pgbouncer: $db as $u; see $bdir/pgbouncer.log"
      done
    done
  fi
  say "pgbouncer up: 127.0.0.1:$bport -> primary $(port "$p"): test_tx (transaction), test_session (session), in $(since "$t0") s"
}

bouncer_cmd() { # PAUSE|RESUME|RECONNECT|KILL [DB]
  local c=$1 db=${2:-} list out rc wait=${SPILLWAY_PGBOUNCER_PAUSE_WAIT:-30}
  [ -n "$(bouncer_pid)" ] || die "the script's pgbouncer is not running; run '$0 pgbouncer up'"
  case $db in '') list=$bdbs ;; test_tx|test_session) list=$db ;; *) die "database must be test_tx or test_session, not '$db'" ;; esac
  for db in $list; do
    # PAUSE returns once every server connection of db is released: at the
    # end of its transaction in transaction mode, only when the client
    # disconnects in session mode. The others return at once.
    rc=0
    out=$(PGCONNECT_TIMEOUT=3 timeout "$wait" "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$bport" \
      -U postgres -d pgbouncer -c "$c $db" 9>&- 2>&1) || rc=$?
    [ $rc = 0 ] && continue
    case $c:$rc:$out in
      RESUME:*"is not paused"*) say "$db was not paused" ;;
      PAUSE:124:*)
        die "PAUSE $db did not complete in $wait s (\$SPILLWAY_PGBOUNCER_PAUSE_WAIT): clients still hold server connections (a session-mode client keeps its own, and can use it, until it disconnects). $db stays paused for everyone else until '$0 pgbouncer resume'" ;;
      *) die "$c $db: ${out:-psql exited with $rc}" ;;
    esac
  done
  say "pgbouncer ${c,,}: $list"
}

bouncer_show() {
  [ -n "$(bouncer_pid)" ] || die "the script's pgbouncer is not running; run '$0 pgbouncer up'"
  admin 'show databases'
  admin 'show pools'
  admin 'show servers'
}

cmd_pgbouncer() {
  local c=${1:-}; [ $# -gt 0 ] && shift
  case $c in
    up) bouncer_up ;;
    pause|resume|reconnect|kill)
      [ -n "$(bouncer_bin)" ] || die "pgbouncer is not installed; run '$0 pgbouncer up'"
      bouncer_cmd "${c^^}" "${1:-}" ;;
    restart)
      check_tools; lock
      [ -f "$bini" ] || die "no $bini; run '$0 pgbouncer up'"
      local t0; t0=$(now_ms)
      bouncer_stop
      bouncer_launch
      say "pgbouncer restarted (pid $(bouncer_pid)) in $(since "$t0") s"
      ;;
    stop) check_tools; lock; bouncer_stop; say "pgbouncer stopped" ;;
    show) bouncer_show ;;
    *) usage ;;
  esac
}

usage() {
  sed -n '/^# Subcommands/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  up) cmd_up "$@" ;;
  primary) p=$(find_primary); [ -n "$p" ] || die "there is no primary"; port "$p" ;;
  replica) r=$(find_replica); [ -n "$r" ] || die "there is no replica"; port "$r" ;;
  switchover) cmd_switchover ;;
  crash) cmd_crash ;;
  demote) cmd_demote ;;
  rejoin) cmd_rejoin ;;
  status) cmd_status ;;
  down) cmd_down ;;
  pgbouncer) cmd_pgbouncer "$@" ;;
  *) usage ;;
esac
