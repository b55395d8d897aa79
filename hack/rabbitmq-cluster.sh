#!/usr/bin/env bash
# Runs a three-node RabbitMQ cluster beside the system node (rabbit@localhost,
# which it never touches), for the failover, rolling-restart, partition and TLS
# tests: spill1@localhost, spill2@localhost, spill3@localhost, clustered, with
# cluster_partition_handling = pause_minority.
#
#   node    AMQP  AMQPS  Erlang distribution
#   spill1  5682  5692   25682
#   spill2  5683  5693   25683
#   spill3  5684  5694   25684
#
# Each node runs as the rabbitmq user with HOME=/var/lib/rabbitmq, so it shares
# the system node's Erlang cookie (/var/lib/rabbitmq/.erlang.cookie) and its
# epmd, and rabbitmqctl reaches all of them the same way. Each node has its own
# rabbitmq.conf, rabbitmq-env.conf (the system one names the node
# rabbit@localhost), enabled_plugins (the system file could enable management
# or prometheus, whose ports would clash), mnesia and log directories and pid
# file, all in the state directory ($SPILLWAY_RMQ_CLUSTER_DIR, default
# /tmp/spillway-rabbitmq-cluster):
#   certs/            made by hack/tls-certs.sh (CA, server, client, wrong CA)
#   spillN/rabbitmq.conf rabbitmq-env.conf enabled_plugins spillN.pid
#   spillN/certs/     ca.crt server.crt server.key: the node's own copy, what
#                     its TLS listener serves (a rotation test replaces it, then
#                     runs reload-certs N; without that the node still picks
#                     the new files up within ~2 min); `start` refreshes it
#                     from certs/ for a node that is not running, start-node
#                     and restart-node keep it
#   spillN/mnesia/ spillN/log/ spillN/startup.log, .lock (flock of the
#                     changing subcommands)
# Plugins: rabbitmq_auth_mechanism_ssl only (EXTERNAL, CN=guest → user guest).
# guest stays loopback-only, which is fine: everything listens on 127.0.0.1.
#
# Subcommands:
#   start            start the nodes not running, wait for them, cluster spill2
#                    and spill3 with spill1 (unless already), print cluster_status
#   stop             stop all three (rabbitmqctl stop; kill -9 of what is left)
#   status           cluster_status, as seen by the first node that answers
#   env              KEY=value lines for the tests
#   kill-node N      kill -9 node N's beam (and its children; never epmd)
#   start-node N     start node N and wait until it runs in the cluster again
#                    (the others must be up: a lone node of a stopped cluster
#                    waits for its peers' tables; use start for that)
#   restart-node N   rabbitmqctl stop, then start-node N (rolling-restart step)
#   reload-certs [N] make node N (default: all) serve spillN/certs/server.* on
#                    new TLS connections, without a restart
#   partition-node N cut node N off from the other two (the minority pauses);
#                    lasts until heal-node N or a restart of node N
#   heal-node N      undo partition-node N and wait until N runs again
#   destroy          stop, then delete the state directory
set -euo pipefail

me=rabbitmq-cluster
say() { echo "$me: $*"; }
die() { echo "$me: error: $*" >&2; exit 1; }

cd "$(dirname "$0")/.."
repo=$PWD
state=${SPILLWAY_RMQ_CLUSTER_DIR:-/tmp/spillway-rabbitmq-cluster}
case $state in /*) ;; *) state=$repo/$state ;; esac
certs=$state/certs
nodes="1 2 3"
rmq_bin=/usr/lib/rabbitmq/bin
cookie_home=/var/lib/rabbitmq

node() { echo "spill$1@localhost"; }
amqp_port() { echo $((5681 + $1)); }
amqps_port() { echo $((5691 + $1)); }
dist_port() { echo $((25681 + $1)); }
ndir() { echo "$state/spill$1"; }

check_tools() {
  command -v rabbitmq-server >/dev/null && [ -x "$rmq_bin/rabbitmq-server" ] ||
    die "rabbitmq-server is not installed (apt-get install rabbitmq-server)"
  [ -x "$rmq_bin/rabbitmqctl" ] || die "$rmq_bin/rabbitmqctl is missing"
  id rabbitmq >/dev/null 2>&1 || die "there is no rabbitmq user (is rabbitmq-server installed?)"
  [ -s "$cookie_home/.erlang.cookie" ] ||
    die "$cookie_home/.erlang.cookie is missing: start the system node once (rabbitmq-server -detached) to create it"
  local t
  for t in runuser flock; do command -v $t >/dev/null || die "$t is missing (util-linux)"; done
  command -v ss >/dev/null || die "ss is missing (iproute2)"
  command -v pgrep >/dev/null || die "pgrep is missing (procps)"
  command -v openssl >/dev/null || die "openssl is missing"
  command -v epmd >/dev/null || die "epmd is missing (erlang-base)"
  [ "$(id -u)" = 0 ] || die "run as root (the nodes run as the rabbitmq user)"
}

check_n() {
  case ${1:-} in 1|2|3) ;; *) die "node number must be 1, 2 or 3, not '${1:-}'" ;; esac
}

# as_rabbitmq: run a command as the rabbitmq user in a clean environment, so
# nothing of the caller's (RABBITMQ_NODENAME, ERL_FLAGS...) leaks in, and
# without the lock's descriptor (a node must not hold the lock).
as_rabbitmq() {
  (cd / && runuser -u rabbitmq -- env -i HOME=$cookie_home LANG=C.UTF-8 LC_ALL=C.UTF-8 \
    PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@" 9>&-)
}

# lock: one changing subcommand at a time (parallel test packages may all run
# start); the others wait.
lock() {
  install -d -m 0755 "$state"
  exec 9>"$state/.lock"
  flock -w 600 9 || die "another $me run holds $state/.lock"
}

# ctl N args...: rabbitmqctl against node N.
ctl() {
  local n=$1; shift
  as_rabbitmq "$rmq_bin/rabbitmqctl" -q -n "$(node "$n")" "$@"
}

# beam_pid N: the pid of node N's Erlang VM, found by the -spillway_node marker
# on its command line (the system node has none). Empty when not running.
beam_pid() {
  local p
  for p in $(pgrep -x beam.smp || true); do
    if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "-spillway_node spill$1 "; then
      echo "$p"; return 0
    fi
  done
}

# registered N: node N's name is in epmd (it gets there early in its boot and
# leaves when its VM exits).
registered() { epmd -names 2>/dev/null | grep -q "^name spill$1 at port"; }

descendants() { # pid: every process below it
  local c
  for c in $(pgrep -P "$1" || true); do echo "$c"; descendants "$c"; done
}

write_config() { # N
  local n=$1 d; d=$(ndir "$1")
  install -d -m 0755 -o rabbitmq -g rabbitmq "$d" "$d/mnesia" "$d/log" "$d/conf.d"
  install -d -m 0755 -o root -g root "$d/certs"
  cat >"$d/rabbitmq.conf.new" <<EOF
# Written by hack/rabbitmq-cluster.sh; rewritten by every start.
listeners.tcp.default = 127.0.0.1:$(amqp_port "$n")
listeners.ssl.default = 127.0.0.1:$(amqps_port "$n")
ssl_options.cacertfile = $d/certs/ca.crt
ssl_options.certfile = $d/certs/server.crt
ssl_options.keyfile = $d/certs/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
ssl_cert_login_from = common_name
cluster_partition_handling = pause_minority
log.console = false
log.file.level = info
EOF
  mv -f "$d/rabbitmq.conf.new" "$d/rabbitmq.conf"
  # Replaces /etc/rabbitmq/rabbitmq-env.conf, which names the system node.
  cat >"$d/rabbitmq-env.conf" <<EOF
# Written by hack/rabbitmq-cluster.sh. The node's settings are in the
# environment its start sets; this file only stands in for the system one.
ERL_EPMD_ADDRESS=127.0.0.1
EOF
  echo '[rabbitmq_auth_mechanism_ssl].' >"$d/enabled_plugins"
  chmod 0644 "$d/rabbitmq.conf" "$d/rabbitmq-env.conf" "$d/enabled_plugins"
}

copy_certs() { # N: the node's own copy of the server certificate
  local d f; d=$(ndir "$1")
  for f in ca.crt server.crt server.key; do
    install -m 0644 -o root -g root "$certs/$f" "$d/certs/$f.new"
    mv -f "$d/certs/$f.new" "$d/certs/$f"
  done
}

# launch N: start node N detached (returns at once).
launch() {
  local n=$1 d; d=$(ndir "$1")
  local p
  for p in "$(amqp_port "$n")" "$(amqps_port "$n")" "$(dist_port "$n")"; do
    if ss -Htln "sport = :$p" | grep -q .; then
      die "port $p (for $(node "$n")) is taken: $(ss -Htlnp "sport = :$p" | head -n1)"
    fi
  done
  [ -s "$d/certs/server.crt" ] || copy_certs "$n"
  : >"$d/startup.log"; chown rabbitmq:rabbitmq "$d/startup.log"
  rm -f "$d/spill$n.pid"
  as_rabbitmq \
    RABBITMQ_NODENAME="$(node "$n")" \
    RABBITMQ_USE_LONGNAME=false \
    RABBITMQ_DIST_PORT="$(dist_port "$n")" \
    RABBITMQ_CONF_ENV_FILE="$d/rabbitmq-env.conf" \
    RABBITMQ_CONFIG_FILE="$d/rabbitmq.conf" \
    RABBITMQ_CONFIG_FILES="$d/conf.d" \
    RABBITMQ_ADVANCED_CONFIG_FILE="$d/advanced.config" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$d/enabled_plugins" \
    RABBITMQ_MNESIA_BASE="$d/mnesia" \
    RABBITMQ_LOG_BASE="$d/log" \
    RABBITMQ_PID_FILE="$d/spill$n.pid" \
    ERL_EPMD_ADDRESS=127.0.0.1 \
    ERL_CRASH_DUMP="$d/log/erl_crash.dump" \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1} -spillway_node spill$n" \
    sh -c "cd '$d' && exec '$rmq_bin/rabbitmq-server' -detached" >>"$d/startup.log" 2>&1 ||
    die "$(node "$n") did not start; see $d/startup.log and $d/log"
}

# await N: wait until node N has booted (its VM in epmd, then await_startup).
await() {
  local n=$1 i
  for i in $(seq 1 300); do
    registered "$n" && break
    if [ "$i" -gt 20 ] && [ -z "$(beam_pid "$n")" ]; then
      tail -n 20 "$(ndir "$n")/startup.log" "$(ndir "$n")/log/$(node "$n").log" >&2 2>/dev/null || true
      die "$(node "$n") exited during its start; see $(ndir "$n")/log"
    fi
    sleep 0.1
  done
  registered "$n" || die "$(node "$n") did not register with epmd in 30 s"
  ctl "$n" await_startup --timeout 120 >/dev/null ||
    die "$(node "$n") did not finish its boot; see $(ndir "$n")/log/$(node "$n").log"
  say "$(node "$n") booted (at ${SECONDS} s)"
}

# running_nodes N: the cluster's running nodes as node N sees them.
running_nodes() {
  ctl "$1" eval 'io:format("~s~n", [lists:join(" ", [atom_to_list(X) || X <- lists:sort(rabbit_mnesia:cluster_nodes(running))])]), ok.' 2>/dev/null | head -n1
}

clustered_with_1() { # N: node N's cluster includes spill1
  [ "$(ctl "$1" eval 'lists:member(spill1@localhost, rabbit_mnesia:cluster_nodes(all)).' 2>/dev/null)" = true ]
}

join() { # N: join node N to spill1
  local n=$1
  say "joining $(node "$n") to spill1@localhost"
  ctl "$n" stop_app >/dev/null
  if ! ctl "$n" join_cluster spill1@localhost >/dev/null 2>&1; then
    say "$(node "$n"): join_cluster failed; resetting it and trying again"
    ctl "$n" force_reset >/dev/null
    ctl "$n" join_cluster spill1@localhost >/dev/null
  fi
  ctl "$n" start_app >/dev/null
}

# wait_running N: wait until node N runs and sees all the nodes whose VM is up.
wait_running() {
  local n=$1 want="" m i got=""
  for m in $nodes; do [ -n "$(beam_pid "$m")" ] && want="$want $(node "$m")"; done
  want=${want# }
  for i in $(seq 1 120); do
    got=$(running_nodes "$n" || true)
    [ "$got" = "$want" ] && return 0
    sleep 0.5
  done
  die "$(node "$n") sees running nodes '$got', expected '$want'"
}

stop_node() { # N
  local n=$1 pid i
  pid=$(beam_pid "$n")
  [ -n "$pid" ] || { say "$(node "$n") is not running"; return 0; }
  ctl "$n" stop >/dev/null 2>&1 || true
  for i in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "$(node "$n") (pid $pid) did not stop in 30 s; killing it"
    kill_node "$n"
  fi
  say "stopped $(node "$n")"
}

kill_node() { # N
  local n=$1 pid kids i
  pid=$(beam_pid "$n")
  [ -n "$pid" ] || { say "$(node "$n") is not running"; return 0; }
  kids=$(descendants "$pid")
  kill -9 "$pid"
  # erl_child_setup and inet_gethost die with the VM; make sure. epmd is never
  # a child (it daemonizes), so it is not among them.
  for i in $kids; do
    [ "$(cat "/proc/$i/comm" 2>/dev/null)" = epmd ] || kill -9 "$i" 2>/dev/null || true
  done
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  # epmd forgets the name once the VM's socket closes.
  for i in $(seq 1 50); do registered "$n" || break; sleep 0.1; done
  say "killed $(node "$n") (pid $pid)"
}

start_node() { # N
  local n=$1 t0=$SECONDS
  if [ -n "$(beam_pid "$n")" ]; then
    say "$(node "$n") is already running"
  else
    write_config "$n"
    say "starting $(node "$n")"
    launch "$n"
  fi
  await "$n"
  clustered_with_1 "$n" || join "$n"
  wait_running "$n"
  say "$(node "$n") runs in the cluster (at ${SECONDS} s)"
}

cmd_start() {
  local t0=$SECONDS n p pids=""
  "$repo/hack/tls-certs.sh" "$certs" | sed 's/^/  /'
  for n in $nodes; do
    if [ -n "$(beam_pid "$n")" ]; then
      say "$(node "$n") is already running"
      continue
    fi
    write_config "$n"
    copy_certs "$n"
    say "starting $(node "$n") (amqp $(amqp_port "$n"), amqps $(amqps_port "$n"), dist $(dist_port "$n"))"
    launch "$n"
  done
  # Booting nodes of one cluster wait for each other's tables, so they start
  # together and are awaited together.
  for n in $nodes; do
    await "$n" &
    pids="$pids $!"
  done
  for p in $pids; do wait "$p" || die "a node did not start"; done
  # Both join at once: mnesia serialises their schema changes, and this
  # saves one stop_app/join_cluster/start_app round (~8 s here).
  pids=""
  for n in 2 3; do
    { clustered_with_1 "$n" || join "$n"; } &
    pids="$pids $!"
  done
  for p in $pids; do wait "$p" || die "a node did not join spill1@localhost"; done
  wait_running 1
  ctl 1 cluster_status
  say "cluster up in $((SECONDS - t0)) s"
}

cmd_stop() {
  local n p pids=""
  for n in $nodes; do
    stop_node "$n" &
    pids="$pids $!"
  done
  for p in $pids; do wait "$p" || true; done
  for n in $nodes; do
    [ -z "$(beam_pid "$n")" ] || die "$(node "$n") is still running"
  done
  say "all stopped"
}

cmd_status() {
  local n
  check_tools
  for n in $nodes; do
    if [ -n "$(beam_pid "$n")" ] && ctl "$n" cluster_status 2>/dev/null; then return 0; fi
  done
  die "no spill node is running (state dir $state)"
}

cmd_env() {
  echo "SPILLWAY_RMQ_CLUSTER_DIR=$state"
  echo "SPILLWAY_RMQ_CERTS=$certs"
  echo "SPILLWAY_RMQ_NODES=spill1@localhost,spill2@localhost,spill3@localhost"
  echo "SPILLWAY_RMQ_NODE_CERTS=$state/spill1/certs,$state/spill2/certs,$state/spill3/certs"
  echo "SPILLWAY_RMQ_AMQP_URLS=amqp://guest:guest@127.0.0.1:5682/,amqp://guest:guest@127.0.0.1:5683/,amqp://guest:guest@127.0.0.1:5684/"
  echo "SPILLWAY_RMQ_AMQPS_URLS=amqps://localhost:5692/,amqps://localhost:5693/,amqps://localhost:5694/"
}

# reload-certs: the TLS listener's options name files, which Erlang's ssl
# reads at each handshake through its PEM cache; that cache is only checked
# for changed files every ssl_pem_cache_clean (2 min by default), so
# `rabbitmqctl eval 'ssl:clear_pem_cache().'` is what makes the next handshake
# read the new server.crt/server.key (and ca.crt) at once. Live connections
# keep their certificate. Checked with openssl s_client afterwards.
cmd_reload_certs() {
  local n want got list=${1:-$nodes}
  for n in $list; do
    check_n "$n"
    [ -n "$(beam_pid "$n")" ] || die "$(node "$n") is not running"
    ctl "$n" eval 'ssl:clear_pem_cache().' >/dev/null
    # Check: the certificate a new handshake gets is the file's.
    want=$(openssl x509 -in "$(ndir "$n")/certs/server.crt" -noout -serial | cut -d= -f2)
    got=$(timeout 10 openssl s_client -connect "127.0.0.1:$(amqps_port "$n")" </dev/null 2>/dev/null |
      openssl x509 -noout -serial 2>/dev/null | cut -d= -f2 || true)
    [ "$got" = "$want" ] || die "$(node "$n") serves serial '${got:-none}' on $(amqps_port "$n"), not $want of $(ndir "$n")/certs/server.crt"
    say "$(node "$n") serves $(ndir "$n")/certs/server.crt (serial $want) on new TLS connections"
  done
}

# partition-node N: node N uses a wrong cookie for the other two (a per-node
# cookie, erlang:set_cookie/2), so every distribution handshake between them
# fails both ways, and drops its connections to them. The CLI, which uses the
# node's default cookie, still reaches every node. With pause_minority node N
# stops its rabbit app at once; the other two keep running.
cmd_partition_node() {
  local n=$1 m others=""
  check_n "$n"
  [ -n "$(beam_pid "$n")" ] || die "$(node "$n") is not running"
  for m in $nodes; do [ "$m" = "$n" ] || others="$others,$(node "$m")"; done
  others=${others#,}
  ctl "$n" eval "[begin erlang:set_cookie(O, spillway_partitioned), erlang:disconnect_node(O) end || O <- [$others]], ok." >/dev/null
  say "cut $(node "$n") off from $others; waiting for it to pause (pause_minority)"
  local i
  for i in $(seq 1 120); do
    [ "$(ctl "$n" eval 'rabbit:is_running().' 2>/dev/null)" = false ] && break
    sleep 0.5
  done
  [ "$(ctl "$n" eval 'rabbit:is_running().' 2>/dev/null)" = false ] || die "$(node "$n") did not pause"
  say "$(node "$n") paused; the others see: $(running_nodes "$( [ "$n" = 1 ] && echo 2 || echo 1)")"
}

cmd_heal_node() {
  local n=$1 m others="" t0=$SECONDS
  check_n "$n"
  [ -n "$(beam_pid "$n")" ] || die "$(node "$n") is not running"
  for m in $nodes; do [ "$m" = "$n" ] || others="$others,$(node "$m")"; done
  others=${others#,}
  ctl "$n" eval "[erlang:set_cookie(O, erlang:get_cookie()) || O <- [$others]], ok." >/dev/null
  say "healed $(node "$n"); waiting for it to run in the cluster again"
  for m in $nodes; do [ -n "$(beam_pid "$m")" ] && wait_running "$m"; done
  say "$(node "$n") is back ($((SECONDS - t0)) s)"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  start|stop|kill-node|start-node|restart-node|reload-certs|partition-node|heal-node|destroy)
    check_tools; lock ;;
esac
case $cmd in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) cmd_env ;;
  kill-node) check_n "${1:-}"; kill_node "$1" ;;
  start-node) check_n "${1:-}"; start_node "$1" ;;
  restart-node)
    check_n "${1:-}"
    t0=$SECONDS
    stop_node "$1"
    start_node "$1"
    say "restarted $(node "$1") in $((SECONDS - t0)) s"
    ;;
  reload-certs) cmd_reload_certs "${1:-}" ;;
  partition-node) cmd_partition_node "${1:-}" ;;
  heal-node) cmd_heal_node "${1:-}" ;;
  destroy)
    cmd_stop
    rm -rf "$state"
    say "deleted $state"
    ;;
  *)
    sed -n '/^# Subcommands:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
