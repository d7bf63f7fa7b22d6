"""Soak scenarios of issue 17 (each returns one row of the soak's table), and what every scenario
shares: a row, writing in the background, timed convergence.

- TRUNCATE under load: adv.truncated truncated while the workload writes, its keys written again.
- A column dropped and one renamed after TOAST-only updates, while the job was stopped.
- The connector's database is not CDC_SYNC_PG_URL's: the job and verify run without the URL;
  a start with the URL on another database is refused, naming both.
- Topics re-created (new snapshot) and the job restarted with --no-fail-on-data-loss.
- Deferrable-key swaps read a few records per batch, so batch boundaries fall inside them.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from cdc_sync.verify.compare import Report
from tests.adversarial.pipeline import Pipeline, differences, rows_compared
from tests.adversarial.workload import (
    Workload,
    drop_and_rename_after_toast_updates,
    swap_deferred_keys,
    update_deferred,
)
from tests.pg import private_database

CONVERGE_TIMEOUT_SECONDS = 900.0


@dataclass(frozen=True)
class Result:
    scenario: str
    changes: int
    faults: str
    rows_compared: int
    differences: str
    seconds: float


def write_until(workload: Workload, target: int, stop: threading.Event) -> None:
    """Operations in small paced chunks until `target` committed changes (or `stop`)."""
    while workload.changes < target and not stop.is_set():
        workload.run(20)
        time.sleep(0.05)


def write_at_rate(workload: Workload, changes_per_second: float, stop: threading.Event) -> None:
    """Operations one at a time, held to `changes_per_second` committed changes on average,
    until `stop`; 0: as fast as `write_until` writes."""
    if changes_per_second <= 0:
        write_until(workload, sys.maxsize, stop)
        return
    first, started = workload.changes, time.monotonic()
    while not stop.is_set():
        due = first + (time.monotonic() - started) * changes_per_second
        if workload.changes < due:
            workload.run(1)
        else:
            stop.wait(0.05)


def in_background(action: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def while_writing(workload: Workload, action: Callable[[], None]) -> None:
    """`action` (a fault and its restart) while the workload keeps writing, however far it got."""
    stop = threading.Event()
    writer = in_background(lambda: write_until(workload, sys.maxsize, stop))
    try:
        action()
    finally:
        stop.set()
        writer.join()


def timed_convergence(pipeline: Pipeline) -> tuple[Report, float]:
    started = time.monotonic()
    report = pipeline.wait_converged(timeout_seconds=CONVERGE_TIMEOUT_SECONDS)
    return report, time.monotonic() - started


def result(
    scenario: str, changes: int, faults: str, report: Report, seconds: float, before: str = ""
) -> Result:
    found = f"{before} -> {differences(report)}" if before else str(differences(report))
    return Result(scenario, changes, faults, rows_compared(report), found, seconds)


def truncate_round(pipeline: Pipeline, workload: Workload, number: int) -> Result:
    """TRUNCATE adv.truncated while the workload writes (its own writers of the table among
    them), its keys written again after; the sinks drop the older rows, keep the later ones."""
    before = workload.changes
    extra: list[int] = []

    def truncate() -> None:
        time.sleep(1.0)  # the writers are under way
        extra.append(workload.truncate_and_reinsert(number))
        time.sleep(1.0)

    while_writing(workload, truncate)
    report, seconds = timed_convergence(pipeline)
    return result(
        f"round {number}: TRUNCATE under load",
        workload.changes - before + extra[0],
        "TRUNCATE adv.truncated, keys re-inserted",
        report,
        seconds,
    )


def drop_column_round(pipeline: Pipeline, workload: Workload) -> Result:
    """Job stopped; TOAST-only updates and a key move of adv.arrays; a TOASTed column dropped,
    another renamed; a TOAST-only update of every row; the job restarted (`on_schema_change:
    evolve` in the mapping), the workload going on."""
    before = workload.changes
    pipeline.job.stop()
    changed = drop_and_rename_after_toast_updates(pipeline.connections.require("pg_url"))
    pipeline.job.start()
    pipeline.job.wait_up()
    workload.run(100)
    report, seconds = timed_convergence(pipeline)
    return result(
        "column dropped + renamed after TOAST-only updates",
        workload.changes - before + changed,
        "job stopped across the DDL",
        report,
        seconds,
    )


SWAP_BATCH_RECORDS = 3


def swaps_across_batches_round(pipeline: Pipeline, workload: Workload, swaps: int = 60) -> Result:
    """Deferrable-key swaps written while the job is stopped (d(a) ts(a) c(b) d(b) ts(b) c(a)
    each, a single-row update now and then to move the boundaries), then read three records a
    batch: boundaries fall between c(b) and d(b) and elsewhere inside the swaps. The job settles
    such deletes from Postgres across the boundary; afterwards it reads as usual again."""
    before = workload.changes
    pipeline.job.stop()
    ctx = workload.context()
    for _ in range(swaps):
        swap_deferred_keys(ctx)
        if ctx.rng.random() < 0.3:
            update_deferred(ctx)
    pipeline.job.with_options("--max-offsets-per-trigger", str(SWAP_BATCH_RECORDS))
    pipeline.job.start()
    pipeline.job.wait_up()
    try:
        report, seconds = timed_convergence(pipeline)
    finally:
        pipeline.job.stop()
        pipeline.job.with_options()
        pipeline.job.start()
        pipeline.job.wait_up()
    return result(
        f"deferrable-key swaps, {SWAP_BATCH_RECORDS} records a batch",
        workload.changes - before,
        f"job restarted with --max-offsets-per-trigger {SWAP_BATCH_RECORDS}",
        report,
        seconds,
    )


def source_database_check(pipeline: Pipeline) -> Result:
    """The job and verify ran without CDC_SYNC_PG_URL all along (pipeline.job_environment); a
    start with the URL on another database of the server is refused, naming both."""
    started = time.monotonic()
    captured = pipeline.connections.require("pg_url")
    with private_database(captured, "adv_elsewhere") as other:
        output = pipeline.refused_start(other)
    names = [database_name(url) for url in (captured, other)]
    missing = [name for name in names if name not in output]
    if missing:
        raise AssertionError(f"the refusal does not name {missing}:\n{output}")
    report = pipeline.verify()
    return result(
        "connector database != CDC_SYNC_PG_URL's",
        0,
        "job/verify without the URL; a URL elsewhere refused",
        report,
        time.monotonic() - started,
    )


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def recreated_topics_round(pipeline: Pipeline, workload: Workload) -> Result:
    """Capture and job stopped, the topics deleted, the capture's offsets and slot dropped;
    rows written meanwhile (no deletes: a new snapshot cannot tell a sink of those); capture
    re-creates the topics with a new snapshot, and the job, restarted with
    --no-fail-on-data-loss on its checkpoint (now past the topics' ends), reads them from 0."""
    before = workload.changes
    pipeline.wait_converged(CONVERGE_TIMEOUT_SECONDS)
    pipeline.recreate_topics()
    changed = rewrite_without_deletes(pipeline.connections.require("pg_url"))
    pipeline.start_capture()
    pipeline.job.with_options("--no-fail-on-data-loss")
    pipeline.job.start()
    pipeline.job.wait_up()
    report, seconds = timed_convergence(pipeline)
    pipeline.job.with_options()
    return result(
        "topics re-created, --no-fail-on-data-loss",
        workload.changes - before + changed,
        "topics deleted, new snapshot",
        report,
        seconds,
    )


def rewrite_without_deletes(pg_url: str) -> int:
    """Every table's rows changed while capture is down (only the new snapshot carries them)."""
    import psycopg

    statements = (
        "UPDATE adv.deferred SET val = val || ' (re-created)'",
        "UPDATE adv.child SET qty = qty + 1",
        "UPDATE adv.parent SET c_text = 're-created'",
        "UPDATE adv.arrays SET n = n + 1",
        "UPDATE adv.truncated SET val = val || ' (re-created)'",
    )
    changed = 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in statements:
            changed += max(conn.execute(statement.encode()).rowcount, 0)
    return changed


def workload_cases(pipeline: Pipeline, workload: Workload) -> Result:
    """The workload's own cases, through every fault above: adv.arrays (every array element type
    TOASTed, TOAST-only updates, key moves, nulls) and adv.parent (fractional intervals of every
    sign and magnitude among its columns): their operations and their rows, checked again."""
    started = time.monotonic()
    operations = sum(n for label, n in workload.done.items() if "arrays" in label)
    operations += sum(n for label, n in workload.done.items() if "parent" in label)
    report = pipeline.verify()
    tables = [t for t in report.tables if str(t.table) in ("adv.arrays", "adv.parent")]
    found = sum(len(s.missing) + len(s.extra) + len(s.different) for t in tables for s in t.sinks)
    return Result(
        "TOASTed arrays of every type, fractional intervals",
        operations,
        "all of the above (operations, not rows)",
        sum(t.source_count * len(t.sinks) for t in tables),
        str(found),
        time.monotonic() - started,
    )
