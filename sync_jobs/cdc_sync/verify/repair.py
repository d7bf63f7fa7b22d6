"""`cdc-sync repair`: make every sink equal Postgres again, fenced against concurrent changes.

Each round verifies (`compare.verify_all`), then per table:
- rows missing or different in a sink are re-read by Debezium's incremental snapshot, narrowed
  to their keys (`resnapshot.py`), which the running job applies through the fenced sinks;
- rows a sink holds that Postgres does not are deleted in that sink at the version it stores
  (`extra_rows.py`).
Document indices are rewritten by repair itself (`document_repair.py`): missing and different
documents as Postgres computes them, at a fence version no older render can pass and every newer
one does; a document whose root is gone (or no longer matches the filter) is deleted at the
version the index stores.
Then it waits for Debezium to report each snapshot completed and for the job to apply it
(verify again until clean or `settle_seconds`); rows still differing go to the next round (under
a running workload, newer changes may have been in flight). The sync job must be running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.database import SourceDatabase, source_database
from cdc_sync.debezium.notifications import Notification, SnapshotOutcome, describe
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.search import SearchSink
from cdc_sync.verify.compare import (
    DOCUMENT_PREFIX,
    SINK_NAMES,
    Report,
    SinkComparison,
    TableComparison,
    primary_key,
    register_loaders,
    source_keys,
    verify_all,
)
from cdc_sync.verify.document_repair import rewrite_documents
from cdc_sync.verify.extra_rows import (
    RepairSinks,
    delete_extra_documents,
    delete_extra_rows,
    read_retried,
)
from cdc_sync.verify.resnapshot import (
    SnapshotChannel,
    SnapshotSignal,
    merged,
    run_signals,
    table_signals,
)

Output = Callable[[str], None]


@dataclass(frozen=True)
class RepairOptions:
    tables: Collection[TableId] | None = None  # None: every routed table
    sinks: Collection[str] | None = None  # None: every sink (verify's names)
    rounds: int = 3
    settle_seconds: float = 60.0  # per round: how long the job may take to apply snapshots
    poll_seconds: float = 2.0


@dataclass(frozen=True)
class RepairResult:
    report: Report  # the last verify
    rounds: int  # rounds that repaired something
    snapshots_failed: bool

    @property
    def converged(self) -> bool:
        return self.report.converged and not self.snapshots_failed


def repair_options(
    mapping: MappingFile, tables: Sequence[str], sinks: Sequence[str], **settings: Any
) -> RepairOptions:
    """`--table schema.table ...` and `--sink a,b` checked against the mapping."""
    names = [n.strip() for part in sinks for n in part.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SINK_NAMES))
    if unknown:
        raise ConfigError(
            "command line", "--sink", f"unknown {unknown}; known: {', '.join(SINK_NAMES)}"
        )
    return RepairOptions(tables=mapping.chosen(tables), sinks=set(names) or None, **settings)


def repair(
    mapping: MappingFile,
    connections: Connections,
    channel: SnapshotChannel,
    options: RepairOptions = RepairOptions(),
    out: Output = print,
    source: SourceDatabase | None = None,
) -> RepairResult:
    """`source`: the captured database (default: resolved from the mapping's connector)."""
    source = source or source_database(connections, mapping.connector)
    report = _verify(mapping, connections, options, source)
    rounds = 0
    sinks = RepairSinks(mapping, connections)
    try:
        while not report.converged and rounds < options.rounds:
            rounds += 1
            out(f"round {rounds}: {_damage(report)}")
            signals = merged(_repair_round(mapping, source, sinks, report, channel, out))
            outcomes = run_signals(channel, signals, _progress(out)) if signals else []
            failed = [(s, o) for s, o in outcomes if o is not SnapshotOutcome.COMPLETED]
            for signal, outcome in failed:
                out(f"  snapshot of {', '.join(signal.tables)}: {outcome.value}")
            if failed:
                out("snapshot did not complete: is the connector running on this database?")
                return RepairResult(_verify(mapping, connections, options, source), rounds, True)
            report = _settle(mapping, connections, options, source)
    finally:
        sinks.close()
    out(report.table())
    out("converged" if report.converged else "NOT converged: see the rows above")
    return RepairResult(report, rounds, False)


def _repair_round(
    mapping: MappingFile,
    source: SourceDatabase,
    sinks: RepairSinks,
    report: Report,
    channel: SnapshotChannel,
    out: Output,
) -> list[SnapshotSignal]:
    """Delete the extra rows and rewrite the documents; return the snapshot signals for the
    missing and different rows."""
    signals: list[SnapshotSignal] = []
    with psycopg.connect(source.conninfo, autocommit=True) as conn:
        register_loaders(conn)  # ids computed as verify computes them
        for comparison in report.tables:
            if comparison.matches:
                continue
            documents = [s for s in comparison.sinks if s.sink.startswith(DOCUMENT_PREFIX)]
            for sink in documents:
                _repair_documents(mapping, sinks, conn, channel, comparison.table, sink, out)
            if documents:
                continue  # a document index's comparison holds that index alone
            table = comparison.table
            route = mapping.tables[table]
            key_columns = primary_key(conn, table)
            keys = source_keys(conn, table)
            signals += _rewrite(conn, comparison, key_columns, keys, out)
            for sink in comparison.sinks:
                if not sink.extra:
                    continue
                if sink.sink == "history":
                    # A current history row whose delete the history never saw (a tombstone
                    # without a version): there is no version to close it at.
                    count = len(sink.extra)
                    out(f"  {table} history: {count} extra: not repaired (`cdc-sync erase`)")
                    continue
                present = partial(_source_ids, conn, table)
                extra = delete_extra_rows(sinks, sink.sink, route, key_columns, sink.extra, present)
                out(f"  {table} {sink.sink}: {len(sink.extra)} extra: {extra.describe()}")
    return signals


def _repair_documents(
    mapping: MappingFile,
    sinks: RepairSinks,
    conn: psycopg.Connection[Any],
    channel: SnapshotChannel,
    table: TableId,
    sink: SinkComparison,
    out: Output,
) -> None:
    """A document index: extra documents deleted, missing and different ones rewritten."""
    name = sink.sink.removeprefix(DOCUMENT_PREFIX)
    if sink.extra:
        extra = delete_extra_documents(sinks, mapping, name, conn, sink.extra)
        out(f"  {table} {sink.sink}: {len(sink.extra)} extra: {extra.describe()}")
    wrong = [*sink.missing, *sink.different]
    if wrong:
        search = sinks.sink("search")
        assert isinstance(search, SearchSink)
        rewritten = rewrite_documents(search, mapping, name, conn, channel.config, wrong)
        out(
            f"  {table} {sink.sink}: {len(sink.missing)} missing, {len(sink.different)} "
            f"different: {rewritten.describe()}"
        )


def _rewrite(
    conn: psycopg.Connection[Any],
    comparison: TableComparison,
    key_columns: list[str],
    keys: dict[str, tuple[Any, ...]],
    out: Output,
) -> list[SnapshotSignal]:
    wanted: set[str] = set()
    for sink in comparison.sinks:
        # An extra row whose key Postgres holds (a filtered sink holding a row its filter
        # excludes, a marked row of a live one) is settled by the key's snapshot row too.
        found = [i for i in [*sink.missing, *sink.different, *sink.extra] if i in keys]
        if sink.missing or sink.different:
            out(
                f"  {comparison.table} {sink.sink}: {len(sink.missing)} missing, "
                f"{len(sink.different)} different"
            )
        wanted.update(found)
    signals = table_signals(
        conn, comparison.table, key_columns, [keys[i] for i in sorted(wanted)], len(keys)
    )
    if signals:
        how = "the whole table" if signals[0].whole else f"{len(wanted)} keys"
        out(f"  {comparison.table}: re-snapshot {how} ({len(signals)} signal(s))")
    return signals


def _source_ids(conn: psycopg.Connection[Any], table: TableId) -> set[str]:
    return set(source_keys(conn, table))


def _progress(out: Output) -> Callable[[SnapshotSignal, Notification], None]:
    def seen(_signal: SnapshotSignal, notification: Notification) -> None:
        if notification.type in ("STARTED", "COMPLETED", "ABORTED"):
            out(f"  snapshot {describe(notification)}")

    return seen


def _settle(
    mapping: MappingFile, connections: Connections, options: RepairOptions, source: SourceDatabase
) -> Report:
    """Verify until clean or `settle_seconds`: the job applies the snapshot rows meanwhile."""
    deadline = time.monotonic() + options.settle_seconds
    while True:
        report = _verify(mapping, connections, options, source)
        if report.converged or time.monotonic() >= deadline:
            return report
        time.sleep(options.poll_seconds)


def _verify(
    mapping: MappingFile, connections: Connections, options: RepairOptions, source: SourceDatabase
) -> Report:
    return read_retried(
        lambda: verify_all(mapping, connections, options.tables, options.sinks, source),
        "repair verify",
    )


def _damage(report: Report) -> str:
    counts = [
        (len(s.missing), len(s.different), len(s.extra)) for t in report.tables for s in t.sinks
    ]
    missing, different, extra = (sum(c[i] for c in counts) for i in range(3))
    return f"{missing} missing, {different} different, {extra} extra"
