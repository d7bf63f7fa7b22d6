"""Delta upkeep: compact the small files every MERGE leaves, vacuum what no version within the
retention reads, prune delete tombstones past theirs, and keep the mapping's table properties.

Run by `cdc-sync maintain` (beside a running job: a commit that conflicts with the job's MERGE is
retried) or by the job itself every N batches (`JobOptions.maintain_every_batches`), between
batches, so never concurrently with its own MERGE.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from deltalake import DeltaTable

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.retry import DEFAULT_POLICY, RetryPolicy, retried
from cdc_sync.mapping import DeltaRoute
from cdc_sync.sinks.delta import is_transient
from cdc_sync.sinks.delta.target import (
    ensure_properties,
    history_path,
    open_table,
    table_path,
    tombstone_path,
)
from cdc_sync.sinks.delta.tombstones import TombstoneStore

log = logging.getLogger(__name__)
T = TypeVar("T")

# Delta's own safety default (`delta.deletedFileRetentionDuration`, 7 days): a reader or writer
# still on an older version, and time travel within it, need the files vacuum would delete.
SAFE_RETENTION_HOURS = 168
# A full vacuum never deletes an unreferenced file younger than this (`vacuum`).
IN_FLIGHT_HOURS = 1
LOG_RETENTION = "delta.logRetentionDuration"
DEFAULT_LOG_RETENTION = "interval 30 days"  # Delta's default for it


@dataclass(frozen=True)
class UpkeepOptions:
    tombstone_retention_seconds: int
    retention_hours: int = SAFE_RETENTION_HOURS  # vacuum keeps files removed more recently
    force: bool = False  # allow a vacuum retention below SAFE_RETENTION_HOURS
    dry_run: bool = False  # report what would be done; change nothing

    def __post_init__(self) -> None:
        if self.retention_hours < 0:
            raise ConfigError("maintain", "--retention-hours", "must not be negative")
        if self.retention_hours < SAFE_RETENTION_HOURS and not self.force:
            raise ConfigError(
                "maintain",
                "--retention-hours",
                f"{self.retention_hours} is below Delta's safety default of "
                f"{SAFE_RETENTION_HOURS} h: readers of older versions and time travel within it "
                "would lose their files; pass --force to vacuum anyway",
            )


@dataclass(frozen=True)
class TableUpkeep:
    table: str  # schema.table, or `schema.table (tombstones)`
    files_before: int
    files_after: int
    compacted: int  # small files rewritten (0 in a dry run)
    vacuumed: int  # unreferenced files deleted (in a dry run: that would be)
    tombstones_pruned: int | None = None  # tombstone rows past their retention (deleted or due)
    properties_set: tuple[str, ...] = ()


def maintain_route(
    warehouse: Path, route: DeltaRoute, options: UpkeepOptions, retry: RetryPolicy = DEFAULT_POLICY
) -> list[TableUpkeep]:
    """Upkeep of a routed table and its tombstone table (absent ones are skipped)."""
    name = f"{route.schema}.{route.table}"
    results = []
    data = table_path(warehouse, route)
    if open_table(data) is not None:
        properties = (
            []
            if options.dry_run
            else _retried(
                lambda: ensure_properties(_open(data), route), f"set properties {name}", retry
            )
        )
        upkeep = _maintain(data, name, options, retry)
        results.append(replace(upkeep, properties_set=tuple(properties)))
    history = history_path(warehouse, route)
    if route.history and open_table(history) is not None:
        results.append(_maintain(history, f"{route.history_name()} (history)", options, retry))
    stones = tombstone_path(warehouse, route)
    if open_table(stones) is not None:
        store = TombstoneStore(warehouse, options.tombstone_retention_seconds)
        pruned = _retried(
            lambda: store.prune(route, options.dry_run), f"prune tombstones {name}", retry
        )
        upkeep = _maintain(stones, f"{name} (tombstones)", options, retry)
        results.append(replace(upkeep, tombstones_pruned=pruned))
    return results


def _maintain(path: Path, name: str, options: UpkeepOptions, retry: RetryPolicy) -> TableUpkeep:
    before = len(_open(path).file_uris())
    compacted = 0
    if not options.dry_run:
        metrics = _retried(lambda: _open(path).optimize.compact(), f"compact {name}", retry)
        compacted = int(metrics.get("numFilesRemoved", 0))
    vacuumed = vacuum(path, options.retention_hours, options.dry_run, not options.force, retry)
    after = len(_open(path).file_uris())
    log.info(
        "Delta upkeep %s: %d -> %d files, %d compacted, %d vacuumed",
        name,
        before,
        after,
        compacted,
        len(vacuumed),
    )
    return TableUpkeep(name, before, after, compacted, len(vacuumed))


def vacuum(
    path: Path,
    retention_hours: int,
    dry_run: bool = False,
    enforce_retention: bool = True,
    retry: RetryPolicy = DEFAULT_POLICY,
) -> list[str]:
    """Delete the files no table version within `retention_hours` reads; returns them.

    Two passes. deltalake's default vacuum deletes the files removed longer ago than the
    retention whose remove action the log still holds; Delta drops a remove from its
    checkpoints after `delta.deletedFileRetentionDuration` (a week), and the job writes a
    checkpoint every 100 commits, so a file can outlive its remove there and stay on disk for
    good. A full vacuum then deletes every file the log does not reference, but only those
    written at least `IN_FLIGHT_HOURS` ago: a file a concurrent writer (the running job's
    MERGE) has written but not committed yet is not referenced either."""
    name = path.name
    first = _retried(
        lambda: _open(path).vacuum(
            retention_hours=retention_hours,
            dry_run=dry_run,
            enforce_retention_duration=enforce_retention,
        ),
        f"vacuum {name}",
        retry,
    )
    orphans = _retried(
        lambda: _open(path).vacuum(
            retention_hours=max(retention_hours, IN_FLIGHT_HOURS),
            dry_run=dry_run,
            enforce_retention_duration=enforce_retention,
            full=True,
        ),
        f"vacuum {name} (full)",
        retry,
    )
    # The full pass names files by absolute path, the other relative to the table.
    root = str(path.resolve())
    return sorted({os.path.relpath(f, root) if os.path.isabs(f) else f for f in first + orphans})


@dataclass(frozen=True)
class Purged:
    files: int  # data and change-data files no current row needs, deleted
    log_files: int  # commits and checkpoints older than the new checkpoint, deleted


def purge(path: Path, retry: RetryPolicy = DEFAULT_POLICY) -> Purged:
    """Leave only what the table's current version needs (`cdc-sync erase --purge`): every
    file no current row needs, and every log entry before a new checkpoint.

    The vacuum has retention 0 and its full pass too (`vacuum`): a default vacuum alone left
    the files whose remove action had left the checkpoints. The log goes too: a commit's `add`
    action carries the file's data-skipping statistics (min/max of its first columns), the
    values of a one-row file, and older checkpoints repeat them. Delta keeps log entries for
    `delta.logRetentionDuration` (30 days); deltalake cleans up only by that property, so it is
    set to 0 for a checkpoint and the cleanup, then put back. Time travel to any earlier
    version is over (its files and log are gone)."""
    name = str(path)
    log_dir = path / "_delta_log"
    vacuumed = vacuum(path, 0, enforce_retention=False, retry=retry)
    before = set(log_dir.iterdir())
    kept = _open(path).metadata().configuration.get(LOG_RETENTION)
    _retried(lambda: _set_log_retention(path, "interval 0 seconds"), f"purge {name}", retry)
    try:
        _retried(lambda: _open(path).create_checkpoint(), f"purge checkpoint {name}", retry)
        _retried(lambda: _open(path).cleanup_metadata(), f"purge log {name}", retry)
    finally:
        restored = kept or DEFAULT_LOG_RETENTION
        _retried(lambda: _set_log_retention(path, restored), f"purge {name}", retry)
    return Purged(len(vacuumed), len(before - set(log_dir.iterdir())))


def _set_log_retention(path: Path, value: str) -> None:
    _open(path).alter.set_table_properties({LOG_RETENTION: value})


def _open(path: Path) -> DeltaTable:
    return DeltaTable(str(path))  # the newest version: a concurrent commit may have landed


def _retried(action: Callable[[], T], what: str, retry: RetryPolicy) -> T:
    return retried(action, is_transient, f"delta {what}", retry.for_target("delta"))


def format_upkeep(results: Sequence[TableUpkeep], dry_run: bool) -> str:
    """One line per table: files before -> after, compacted, vacuumed, tombstones pruned."""
    header = ["table", "files before", "after", "compacted", "vacuumed", "tombstones pruned"]
    rows = [header]
    for r in results:
        pruned = "-" if r.tombstones_pruned is None else str(r.tombstones_pruned)
        counts = (r.files_before, r.files_after, r.compacted, r.vacuumed)
        rows.append([r.table, *map(str, counts), pruned])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines += [f"{r.table}: set {', '.join(r.properties_set)}" for r in results if r.properties_set]
    if dry_run:
        lines.append("dry run: nothing changed (vacuumed and pruned: what would go)")
    return "\n".join(lines)


class EveryNBatches:
    """Calls `action` after every `every`-th batch (the job's periodic upkeep); a failure is
    logged and retried at the next turn: upkeep never fails the job."""

    def __init__(self, every: int, action: Callable[[], object]) -> None:
        if every <= 0:
            raise ValueError("maintain_every_batches must be positive")
        self.every = every
        self.action = action
        self.batches = 0

    def after_batch(self) -> None:
        self.batches += 1
        if self.batches % self.every:
            return
        try:
            self.action()
        except Exception as exc:  # upkeep is best effort: the data is already written
            log.warning(
                "Delta upkeep failed (%s): tried again in %d batches",
                type(exc).__name__,
                self.every,
            )
