#!/usr/bin/env bash
# Make sure the services the tests need are up: PostgreSQL on 127.0.0.1:5432 and Redis on 6379.
# Machines of our kind start them at boot; a fresh CI machine may not have yet.
set -euo pipefail
wait_for() {  # name, command
  for _ in $(seq 1 60); do
    if eval "$2" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "error: $1 did not come up" >&2
  return 1
}
if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  wait_for PostgreSQL "pg_isready -h 127.0.0.1 -p 5432"
fi
# The parallel suite (scripts/test: several xdist workers, each with end-to-end stacks whose
# processes hold pools) needs more than PostgreSQL's default 100 connections. Raise it, once, with
# a restart: only when the current value is lower, so a machine already set up is left alone.
pg_min_connections=400
pg_connections=$(psql -h 127.0.0.1 -p 5432 -U postgres -tAc "SHOW max_connections" 2>/dev/null || echo "")
if [ -n "$pg_connections" ] && [ "$pg_connections" -lt "$pg_min_connections" ]; then
  echo "raising PostgreSQL max_connections from $pg_connections to $pg_min_connections (restart)"
  psql -h 127.0.0.1 -p 5432 -U postgres -qc "ALTER SYSTEM SET max_connections = $pg_min_connections"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main restart
  wait_for PostgreSQL "pg_isready -h 127.0.0.1 -p 5432"
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for Redis "redis-cli -h 127.0.0.1 -p 6379 ping"
fi
# RabbitMQ (optional: the RabbitMQ variants of the broker-fault tests and
# tests/dispatch/test_priority_brokers.py
# skip without it). Started only when installed and nothing answers on 5672; the variants that
# restart a broker start private nodes of their own (tests/reliability/private_rabbitmq.py).
amqp_up() { timeout 2 bash -c '</dev/tcp/127.0.0.1/5672' >/dev/null 2>&1; }
if command -v rabbitmq-server >/dev/null 2>&1 && ! amqp_up; then
  echo "starting RabbitMQ"
  if [ -x /etc/init.d/rabbitmq-server ]; then
    /etc/init.d/rabbitmq-server start || true
  else
    rabbitmq-server -detached || true
  fi
  wait_for RabbitMQ amqp_up
fi
