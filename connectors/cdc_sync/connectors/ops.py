"""`cdc-sync connectors ...`: connector operations over the Kafka Connect REST API.

validate  Connect's own validation plus our checks against the source database
apply     create or update (idempotent), showing what changes
status | pause | resume | restart | delete | offsets
snapshot  re-snapshot tables while streaming (Debezium incremental snapshot signal), then wait
          for Debezium's notifications that it started and completed
slots     replication slots with retained WAL

Commands that read or write Postgres act on the connector's own database (its database.*
settings after --set and ${env:...} resolution), the one Debezium captures from; when
CDC_SYNC_PG_URL names another database they refuse to start.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition

from cdc_sync.connectors.checks import run_checks
from cdc_sync.connectors.rest import ConnectClient, ConnectError
from cdc_sync.connectors.slots import format_slots
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import ConnectorFile, describe_database, load_connector
from cdc_sync.debezium.database import SourceDatabase, placeholder_env, source_database
from cdc_sync.debezium.notifications import (
    CHANNELS_SETTING,
    TOPIC_SETTING,
    Notification,
    SnapshotOutcome,
    describe,
    end_offsets,
    follow,
    notification_topic,
    snapshot_outcome,
)
from cdc_sync.debezium.signals import request_snapshot
from cdc_sync.debezium.slots import list_slots

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


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        result[key] = value
    return result


@dataclass(frozen=True)
class Target:
    """A connector file with its `--set` overrides and the database it captures from."""

    connector: ConnectorFile
    config: dict[str, str]  # what `apply` sends: placeholders kept
    resolved: dict[str, str]  # placeholders replaced, as the worker sees it
    database: SourceDatabase  # checked against CDC_SYNC_PG_URL (refused if another database)

    @property
    def conninfo(self) -> str:
        """The connector's own database settings: what acts as the connector."""
        assert self.database.connector_conninfo is not None  # resolved from a connector file
        return self.database.connector_conninfo


def load_target(path: str, pairs: list[str], connections: Connections) -> Target:
    """The connector file with its overrides; refuses (SourceMismatch) when CDC_SYNC_PG_URL
    names another database than the one it captures."""
    connector = load_connector(Path(path))
    overrides = parse_overrides(pairs)
    config = wanted_config(connector, overrides)
    resolved = ConnectorFile(connector.path, connector.name, config).resolved(
        placeholder_env(connections)
    )
    return Target(connector, config, resolved, source_database(connections, connector, overrides))


def announce_database(conninfo: str, source: str) -> None:
    """Say which database a command acts on."""
    print(f"database: {describe_database(conninfo)} ({source})")


def cmd_validate(args: argparse.Namespace, connections: Connections) -> int:
    from cdc_sync.mapping import load_mapping

    target = load_target(args.connector, args.set, connections)
    problems = []
    if connections.connect_url:
        answer = ConnectClient(connections.connect_url).validate(target.config)
        problems = [
            f"error: {item['value']['name']}: {error}"
            for item in answer.get("configs", [])
            for error in item["value"].get("errors", [])
        ]
    else:  # the embedded engine (`cdc-sync capture`) has no worker to ask
        print("Kafka Connect's own validation skipped: CDC_SYNC_CONNECT_URL is not set")
    mapping = load_mapping(Path(args.mapping)) if args.mapping else None
    connector = target.connector
    announce_database(target.conninfo, f"connector {target.config['name']}")
    with psycopg.connect(target.conninfo) as conn:
        checks = run_checks(connector, target.resolved, conn, mapping)
    for line in problems + [str(c) for c in checks]:
        print(line)
    errors = len(problems) + sum(1 for c in checks if c.severity == "error")
    warnings = sum(1 for c in checks if c.severity == "warning")
    print(f"{connector.path}: {errors} error(s), {warnings} warning(s)")
    return 1 if errors else 0


def cmd_apply(args: argparse.Namespace, connections: Connections) -> int:
    connector = load_connector(Path(args.connector))
    client = ConnectClient(connections.require("connect_url"))
    wanted = wanted_config(connector, parse_overrides(args.set))
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
    target = load_target(args.connector, args.set, connections)
    name = target.config["name"]
    topic = notification_topic(target.resolved)
    if topic is None and not args.no_wait:
        print(
            f"connector {name}: Debezium reports snapshots only with {CHANNELS_SETTING}=sink and "
            f"{TOPIC_SETTING} set (see connectors/shop.json); add them, or pass --no-wait",
            file=sys.stderr,
        )
        return 1
    announce_database(target.conninfo, f"connector {name}")
    kafka = consumer_config(
        connections.require("kafka_bootstrap"), connections.kafka_flavor, "cdc-sync-snapshot"
    )
    # Where the notification topic ends before the signal: what follows is this request's.
    start = end_offsets(kafka, topic) if topic and not args.no_wait else {}
    with psycopg.connect(target.conninfo, autocommit=True) as conn:
        signal_id = request_snapshot(conn, target.resolved, args.table)
    print(f"incremental snapshot of {', '.join(args.table)} requested (signal {signal_id})")
    if topic is None or args.no_wait:
        return 0
    print(f"waiting up to {args.timeout:g}s for Debezium's notifications on {topic}")
    return report_snapshot(follow(kafka, topic, start, signal_id, args.timeout), args.timeout)


def report_snapshot(notifications: Iterable[Notification], timeout: float) -> int:
    """Print each notification of the snapshot; 0 once it completed, 1 if aborted or silent."""
    outcome = snapshot_outcome(notifications, lambda n: print(describe(n)))
    if outcome is SnapshotOutcome.INCOMPLETE:
        print(f"the snapshot started but did not complete within {timeout:g}s")
    elif outcome is SnapshotOutcome.SILENT:
        print(
            f"no notification within {timeout:g}s: the connector has not picked up the signal "
            "(is it running, on this database, with the signal table in table.include.list?)"
        )
    return 0 if outcome is SnapshotOutcome.COMPLETED else 1


def cmd_slots(args: argparse.Namespace, connections: Connections) -> int:
    if args.connector:
        target = load_target(args.connector, args.set, connections)
        conninfo, source = target.conninfo, f"connector {target.config['name']}"
        slot = target.resolved.get("slot.name")
    else:
        conninfo, source, slot = connections.require("pg_url"), "CDC_SYNC_PG_URL", None
    announce_database(conninfo, source)
    with psycopg.connect(conninfo) as conn:
        slots = list_slots(conn)
    print(format_slots(slots))
    if slot and slot not in {s.name for s in slots}:
        print(f"the connector's slot {slot} does not exist on this server")
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
    snapshot.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for Debezium's started/completed notifications (default 120)",
    )
    snapshot.add_argument(
        "--no-wait", action="store_true", help="insert the signal and return without waiting"
    )
    snapshot.set_defaults(handler=cmd_snapshot)
    slots = with_connector(
        "slots", "replication slots and retained WAL (on the connector's server)", required=False
    )
    slots.set_defaults(handler=cmd_slots)
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
