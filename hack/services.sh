#!/usr/bin/env bash
# Makes sure the local Postgres and RabbitMQ the tests use are up, starting
# them when they are installed but stopped. Idempotent.
set -euo pipefail

wait_for() { # name, command...
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "services: $name did not come up" >&2
  return 1
}

# hack/postgres-ha.sh and hack/postgres-tls.sh build their clusters with
# postgresql-common's tools.
if ! command -v pg_createcluster >/dev/null; then
  echo "services: pg_createcluster is missing: install the package postgresql-common" >&2
  exit 1
fi

# install PACKAGE installs a Debian package, refreshing the package lists
# once if a fresh image has none yet.
install() {
  echo "services: installing $1"
  local apt_log
  apt_log=$(mktemp)
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y "$1" >"$apt_log" 2>&1; then
    echo "services: apt-get install failed; running apt-get update and trying again"
    if ! { apt-get update >>"$apt_log" 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y "$1" >>"$apt_log" 2>&1; }; then
      tail -n 15 "$apt_log" >&2
      echo "services: could not install the package $1 (apt-get install -y $1)" >&2
      exit 1
    fi
  fi
  rm -f "$apt_log"
}

# The PgBouncer fault tests run their own pgbouncer (hack/postgres-ha.sh
# pgbouncer up); they need the binary, not the package's service. /usr/sbin
# may be missing from a non-root PATH.
if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
  install pgbouncer
fi

# The local node's own specs run a shell image built from the static
# busybox (test/kubeenv): a static program is a whole image by itself.
if [ ! -x /bin/busybox ]; then
  install busybox-static
fi

# The database fault suite parts a drainer from a server of its own by a
# veth pair into a network namespace, made with ip (test/netsplit).
if ! command -v ip >/dev/null; then
  install iproute2
fi

if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  if [ -d /etc/postgresql ]; then
    echo "services: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  fi
  wait_for PostgreSQL pg_isready -h 127.0.0.1 -p 5432 -q
fi

if ! rabbitmq-diagnostics -q check_port_connectivity >/dev/null 2>&1; then
  if command -v rabbitmq-server >/dev/null; then
    if ! rabbitmqctl -q status >/dev/null 2>&1; then
      echo "services: starting RabbitMQ"
      rabbitmq-server -detached
    fi
    wait_for "RabbitMQ node" rabbitmqctl -q await_startup
    # A fault suite that stopped the app or set an alarm must not leak.
    rabbitmqctl -q start_app >/dev/null 2>&1 || true
  fi
  wait_for "RabbitMQ port" rabbitmq-diagnostics -q check_port_connectivity
fi
# A memory alarm left by an interrupted fault run would block every publisher.
if ! rabbitmq-diagnostics -q check_local_alarms >/dev/null 2>&1; then
  echo "services: clearing a RabbitMQ resource alarm (memory watermark back to 0.4)"
  rabbitmqctl -q set_vm_memory_high_watermark 0.4
fi
echo "services: PostgreSQL and RabbitMQ are up"
