"""`cdc-sync connectors ...`: connector operations over the Kafka Connect REST API.

validate  Connect's own validation plus our checks against the source database
apply     create or update (idempotent), showing what changes
status | pause | resume | restart | delete | offsets
snapshot  re-snapshot tables while streaming (Debezium incremental snapshot signal)
slots     replication slots with retained WAL
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition

from cdc_sync.connectors.checks import run_checks
from cdc_sync.connectors.rest import ConnectClient, ConnectError
from cdc_sync.connectors.signals import request_snapshot
from cdc_sync.connectors.slots import format_slots, list_slots
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import ConnectorFile, load_connector, pg_env_from_url

SECRET_MARKERS = ("password", "secret", "token", "key.pass")


def _masked(key: str, value: str) -> str:
    if any(m in key for m in SECRET_MARKERS) and not value.startswith("${"):
        return "******"
    return value


def config_diff(current: Mapping[str, str] | None, wanted: Mapping[str, str]) -> list[str]:
    """Lines `+ key=value` / `- key=value` / `~ key: old -> new`; secrets masked."""
    current = current or {}
    lines = []
    for key in sorted(set(current) | set(wanted)):
        old, new = current.get(key), wanted.get(key)
        if old == new:
            continue
        if old is None:
            lines.append(f"+ {key}={_masked(key, str(new))}")
        elif new is None:
            lines.append(f"- {key}={_masked(key, old)}")
        else:
            lines.append(f"~ {key}: {_masked(key, old)} -> {_masked(key, new)}")
    return lines


def wanted_config(connector: ConnectorFile, overrides: Mapping[str, str]) -> dict[str, str]:
    """The file's config with `--set` overrides; `--set name=...` renames the connector."""
    return {"name": connector.name} | dict(connector.config) | dict(overrides)


def _overrides(pairs: list[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        result[key] = value
    return result


def cmd_validate(args: argparse.Namespace, connections: Connections) -> int:
    from cdc_sync.mapping import load_mapping

    connector = load_connector(Path(args.connector))
    config = wanted_config(connector, _overrides(args.set))
    answer = ConnectClient(connections.require("connect_url")).validate(config)
    problems = [
        f"error: {item['value']['name']}: {error}"
        for item in answer.get("configs", [])
        for error in item["value"].get("errors", [])
    ]
    mapping = load_mapping(Path(args.mapping)) if args.mapping else None
    resolved = connector.resolved(pg_env_from_url(connections.require("pg_url"))) | _overrides(
        args.set
    )
    with psycopg.connect(connections.require("pg_url")) as conn:
        checks = run_checks(connector, resolved, conn, mapping)
    for line in problems + [str(c) for c in checks]:
        print(line)
    errors = len(problems) + sum(1 for c in checks if c.severity == "error")
    warnings = sum(1 for c in checks if c.severity == "warning")
    print(f"{connector.path}: {errors} error(s), {warnings} warning(s)")
    return 1 if errors else 0


def cmd_apply(args: argparse.Namespace, connections: Connections) -> int:
    connector = load_connector(Path(args.connector))
    client = ConnectClient(connections.require("connect_url"))
    wanted = wanted_config(connector, _overrides(args.set))
    name = wanted["name"]
    current = client.config(name)
    diff = config_diff(current, wanted)
    if current is not None and not diff:
        print(f"connector {name}: up to date")
        return 0
    print(f"connector {name}: {'update' if current else 'create'}")
    for line in diff:
        print(f"  {line}")
    client.put_config(name, wanted)
    return 0


def describe_status(status: Mapping[str, Any]) -> list[str]:
    lines = [f"connector {status['name']}: {status['connector']['state']}"]
    if status["connector"].get("trace"):
        lines.append(status["connector"]["trace"])
    for task in status.get("tasks", []):
        lines.append(f"  task {task['id']}: {task['state']} on {task.get('worker_id')}")
        if task.get("trace"):
            lines.append(task["trace"])
    return lines


def cmd_simple(args: argparse.Namespace, connections: Connections) -> int:
    name = args.name or load_connector(Path(args.connector)).name
    client = ConnectClient(connections.require("connect_url"))
    action = args.action
    if action == "status":
        status = client.status(name)
        print("\n".join(describe_status(status)))
        states = [status["connector"]["state"], *(t["state"] for t in status.get("tasks", []))]
        return 1 if "FAILED" in states else 0
    if action == "offsets":
        print(json.dumps(client.offsets(name), indent=2))
        return 0
    {
        "pause": lambda: client.pause(name),
        "resume": lambda: client.resume(name),
        "restart": lambda: client.restart(name, include_tasks=True, only_failed=args.only_failed),
        "delete": lambda: client.delete(name),
    }[action]()
    print(f"connector {name}: {action} requested")
    return 0


def cmd_snapshot(args: argparse.Namespace, connections: Connections) -> int:
    connector = load_connector(Path(args.connector))
    config = wanted_config(connector, _overrides(args.set))
    with psycopg.connect(connections.require("pg_url"), autocommit=True) as conn:
        signal_id = request_snapshot(conn, config, args.table)
    print(f"incremental snapshot of {', '.join(args.table)} requested (signal {signal_id})")
    return 0


def cmd_slots(args: argparse.Namespace, connections: Connections) -> int:
    with psycopg.connect(connections.require("pg_url")) as conn:
        print(format_slots(list_slots(conn)))
    return 0


def wait_running(client: ConnectClient, name: str, timeout: float = 60.0) -> dict[str, Any]:
    """Until the connector and all its tasks run; raises with the trace when one failed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = client.status(name)
        except ConnectError as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
            continue
        states = [status["connector"]["state"], *(t["state"] for t in status.get("tasks", []))]
        if "FAILED" in states:
            raise RuntimeError("\n".join(describe_status(status)))
        if status.get("tasks") and all(s == "RUNNING" for s in states):
            return status
        if time.monotonic() > deadline:
            raise TimeoutError("\n".join(describe_status(status)))
        time.sleep(0.5)


def wait_for_topics(connections: Connections, topics: list[str], timeout: float = 120) -> None:
    """Until every topic holds records (the snapshot arrived)."""
    config = consumer_config(
        connections.require("kafka_bootstrap"), connections.kafka_flavor, "cdc-sync-wait"
    )
    deadline = time.monotonic() + timeout
    pending = list(topics)
    while pending:
        # A fresh client each round: librdkafka caches "unknown topic" for minutes.
        consumer = Consumer(config)
        try:
            pending = [t for t in pending if _high_watermark(consumer, t) == 0]
        finally:
            consumer.close()
        if pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no snapshot records on {', '.join(pending)}")
            time.sleep(0.5)


def _high_watermark(consumer: Consumer, topic: str) -> int:
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1])
    except KafkaException:
        return 0  # not created yet


def connectors_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="cdc-sync connectors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--env-file", help="connection settings (default .cdc-sync/stack.env)")
    sub = parser.add_subparsers(dest="action", required=True)

    def with_connector(name: str, help_text: str, required: bool = True) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text)
        command.add_argument("--connector", required=required, help="connector JSON file")
        command.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a setting of the file (repeatable)",
        )
        return command

    validate = with_connector("validate", "Connect's validation plus our checks")
    validate.add_argument("--mapping", help="also check every captured table is routed")
    validate.set_defaults(handler=cmd_validate)
    with_connector("apply", "create or update, showing the diff").set_defaults(handler=cmd_apply)
    for action in ("status", "pause", "resume", "restart", "delete", "offsets"):
        command = with_connector(action, f"{action} the connector", required=False)
        command.add_argument("--name", help="connector name (instead of --connector)")
        command.add_argument("--only-failed", action="store_true", help="restart: failed only")
        command.set_defaults(handler=cmd_simple)
    snapshot = with_connector("snapshot", "re-snapshot tables while streaming")
    snapshot.add_argument("--table", action="append", required=True, help="schema.table")
    snapshot.set_defaults(handler=cmd_snapshot)
    sub.add_parser("slots", help="replication slots and retained WAL").set_defaults(
        handler=cmd_slots
    )
    args = parser.parse_args(argv)
    if args.action in ("status", "pause", "resume", "restart", "delete", "offsets") and not (
        args.name or args.connector
    ):
        parser.error("give --connector FILE or --name NAME")
    connections = Connections.load(Path(args.env_file) if args.env_file else None)
    try:
        return int(args.handler(args, connections))
    except ConnectError as exc:
        print(f"cdc-sync connectors: {exc}", file=sys.stderr)
        return 1
