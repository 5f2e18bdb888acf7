#!/usr/bin/env bash
# Makes sure the Redis of GATEWAY_REDIS_URL and the PostgreSQL of
# GATEWAY_DATABASE_URL answer (unset: 127.0.0.1:6379 and 127.0.0.1:5432).
# Uses the ones already listening. Where nothing answers and the URL names the
# default local address, starts a private one from installed binaries (data
# under $RUN_DIR), else, as root on Debian, installs it first; where the URL
# names any other host or port, it only says that nothing answers there.
# The same for RabbitMQ at GATEWAY_EVENTS_AMQP_URL (unset: 127.0.0.1:5672, where
# the tests publish). `services.sh haproxy` only makes sure the haproxy binary
# is installed (the HAProxy test starts its own), `services.sh rabbitmq` the
# RabbitMQ scripts (the broker restart test starts its own node).
set -euo pipefail
RUN_DIR=${RUN_DIR:-/tmp/flashsale-services}
mkdir -p "$RUN_DIR"

listening() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# $2: tenths of a second to wait (RabbitMQ boots in about 5 s).
wait_port() {
  for _ in $(seq 1 "${2:-100}"); do listening 127.0.0.1 "$1" && return 0; sleep 0.1; done
  echo "services: nothing answers on 127.0.0.1:$1" >&2; return 1
}

# "host port" of a redis:// or postgresql:// URL ($2: the default port).
address_of() {
  local rest=${1#*://}
  rest=${rest##*@}          # user:password@
  rest=${rest%%[/?]*}       # /database, ?options
  local host=${rest%:*} port=${rest##*:}
  if [ "$host" = "$rest" ]; then port=$2; fi
  host=${host#[}; host=${host%]}
  echo "${host:-127.0.0.1} ${port:-$2}"
}

# Whether host:port ($1 $2) answers; if not, whether it is ours to start
# (the default port $3 on 127.0.0.1); else a message naming $4 and exit 1.
answers_or_ours() {
  listening "$1" "$2" && return 0
  case "$1" in 127.0.0.1|localhost) [ "$2" = "$3" ] && return 1 ;; esac
  echo "services: nothing answers at $1:$2 ($4); start it there, or unset $4" >&2
  exit 1
}

apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # Wait for another installer's lock (a parallel test worker) rather than fail.
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >/dev/null
  else
    echo "services: please install $* (Debian: apt-get install $*)" >&2; exit 1
  fi
}

pg_bindir() {
  if command -v pg_ctl >/dev/null; then dirname "$(command -v pg_ctl)"; return; fi
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

ensure_redis() {
  local address; address=$(address_of "${GATEWAY_REDIS_URL:-redis://127.0.0.1:6379/0}" 6379)
  # shellcheck disable=SC2086
  answers_or_ours $address 6379 GATEWAY_REDIS_URL && return 0
  command -v redis-server >/dev/null || apt_install redis-server
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir "$RUN_DIR" --logfile "$RUN_DIR/redis.log"
  wait_port 6379
}

# The Redis Cluster tests start their own nodes and need both binaries.
ensure_cluster_tools() {
  command -v redis-server >/dev/null || apt_install redis-server
  command -v redis-cli >/dev/null || apt_install redis-tools
}

ensure_postgres() {
  local address
  address=$(address_of "${GATEWAY_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/x}" 5432)
  # shellcheck disable=SC2086
  answers_or_ours $address 5432 GATEWAY_DATABASE_URL && return 0
  [ -n "$(pg_bindir)" ] || apt_install postgresql
  local bin; bin=$(pg_bindir)
  local data="$RUN_DIR/pg"
  local as=()
  if [ "$(id -u)" = 0 ]; then
    # initdb and pg_ctl refuse to run as root.
    as=(runuser -u postgres --)
    chown postgres "$RUN_DIR"
  fi
  if [ ! -f "$data/PG_VERSION" ]; then
    "${as[@]}" "$bin/initdb" -D "$data" -U postgres --auth=trust >/dev/null
  fi
  "${as[@]}" "$bin/pg_ctl" -D "$data" -l "$RUN_DIR/pg.log" -w \
    -o "-p 5432 -k $RUN_DIR -c listen_addresses=127.0.0.1" start >/dev/null
  wait_port 5432
}

# Debian's scripts: run directly, not through /usr/sbin's wrapper, which
# switches to the rabbitmq user and its own node.
RABBIT_BIN=/usr/lib/rabbitmq/bin

ensure_rabbitmq_tools() {
  [ -x "$RABBIT_BIN/rabbitmq-server" ] || apt_install rabbitmq-server
}

# A private node, its data, logs and Erlang cookie under $RUN_DIR/rabbitmq,
# guest allowed from loopback; no plugins.
ensure_rabbitmq() {
  local address; address=$(address_of "${GATEWAY_EVENTS_AMQP_URL:-amqp://127.0.0.1:5672/}" 5672)
  # shellcheck disable=SC2086
  answers_or_ours $address 5672 GATEWAY_EVENTS_AMQP_URL && return 0
  ensure_rabbitmq_tools
  local dir="$RUN_DIR/rabbitmq"
  mkdir -p "$dir"
  echo "[]." >"$dir/enabled_plugins"
  HOME="$dir" RABBITMQ_NODENAME=flashsale@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT=5672 RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" RABBITMQ_CONFIG_FILE="$dir/none" \
    setsid "$RABBIT_BIN/rabbitmq-server" >"$dir/out.log" 2>&1 </dev/null &
  wait_port 5672 600
}

ensure_haproxy() {
  command -v haproxy >/dev/null || apt_install haproxy
}

if [ "${1:-}" = haproxy ]; then
  ensure_haproxy
  exit 0
fi

# `services.sh faketime`: libfaketime, for the test of a gateway with a skewed clock.
if [ "${1:-}" = faketime ]; then
  command -v faketime >/dev/null || apt_install faketime
  exit 0
fi
if [ "${1:-}" = rabbitmq ]; then
  ensure_rabbitmq_tools
  exit 0
fi
ensure_redis
ensure_cluster_tools
ensure_postgres
ensure_rabbitmq
