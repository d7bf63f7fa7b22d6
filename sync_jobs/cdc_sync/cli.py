"""`cdc-sync` command line: run, verify, wait, mappings, capture, connectors.

Commands of the development tooling (`stack`, `demo`) are not imported from here: their packages
register them under the `cdc_sync.commands` entry-point group and this module finds them there,
so the product never depends on the local stack.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.settings import Connections, SettingsError

if TYPE_CHECKING:
    from cdc_sync.job.runner import JobOptions

log = logging.getLogger("cdc_sync")


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("py4j", "urllib3", "elastic_transport", "opensearch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _connections(args: argparse.Namespace) -> Connections:
    return Connections.load(Path(args.env_file) if args.env_file else None)


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
        trigger_seconds=args.trigger_seconds,
        max_offsets_per_trigger=limit,
        fail_on_data_loss=args.fail_on_data_loss,
        sink_retry_horizon_seconds=(
            defaults.sink_retry_horizon_seconds
            if args.sink_retry_horizon is None
            else args.sink_retry_horizon
        ),
    )


def cmd_run(args: argparse.Namespace) -> int:
    from cdc_sync.job.runner import JobOptions, SyncJob
    from cdc_sync.job.spark_session import build_spark
    from cdc_sync.mapping import load_mapping

    mapping = load_mapping(Path(args.mapping))
    connections = _connections(args)
    options = job_options(args, JobOptions.defaults(mapping, connections))
    spark = build_spark()
    job = SyncJob(spark, mapping, connections, options)
    try:
        if args.available_now:
            job.drain()
            return 0
        query = job.start()

        def stop(_signum: int, _frame: FrameType | None) -> None:
            log.info("stopping the sync job (the current batch finishes first)")
            query.stop()

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        query.awaitTermination()
        return 0
    finally:
        job.close()
        spark.stop()


def cmd_verify(args: argparse.Namespace) -> int:
    from cdc_sync.mapping import load_mapping
    from cdc_sync.verify.compare import verify_all

    mapping = load_mapping(Path(args.mapping))
    report = verify_all(mapping, _connections(args))
    print(report.table())
    return 0 if report.converged else 1


def cmd_wait(args: argparse.Namespace) -> int:
    from cdc_sync.mapping import load_mapping
    from cdc_sync.verify.wait import WaitError, wait_for_lsn

    mapping = load_mapping(Path(args.mapping)) if args.mapping else None
    sinks = [name.strip() for name in args.sink.split(",")] if args.sink is not None else None
    try:
        result = wait_for_lsn(
            args.lsn,
            _connections(args),
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
    live = (
        live_search_fields(open_backend(connections.search_client, connections.search_url), mapping)
        if connections.search_url
        else {}
    )
    with psycopg.connect(connections.require("pg_url")) as conn:
        findings = validate_mapping(mapping, conn, connector, live)
    if findings:
        print(format_findings(findings), file=sys.stderr)
        print(f"{len(findings)} problem(s) in {mapping.path}", file=sys.stderr)
        return 1
    print(f"{mapping.path}: {len(mapping.tables)} tables routed; all checks passed")
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc-sync", description=_first_line(__doc__))
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--env-file", help="connection settings file (default .cdc-sync/stack.env)")
    sub = parser.add_subparsers(dest="command", required=True)

    for name, command in sorted(plugin_commands().items()):
        sub.add_parser(name, help=_first_line(command.__doc__))
    sub.add_parser("capture", help="run a connector JSON in the embedded Debezium engine")
    sub.add_parser("connectors", help="Kafka Connect operations (see `connectors --help`)")

    run = sub.add_parser("run", help="run the Spark sync job for a mapping file")
    run.add_argument("--mapping", required=True)
    run.add_argument(
        "--checkpoint", help="checkpoint dir (default .cdc-sync/checkpoints/<mapping>)"
    )
    run.add_argument("--trigger-seconds", type=float, default=1.0)
    run.add_argument(
        "--max-offsets-per-trigger",
        type=_non_negative,
        help="records per micro-batch at most, also under --available-now "
        "(default: the job's bound, JobOptions.max_offsets_per_trigger; 0 = unbounded)",
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
        "--available-now", action="store_true", help="process what is in the topics, then stop"
    )
    run.set_defaults(handler=cmd_run)

    verify = sub.add_parser("verify", help="compare every sink with the source tables")
    verify.add_argument("--mapping", required=True)
    verify.set_defaults(handler=cmd_verify)

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
    wait.set_defaults(handler=cmd_wait)

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
        "capture": cmd_capture,
        "connectors": cmd_connectors,
    }
    for name, command in plugin_commands().items():
        commands[name] = lambda _args, rest, command=command: command(rest)  # type: ignore[misc]
    return commands


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Subcommands owned by other packages parse their own arguments.
    command_index = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    passthrough = _passthrough()
    if command_index is not None and argv[command_index] in passthrough:
        args = parser.parse_args(argv[: command_index + 1])
        _setup_logging(args.verbose)
        handler = passthrough[argv[command_index]]
        rest = argv[command_index + 1 :]
        if args.env_file:
            rest = ["--env-file", args.env_file, *rest]
        return _guarded(lambda: handler(args, rest))
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    return _guarded(lambda: int(args.handler(args)))


def _guarded(action: object) -> int:
    try:
        return int(action())  # type: ignore[operator]
    except (ConfigError, SettingsError) as exc:
        print(f"cdc-sync: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
