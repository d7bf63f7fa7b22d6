"""`cdc-sync` command line: init, run, verify, wait, erase, mappings, capture, connectors.

Commands of the development tooling (`stack`, `demo`) are not imported from here: their packages
register them under the `cdc_sync.commands` entry-point group and this module finds them there,
so the product never depends on the local stack.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn, TypeVar

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.logs import CONSOLE
from cdc_sync.core.settings import Connections, SettingsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc_sync.debezium.database import SourceDatabase
    from cdc_sync.job.observe.metrics_export import ConnectorStatus
    from cdc_sync.job.runner import JobOptions, QueryGroup
    from cdc_sync.mapping import MappingFile

console = logging.getLogger(CONSOLE)  # shown on the console without -v
log = logging.getLogger(__name__)  # the log file (the console at -v)


# Commands that run for long and log a lot keep a log file under <state dir>/logs.
LOGGED_COMMANDS = ("run", "demo", "capture")
_T = TypeVar("_T")

# How often `run` looks whether a stop signal came while it waits for the queries.
STOP_POLL_SECONDS = 0.5
# After SIGTERM / Ctrl-C: how long the queries get to stop, and when the process leaves anyway,
# counted from the signal (the process is gone within 10 s, tests/e2e/test_stop.py; Spark's
# JVM and Python workers end after it, 0.5 s to 2.5 s later on a loaded 2-core machine).
STOP_QUERIES_SECONDS = 4.0
STOP_GRACE_SECONDS = 6.0
# How long `erase` waits for the running job to apply what was committed before it started.
ERASE_WAIT_SECONDS = 60.0


def _setup_logging(verbose: bool, command: str | None) -> None:
    from cdc_sync.core.logs import default_log_dir, setup_logging

    setup_logging(verbose, default_log_dir() if command in LOGGED_COMMANDS else None)


def _connections(args: argparse.Namespace) -> Connections:
    return Connections.load(Path(args.env_file) if args.env_file else None)


def source_for(
    mapping: MappingFile, connections: Connections, connector: str | None, pairs: list[str]
) -> SourceDatabase:
    """The database `--connector` (default: the mapping's source.connector) captures, with
    `--set` overrides: every Postgres read of the command goes there. Refused here, at start,
    when CDC_SYNC_PG_URL names another database."""
    from cdc_sync.connectors.ops import parse_overrides
    from cdc_sync.debezium.database import source_database

    path = Path(connector) if connector else mapping.connector
    return source_database(connections, path, parse_overrides(pairs))


def job_options(args: argparse.Namespace, defaults: JobOptions) -> JobOptions:
    """`run` arguments over the job's defaults; --max-offsets-per-trigger 0 means unbounded."""
    limit = args.max_offsets_per_trigger
    if limit is None:
        limit = defaults.max_offsets_per_trigger
    elif limit == 0:
        limit = None
    return replace(
        defaults,
        checkpoint_dir=Path(args.checkpoint) if args.checkpoint else defaults.checkpoint_dir,
        trigger_seconds=_given(args.trigger_seconds, defaults.trigger_seconds),
        max_offsets_per_trigger=limit,
        fail_on_data_loss=args.fail_on_data_loss,
        sink_retry_horizon_seconds=_given(
            args.sink_retry_horizon, defaults.sink_retry_horizon_seconds
        ),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host or defaults.metrics_host,
        maintain_every_batches=args.maintain_every or defaults.maintain_every_batches,
        driver_batch_max_records=_given(
            args.driver_batch_records, defaults.driver_batch_max_records
        ),
        consumers=(
            frozenset(name.strip() for name in args.consumers.split(",") if name.strip())
            if args.consumers
            else None
        ),
        document_bulks_in_flight=_given(args.document_bulks, defaults.document_bulks_in_flight),
    )


def _given(value: _T | None, default: _T) -> _T:
    """An option's value when given (0 included), else the job's default."""
    return default if value is None else value


def connector_status(connections: Connections, mapping: MappingFile) -> ConnectorStatus | None:
    """Reads the mapping's connector status over Kafka Connect REST, when CDC_SYNC_CONNECT_URL
    is set (for the job's metrics); None otherwise (embedded engine: the slot tells)."""
    if not connections.connect_url or mapping.connector is None:
        return None
    from cdc_sync.connectors.rest import ConnectClient
    from cdc_sync.debezium.connector import load_connector

    client = ConnectClient(connections.connect_url, timeout=5.0)
    return partial(client.status, load_connector(mapping.connector).name)


def cmd_run(args: argparse.Namespace) -> int:
    from cdc_sync.core.logs import log_settings
    from cdc_sync.job.runner import JobOptions, SyncJob
    from cdc_sync.job.spark_session import build_spark
    from cdc_sync.mapping import load_mapping

    mapping = load_mapping(Path(args.mapping))
    connections = _connections(args)
    source = source_for(mapping, connections, None, [])  # before Spark: refused in a second
    options = job_options(args, JobOptions.defaults(mapping, connections))
    spark = build_spark(jvm_log=log_settings().jvm_log)
    status = connector_status(connections, mapping) if options.metrics_port is not None else None
    job = SyncJob(spark, mapping, connections, options, connector_status=status, source=source)
    query = None
    stopping: threading.Event | None = None
    try:
        if args.available_now:
            job.drain()
            return 0
        stopping = _stop_on_signals()  # from here on, starting included
        try:
            query = job.start()
            wait_for_end(query, stopping)
            failed = query.exception()
        except Exception as exc:
            if not stopping.is_set():
                raise
            failed = exc
        if stopping.is_set():
            # What failed meanwhile failed because of the stop (a retry abandoned, a start cut
            # short, a Python worker's Ctrl-C), not because of the data: stopped as asked.
            if failed is not None:
                log.info("ended with the stop: %s", failed)
            return 0
        if failed is not None:
            raise failed
        return 0
    finally:
        if query is not None:
            query.stop(timeout=STOP_QUERIES_SECONDS)  # every consumer, whatever ended the wait
        job.close()
        _stop_spark(spark, stopping)


def _stop_spark(spark: SparkSession, stopping: threading.Event | None) -> None:
    """Spark stopped. After a stop signal its JVM may have had the signal too and be gone
    already: a SIGTERM to the whole process group, as systemd's default KillMode sends it, ended
    the job with a py4j traceback and exit code 1 (seen in bench_e2e, which stops its job so).
    Then nothing is left to stop, and that is no error."""
    from py4j.protocol import Py4JError

    try:
        spark.stop()
    except (Py4JError, OSError) as exc:
        if stopping is None or not stopping.is_set():
            raise
        log.info("Spark's JVM had already ended with the stop signal (%s)", exc)


def wait_for_end(query: QueryGroup, stopping: threading.Event) -> None:
    """Until a stop signal, or a query of the group ended for good (failed, or stopped by
    someone else). A query that failed before its first batch is started again by the group
    when it is next asked (`isActive`, `exception()`): that is not an end, and the wait goes on
    (else `exception()` would start it again, find no failure, and the job exit 0)."""
    while not stopping.is_set():
        if query.awaitTermination(STOP_POLL_SECONDS) and not query.isActive:
            return


def _stop_on_signals() -> threading.Event:
    """SIGTERM and Ctrl-C (SIGINT) stop the job: the returned event is set on the signal. A
    thread started here then says so, abandons the sinks' retries (a sink that is down is not
    waited for: the batch is not committed, re-runs on restart, and every write is fenced), and
    ends the process STOP_GRACE_SECONDS after the signal whatever still runs (a batch stuck in a
    sink's client, Spark's own shutdown): an orchestrator's grace period is not ours to use up.
    Counted from the signal by its own thread, so neither the main thread's polling nor a call
    it is stuck in can delay it."""
    from cdc_sync.core.logs import stopping_now
    from cdc_sync.core.retry import abandon_retries

    stopping = threading.Event()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        # Only flags: the handler runs on the main thread, which may be inside a py4j call,
        # and a py4j call from there fails ("reentrant call"), leaving the query up.
        stopping_now()  # py4j's reports of the JVM ending are the stop's, not errors
        stopping.set()

    def leave() -> None:
        stopping.wait()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        console.info(
            "stopping the sync job: a batch in progress is abandoned (not committed: it "
            "re-runs on restart, and every write is fenced)"
        )
        abandon_retries()
        time.sleep(max(0.0, deadline - time.monotonic()))
        console.info("the sync job stopped without waiting for what was still running")
        _exit_now(0)

    threading.Thread(target=leave, name="cdc-sync-stop", daemon=True).start()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    return stopping


def cmd_verify(args: argparse.Namespace) -> int:
    from cdc_sync.mapping import load_mapping
    from cdc_sync.verify.compare import verify_all
    from cdc_sync.verify.repair import repair_options

    if args.repair:
        return cmd_repair(args)
    mapping = load_mapping(Path(args.mapping))
    options = repair_options(mapping, args.table, args.sink)
    connections = _connections(args)
    source = source_for(mapping, connections, args.connector, args.set)
    report = verify_all(mapping, connections, options.tables, options.sinks, source)
    print(report.table())
    return 0 if report.converged else 1


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from cdc_sync.job.observe.checkpoint import default_checkpoint_dir
    from cdc_sync.mapping import load_mapping
    from cdc_sync.status.gather import gather
    from cdc_sync.status.render import render, to_json
    from cdc_sync.status.verdict import Thresholds, judge

    mapping = load_mapping(Path(args.mapping))
    checkpoint = Path(args.checkpoint) if args.checkpoint else default_checkpoint_dir(mapping.path)
    connector = Path(args.connector) if args.connector else None
    snapshot = gather(mapping, _connections(args), checkpoint, connector)
    verdict = judge(
        snapshot,
        Thresholds(
            max_lag_seconds=args.max_lag_seconds,
            max_lag_records=args.max_lag_records,
            stale_after_seconds=args.stale_after,
            max_slot_fraction=args.max_slot_fraction,
        ),
    )
    if args.json:
        print(json.dumps(to_json(snapshot, verdict), indent=2))
    else:
        print(render(snapshot, verdict))
    return verdict.exit_code


def cmd_repair(args: argparse.Namespace) -> int:
    from cdc_sync.connectors.ops import load_target
    from cdc_sync.core.kafka_clients import consumer_config
    from cdc_sync.mapping import load_mapping
    from cdc_sync.verify.repair import repair, repair_options
    from cdc_sync.verify.resnapshot import SnapshotChannel

    mapping = load_mapping(Path(args.mapping))
    options = repair_options(
        mapping, args.table, args.sink, rounds=args.rounds, settle_seconds=args.settle_seconds
    )
    connector = args.connector or mapping.connector
    if connector is None:
        raise ConfigError(mapping.path, "source.connector", "is not set: pass --connector FILE")
    connections = _connections(args)
    target = load_target(str(connector), args.set, connections)
    channel = SnapshotChannel(
        config=target.resolved,
        conninfo=target.conninfo,
        kafka=consumer_config(
            connections.require("kafka_bootstrap"), connections.kafka_flavor, "cdc-sync-repair"
        ),
        timeout_seconds=args.snapshot_timeout,
    )
    result = repair(mapping, connections, channel, options, source=target.database)
    return 0 if result.converged else 1


def cmd_erase(args: argparse.Namespace) -> int:
    """Remove keys from every sink of a table (docs/erasure.md)."""
    import psycopg

    from cdc_sync.job.observe.checkpoint import default_checkpoint_dir
    from cdc_sync.mapping import load_mapping
    from cdc_sync.verify.compare import primary_key, source_keys
    from cdc_sync.verify.erase import ErasureRefused, erase, wait_until_applied
    from cdc_sync.verify.extra_rows import RepairSinks

    mapping = load_mapping(Path(args.mapping))
    chosen = mapping.chosen([args.table])
    assert chosen is not None
    (table,) = chosen
    connections = _connections(args)
    source = source_for(mapping, connections, args.connector, args.set)
    checkpoint = Path(args.checkpoint) if args.checkpoint else default_checkpoint_dir(mapping.path)
    sinks = RepairSinks(mapping, connections)
    try:
        with psycopg.connect(source.conninfo) as conn:
            key_columns = primary_key(conn, table)

            def present() -> set[str]:
                return set(source_keys(conn, table)) & set(args.key)

            def caught_up() -> str | None:
                return wait_until_applied(
                    conn, connections, mapping, table, args.wait_seconds, checkpoint
                )

            outcome = erase(
                sinks,
                mapping.tables[table],
                key_columns,
                args.key,
                present,
                caught_up,
                purge=args.purge,
            )
    except ErasureRefused as exc:
        print(f"cdc-sync erase: {exc}", file=sys.stderr)
        return 2
    finally:
        sinks.close()
    print("\n".join(outcome.lines))
    if args.purge:
        print(
            "purged: Delta versions before this erase can no longer be read (time travel to "
            "them fails)"
        )
    return 1 if outcome.failed else 0


def cmd_maintain(args: argparse.Namespace) -> int:
    from cdc_sync.mapping import load_mapping
    from cdc_sync.sinks.delta.maintenance import (
        SAFE_RETENTION_HOURS,
        UpkeepOptions,
        format_upkeep,
        maintain_route,
    )

    mapping = load_mapping(Path(args.mapping))
    tables = mapping.chosen(args.table)
    options = UpkeepOptions(
        mapping.tombstone_retention_seconds,
        retention_hours=(
            SAFE_RETENTION_HOURS if args.retention_hours is None else args.retention_hours
        ),
        force=args.force,
        dry_run=args.dry_run,
    )
    warehouse = Path(_connections(args).require("warehouse"))
    results = [
        upkeep
        for route in mapping.tables.values()
        if route.delta is not None and (tables is None or route.table in tables)
        for upkeep in maintain_route(warehouse, route.delta, options)
    ]
    print(format_upkeep(results, args.dry_run) if results else "no Delta tables to maintain")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    from cdc_sync.mapping import load_mapping
    from cdc_sync.verify.wait import WaitError, wait_for_lsn

    mapping = load_mapping(Path(args.mapping)) if args.mapping else None
    sinks = [name.strip() for name in args.sink.split(",")] if args.sink is not None else None
    connections = _connections(args)
    if mapping is not None and mapping.connector is not None and connections.pg_url:
        # The LSN came from CDC_SYNC_PG_URL's server: refused if the connector captures another.
        source_for(mapping, connections, None, [])
    try:
        result = wait_for_lsn(
            args.lsn,
            connections,
            sinks=sinks,
            mapping=mapping,
            timeout_seconds=args.timeout,
        )
    except WaitError as exc:
        print(f"cdc-sync wait: {exc}", file=sys.stderr)
        return 2
    print(result.report())
    return 0 if result.reached else 1


def cmd_mappings_validate(args: argparse.Namespace) -> int:
    import psycopg

    from cdc_sync.debezium.connector import load_connector
    from cdc_sync.mapping import load_mapping
    from cdc_sync.sinks.search.backends import open_backend
    from cdc_sync.verify.mapping_check import format_findings, live_search_fields, validate_mapping

    mapping = load_mapping(Path(args.mapping))
    connector_path = Path(args.connector) if args.connector else mapping.connector
    connector = load_connector(connector_path) if connector_path else None
    connections = _connections(args)
    source = source_for(mapping, connections, args.connector, [])
    live = (
        live_search_fields(open_backend(connections.search_client, connections.search_url), mapping)
        if connections.search_url
        else {}
    )
    with psycopg.connect(source.conninfo) as conn:
        findings = validate_mapping(mapping, conn, connector, live)
    if findings:
        print(format_findings(findings), file=sys.stderr)
        print(f"{len(findings)} problem(s) in {mapping.path}", file=sys.stderr)
        return 1
    print(f"{mapping.path}: {len(mapping.tables)} tables routed; all checks passed")
    return 0


def cmd_init(args: argparse.Namespace, rest: list[str]) -> int:
    from cdc_sync.connectors.init.command import init_main

    return init_main(rest)


def cmd_capture(args: argparse.Namespace, rest: list[str]) -> int:
    from cdc_sync.connectors.cli import capture_main

    return capture_main(rest)


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (unbounded) or positive, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port 0-65535 (0: any free), got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or positive, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], got {text}")
    return value


def _add_repair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mapping", required=True)
    parser.add_argument(
        "--table", action="append", default=[], help="schema.table (repeatable; default all)"
    )
    parser.add_argument(
        "--sink",
        action="append",
        default=[],
        help="search, cache, delta (comma-separated or repeated; default all)",
    )
    repair = parser.add_argument_group("repair")
    repair.add_argument(
        "--connector", help="the connector JSON that captures (default: source.connector)"
    )
    repair.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a connector setting, as it runs (repeatable)",
    )
    repair.add_argument("--rounds", type=_positive_int, default=3, help="at most (default 3)")
    repair.add_argument(
        "--settle-seconds",
        type=_positive_seconds,
        default=60.0,
        help="per round, how long the job may take to apply the snapshot rows (default 60)",
    )
    repair.add_argument(
        "--snapshot-timeout",
        type=_positive_seconds,
        default=300.0,
        help="seconds to wait for Debezium to report each snapshot completed (default 300)",
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from cdc_sync.status.verdict import Thresholds

    parser = argparse.ArgumentParser(prog="cdc-sync", description=_first_line(__doc__))
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--env-file", help="connection settings file (default .cdc-sync/stack.env)")
    sub = parser.add_subparsers(dest="command", required=True)

    for name, command in sorted(plugin_commands().items()):
        sub.add_parser(name, help=_first_line(command.__doc__))
    sub.add_parser(
        "init", help="write a connector, a mapping and setup SQL for your database's tables"
    )
    sub.add_parser("capture", help="run a connector JSON in the embedded Debezium engine")
    sub.add_parser("connectors", help="Kafka Connect operations (see `connectors --help`)")

    run = sub.add_parser("run", help="run the Spark sync job for a mapping file")
    run.add_argument("--mapping", required=True)
    run.add_argument(
        "--checkpoint", help="checkpoint dir (default .cdc-sync/checkpoints/<mapping>)"
    )
    run.add_argument(
        "--trigger-seconds",
        type=_positive_seconds,
        help="start a micro-batch at most this often (default: JobOptions.trigger_seconds)",
    )
    run.add_argument(
        "--max-offsets-per-trigger",
        type=_non_negative,
        help="records per micro-batch at most, also under --available-now "
        "(default: the job's bound, JobOptions.max_offsets_per_trigger; 0 = unbounded)",
    )
    run.add_argument(
        "--driver-batch-records",
        type=_non_negative,
        metavar="N",
        help="micro-batches of at most N records are decoded and written by the driver alone, "
        "skipping two Spark jobs' fixed cost (freshness); larger ones run on the executors "
        "(default: JobOptions.driver_batch_max_records; 0 = every batch on the executors)",
    )
    run.add_argument(
        "--document-bulks",
        type=_positive_int,
        metavar="N",
        help="a document consumer sends up to N bulk requests at once, rendering the next "
        "documents meanwhile (default: JobOptions.document_bulks_in_flight)",
    )
    run.add_argument(
        "--no-fail-on-data-loss",
        dest="fail_on_data_loss",
        action="store_false",
        help="when the checkpoint's offsets are gone from the broker (topic re-created, "
        "retention), warn and continue from the partition's low watermark instead of failing",
    )
    run.add_argument(
        "--sink-retry-horizon",
        type=_positive_seconds,
        metavar="SECONDS",
        help="how long a sink that is down, times out or answers 5xx/429 is retried (from the "
        "write's first failure) before the batch fails and the job stops "
        "(default: JobOptions.sink_retry_horizon_seconds, 600)",
    )
    run.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (default: off)",
    )
    run.add_argument(
        "--metrics-host",
        metavar="HOST",
        help="address the metrics endpoint binds (default 127.0.0.1; 0.0.0.0 in a container)",
    )
    run.add_argument(
        "--maintain-every",
        type=_positive_int,
        metavar="N",
        help="Delta upkeep (as `cdc-sync maintain`, default retention) after every N-th batch, "
        "between batches (default: off)",
    )
    run.add_argument(
        "--available-now", action="store_true", help="process what is in the topics, then stop"
    )
    run.add_argument(
        "--consumers",
        metavar="NAMES",
        help="run only these consumers of the log, comma-separated (search, redis, delta, "
        "documents:<name>); each has its own checkpoint, so another application can run the "
        "rest (default: every consumer the mapping needs)",
    )
    # The job has closed its sinks and stopped Spark when it returns; the interpreter's teardown
    # after Delta's upkeep then ended in Arrow's std::terminate (SIGABRT, seen in test_stop).
    run.set_defaults(handler=cmd_run, exit_at_once=True)

    verify = sub.add_parser("verify", help="compare every sink with the source tables")
    verify.add_argument(
        "--repair", action="store_true", help="then repair what differs (as `cdc-sync repair`)"
    )
    _add_repair_arguments(verify)
    verify.set_defaults(handler=cmd_verify)

    status = sub.add_parser(
        "status",
        help="capture, broker, job and sinks on one screen; exits 0 only when healthy",
    )
    status.add_argument("--mapping", required=True)
    status.add_argument(
        "--connector", help="connector JSON (default: the mapping's source.connector)"
    )
    status.add_argument(
        "--checkpoint", help="the job's checkpoint dir (default .cdc-sync/checkpoints/<mapping>)"
    )
    status.add_argument("--json", action="store_true", help="print the same as JSON")
    status.add_argument(
        "--max-lag-seconds",
        type=_positive_seconds,
        default=Thresholds.max_lag_seconds,
        metavar="S",
        help="lagging when the oldest unprocessed record is older (default %(default)s)",
    )
    status.add_argument(
        "--max-lag-records",
        type=_count,
        default=Thresholds.max_lag_records,
        metavar="N",
        help="lagging when more records wait across the job's topics (default %(default)s)",
    )
    status.add_argument(
        "--stale-after",
        type=_positive_seconds,
        default=Thresholds.stale_after_seconds,
        metavar="S",
        help="stopped when the job wrote no heartbeat for this long (default %(default)s)",
    )
    status.add_argument(
        "--max-slot-fraction",
        type=_fraction,
        default=Thresholds.max_slot_fraction,
        metavar="F",
        help="lagging when the slot retains more than this share of max_slot_wal_keep_size "
        "(default %(default)s)",
    )
    status.set_defaults(handler=cmd_status)
    repair = sub.add_parser(
        "repair",
        help="rewrite rows missing, different or extra in a sink (fenced; the job must run)",
    )
    _add_repair_arguments(repair)
    repair.set_defaults(handler=cmd_repair)

    erase_cmd = sub.add_parser(
        "erase",
        help="remove keys from every sink of a table, history and document indices included "
        "(rows deleted in Postgres first; waits for the running job); --purge also from older "
        "Delta versions and the Delta log",
    )
    erase_cmd.add_argument("--mapping", required=True)
    erase_cmd.add_argument("--table", required=True, help="schema.table")
    erase_cmd.add_argument(
        "--key",
        action="append",
        required=True,
        help="document id: the primary key as text, composite keys joined with | (repeatable)",
    )
    erase_cmd.add_argument(
        "--purge",
        action="store_true",
        help="then delete every file and log entry of the Delta table and its history that no "
        "current row needs: the erased values leave older table versions and the log's "
        "statistics too (breaks time travel to before the purge)",
    )
    erase_cmd.add_argument(
        "--wait-seconds",
        type=float,
        default=ERASE_WAIT_SECONDS,
        help="how long to wait for the running job to apply every change committed before "
        f"erase started, then refuse (default {ERASE_WAIT_SECONDS:g})",
    )
    erase_cmd.add_argument(
        "--checkpoint",
        help="the job's checkpoint dir, where its document indices' progress is read "
        "(default .cdc-sync/checkpoints/<mapping>)",
    )
    erase_cmd.add_argument(
        "--connector", help="connector JSON (default: the mapping's source.connector)"
    )
    erase_cmd.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="connector override"
    )
    erase_cmd.set_defaults(handler=cmd_erase)

    maintain = sub.add_parser(
        "maintain",
        help="Delta upkeep: compact small files, vacuum, prune delete tombstones",
    )
    maintain.add_argument("--mapping", required=True)
    maintain.add_argument(
        "--table", action="append", default=[], help="schema.table (repeatable; default all)"
    )
    maintain.add_argument(
        "--retention-hours",
        type=int,
        default=None,
        help="vacuum keeps files removed more recently (default 168, Delta's safety default; "
        "lower needs --force)",
    )
    maintain.add_argument("--force", action="store_true", help="allow --retention-hours below 168")
    maintain.add_argument(
        "--dry-run", action="store_true", help="report what would be done; change nothing"
    )
    maintain.set_defaults(handler=cmd_maintain)

    wait = sub.add_parser(
        "wait",
        help="wait until sinks applied every change committed at or before an LSN "
        "(read your writes; exit 1 on timeout)",
    )
    wait.add_argument(
        "--lsn", required=True, help="a WAL position as pg_current_wal_lsn() prints it (0/1A2B3C8)"
    )
    wait.add_argument(
        "--sink",
        help="comma-separated: search,cache,delta (default: every sink the mapping routes to, "
        "or every configured one)",
    )
    wait.add_argument(
        "--mapping",
        help="wait for every table it routes (default: every topic the sinks hold a watermark for)",
    )
    wait.add_argument("--timeout", type=_positive_seconds, default=30.0, metavar="SECONDS")
    wait.set_defaults(handler=cmd_wait, exit_at_once=True)

    mappings = sub.add_parser("mappings", help="mapping file tools")
    mappings_sub = mappings.add_subparsers(dest="mappings_command", required=True)
    validate = mappings_sub.add_parser(
        "validate", help="check a mapping against the live catalog and search mappings"
    )
    validate.add_argument("--mapping", required=True)
    validate.add_argument(
        "--connector", help="connector JSON (default: the mapping's source.connector)"
    )
    validate.set_defaults(handler=cmd_mappings_validate)

    return parser


def cmd_connectors(args: argparse.Namespace, rest: list[str]) -> int:
    from cdc_sync.connectors.ops import connectors_main

    return connectors_main(rest)


PLUGIN_GROUP = "cdc_sync.commands"
Command = Callable[[list[str]], int]


def plugin_commands() -> dict[str, Command]:
    """Commands registered by other packages (`[project.entry-points."cdc_sync.commands"]`)."""
    return {ep.name: ep.load() for ep in entry_points(group=PLUGIN_GROUP)}


def _first_line(text: str | None) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""


def _passthrough() -> dict[str, Callable[[argparse.Namespace, list[str]], int]]:
    commands: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
        "init": cmd_init,
        "capture": cmd_capture,
        "connectors": cmd_connectors,
    }
    for name, command in plugin_commands().items():
        commands[name] = lambda _args, rest, command=command: command(rest)  # type: ignore[misc]
    return commands


def _command_index(argv: list[str]) -> int | None:
    """Where the subcommand is: the first word that is neither an option nor --env-file's value."""
    value_next = False
    for index, word in enumerate(argv):
        if value_next:
            value_next = False
        elif word == "--env-file":
            value_next = True
        elif not word.startswith("-"):
            return index
    return None


def main(argv: list[str] | None = None) -> int:
    argv_given = argv  # None: running as the program (`cdc-sync`), see _exit_now
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Subcommands owned by other packages parse their own arguments.
    command_index = _command_index(argv)
    passthrough = _passthrough()
    if command_index is not None and argv[command_index] in passthrough:
        args = parser.parse_args(argv[: command_index + 1])
        _setup_logging(args.verbose, argv[command_index])
        handler = passthrough[argv[command_index]]
        rest = argv[command_index + 1 :]
        if args.env_file:
            rest = ["--env-file", args.env_file, *rest]
        return _guarded(lambda: handler(args, rest))
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, args.command)
    code = _guarded(lambda: int(args.handler(args)))
    if argv_given is None and getattr(args, "exit_at_once", False):
        _exit_now(code)
    return code


def _exit_now(code: int) -> NoReturn:
    """End the process without the interpreter's teardown. After reading Delta, Arrow's C++
    thread pools are destroyed at exit while a worker still runs: `std::terminate`, SIGABRT
    after the report was printed (6 of 60 `wait --sink delta` runs under load; `run` after a
    stop signal, once its Delta upkeep had run). Only for commands whose whole output is
    printed and whose clients are closed by then (`wait`, `run`), and only when running as the
    program (`main()` called with its own argv keeps going)."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _guarded(action: object) -> int:
    try:
        return int(action())  # type: ignore[operator]
    except (ConfigError, SettingsError) as exc:
        print(f"cdc-sync: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
