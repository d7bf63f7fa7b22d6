"""`make soak`: the adversarial workload, long, with the faults repeated; prints a table.

Rounds of: the seeded workload (tests/adversarial/workload.py) with one large transaction, the
sync job subprocess killed with SIGKILL twice while a batch is in flight (restarted on its
checkpoint), capture (the embedded engine, `cdc-sync capture` in its own process group) stopped
while the workload goes on and restarted, then killed with SIGKILL while it streams and restarted
on its offset file and slot; then convergence (verify: every sink equals Postgres). Then
adv.truncated is TRUNCATEd while the workload writes (tests/adversarial/scenarios.py), and the
Redis cache is flushed while the job runs, verify reports what the cache lost, and the documented
repair (an incremental snapshot of every table, as `cdc-sync connectors snapshot` requests)
restores it. After the rounds the search server is frozen (SIGSTOP) for `--freeze-seconds` while
the workload writes: the job must wait for it without exiting and converge once it answers; a
column is dropped and another renamed after TOAST-only updates while the job is stopped; the
topics are re-created with a new snapshot and the job restarted with --no-fail-on-data-loss; a
job start with CDC_SYNC_PG_URL on another database is refused (the job and verify run without
it throughout). Last, a second pipeline captured by a Kafka Connect worker of its own (the same
connector over REST) has the worker JVM killed with SIGKILL in its first offset-flush window
after the snapshot, then mid-stream `--connect-kills` times; it resumes from its offsets.

    python -m tests.adversarial.soak --changes 100000 --rounds 3 --seed 1

It starts a local stack of its own (cdc_sync.localstack: Postgres, broker, search, Redis) under
`--state-dir` unless one is already up there, and stops what it started.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from cdc_sync.core.settings import Connections
from cdc_sync.localstack.stack import LocalStack
from tests.adversarial.pipeline import (
    MAX_OFFSETS_PER_TRIGGER,
    Pipeline,
    differences,
    rows_compared,
)
from tests.adversarial.scenarios import (
    CONVERGE_TIMEOUT_SECONDS,
    Result,
    drop_column_round,
    in_background,
    recreated_topics_round,
    source_database_check,
    swaps_across_batches_round,
    timed_convergence,
    truncate_round,
    while_writing,
    workload_cases,
    write_at_rate,
    write_until,
)
from tests.adversarial.workload import Workload, create_schema
from tests.e2e.sinks_state import clean_sinks
from tests.pg import private_database

log = logging.getLogger("soak")


def faulty_round(
    pipeline: Pipeline, workload: Workload, number: int, target: int, large_rows: int
) -> Result:
    """Workload + large transaction + kill -9 of the job twice + a graceful capture restart +
    kill -9 of capture mid-stream, then convergence."""
    before = workload.changes
    halfway = before + (target - before) // 2
    stop = threading.Event()
    writer = in_background(lambda: write_until(workload, halfway, stop))
    mid_batch = [pipeline.kill_job()]
    stop.set()
    writer.join()
    workload.large_transaction(large_rows)
    mid_batch.append(pipeline.kill_job())
    pipeline.stop_capture()
    write_until(workload, workload.changes + (target - workload.changes) // 3, threading.Event())
    pipeline.start_capture()
    while_writing(workload, pipeline.kill_capture)
    write_until(workload, target, threading.Event())
    report, seconds = timed_convergence(pipeline)
    kills = f"job kill -9 x2 ({sum(mid_batch)} mid-batch)"
    return Result(
        f"round {number}: workload + large txn ({large_rows} rows)",
        workload.changes - before,
        f"{kills}, capture restart, capture kill -9",
        rows_compared(report),
        str(differences(report)),
        seconds,
    )


def search_frozen_round(
    pipeline: Pipeline, workload: Workload, search_pid: int, seconds: float, rate: float
) -> Result:
    """The search server SIGSTOPped for `seconds` while the workload writes `rate` changes a
    second: the job waits for it (logs "waiting for sink", never exits), the cache and the
    warehouse keep applying (the freshness probe's updates show there within seconds), and
    every sink converges once it answers again. The rate is one the machine applies (issue 28
    asks for 20 changes/s): the check is that nothing waits for search, not the job's
    throughput, which `make bench` measures (unthrottled, about 160 changes/s here, two cores
    apply in more than the probe's 10 s)."""
    before = workload.changes
    frozen = pipeline.freeze_search(
        search_pid, seconds, lambda stop: write_at_rate(workload, rate, stop)
    )
    log.info("while search was frozen: %s", frozen.text())
    report, converge_seconds = timed_convergence(pipeline)
    pipeline.job.raise_if_dead()
    return Result(
        f"search server frozen {seconds:g}s, {rate:g} changes/s",
        workload.changes - before,
        f"SIGSTOP search (job waits, no restart); meanwhile {frozen.summary()}",
        rows_compared(report),
        str(differences(report)),
        converge_seconds,
    )


def connect_round(
    connections: Connections,
    run: Path,
    workload: Workload,
    changes: int,
    kills: int,
    max_offsets_per_trigger: int = MAX_OFFSETS_PER_TRIGGER,
) -> Result:
    """A pipeline captured by a Kafka Connect worker: the worker JVM killed with SIGKILL in its
    first offset-flush window after the snapshot, then `kills` times mid-stream; the connector
    resumes from its offsets topic each time."""
    pipeline = Pipeline.create(
        replace(connections, warehouse=str(run / "connect" / "warehouse")),
        run / "connect",
        capture="connect",
        max_offsets_per_trigger=max_offsets_per_trigger,
    )
    before = workload.changes
    clean_sinks(pipeline.mapping, pipeline.connections)
    try:
        # Killed inside its first offset-flush window after the snapshot: the restart resends
        # the transactions streamed after the snapshot (issue 17, item 3).
        pipeline.kill_capture_in_first_flush_window(lambda: workload.run(30))
        pipeline.job.start()
        pipeline.job.wait_up()
        pipeline.wait_converged(CONVERGE_TIMEOUT_SECONDS)  # snapshot done: the kills hit a stream
        for kill in range(kills):
            write_until(workload, before + changes * (kill + 1) // (kills + 1), threading.Event())
            while_writing(workload, pipeline.kill_capture)
        write_until(workload, before + changes, threading.Event())
        report, seconds = timed_convergence(pipeline)
        if pipeline.initial_snapshots() != 1:
            raise AssertionError(f"{pipeline.initial_snapshots()} initial snapshots (1 expected)")
        if pipeline.dead_letters():
            raise AssertionError(f"{pipeline.dead_letters()} dead letters (none expected)")
    finally:
        pipeline.stop()
    return Result(
        "Kafka Connect capture",
        workload.changes - before,
        f"Connect worker kill -9 in its first flush window, then x{kills} mid-stream",
        rows_compared(report),
        str(differences(report)),
        seconds,
    )


def cache_loss_round(pipeline: Pipeline, workload: Workload, number: int) -> Result:
    """Redis flushed while running: verify reports it; an incremental snapshot repairs it."""
    before = workload.changes
    pipeline.flush_cache()
    broken = pipeline.verify()
    pipeline.request_resnapshot()
    workload.run(100)
    report, seconds = timed_convergence(pipeline)
    return Result(
        f"round {number}: cache flushed, re-snapshot repair",
        workload.changes - before,
        "redis FLUSHDB",
        rows_compared(report),
        f"{differences(broken)} -> {differences(report)}",
        seconds,
    )


def format_table(results: Sequence[Result]) -> str:
    header = ("scenario", "changes", "faults", "rows compared", "differences", "converged in")
    rows = [header] + [
        (
            r.scenario,
            str(r.changes),
            r.faults,
            str(r.rows_compared),
            r.differences,
            f"{r.seconds:.1f}s",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def soak(
    connections: Connections, root: Path, args: argparse.Namespace, search_pid: int
) -> list[Result]:
    # The Connect scenario gets a round's share of the changes, the freeze what it writes.
    per_round = args.changes // (args.rounds + (1 if args.connect_kills else 0))
    large_rows = min(args.large_transaction, per_round // 2)
    results: list[Result] = []
    run = root / f"run-{int(time.time())}"
    with private_database(connections.require("pg_url"), "adv_soak") as database:
        connections = replace(connections, pg_url=database, warehouse=str(run / "warehouse"))
        create_schema(database)
        workload = Workload(database, args.seed)
        workload.seed_rows()
        workload.run(50)
        pipeline = Pipeline.create(
            connections, run, max_offsets_per_trigger=args.max_offsets_per_trigger
        )
        pipeline.start()
        try:
            for number in range(1, args.rounds + 1):
                target = workload.changes + per_round
                results.append(faulty_round(pipeline, workload, number, target, large_rows))
                log.info("%s", results[-1])
                results.append(truncate_round(pipeline, workload, number))
                log.info("%s", results[-1])
                results.append(cache_loss_round(pipeline, workload, number))
                log.info("%s", results[-1])
            if args.freeze_seconds:
                results.append(
                    search_frozen_round(
                        pipeline, workload, search_pid, args.freeze_seconds, args.freeze_rate
                    )
                )
                log.info("%s", results[-1])
            for scenario in (drop_column_round, recreated_topics_round, swaps_across_batches_round):
                results.append(scenario(pipeline, workload))
                log.info("%s", results[-1])
            results.append(source_database_check(pipeline))
            log.info("%s", results[-1])
            results.append(workload_cases(pipeline, workload))
            log.info("%s", results[-1])
            if pipeline.dead_letters():
                raise AssertionError(f"{pipeline.dead_letters()} dead letters (none expected)")
        finally:
            pipeline.stop()
        try:
            if args.connect_kills:
                results.append(
                    connect_round(
                        connections,
                        run,
                        workload,
                        per_round,
                        args.connect_kills,
                        args.max_offsets_per_trigger,
                    )
                )
                log.info("%s", results[-1])
        finally:
            workload.close()
    # The workload-cases row counts operations already in the other rows' changes.
    total = sum(r.changes for r in results if not r.faults.startswith("all of the above"))
    faults = [
        f"{2 * args.rounds} job kill -9",
        "4 job restarts (the DDL, the topics, the swaps twice)",
        f"{args.rounds} capture restarts",
        f"{args.rounds} capture kill -9",
        f"{args.rounds} flushes",
        f"{args.rounds} TRUNCATE",
        "column drop + rename",
        "topics re-created",
        "swaps read 3 records a batch",
    ]
    if args.freeze_seconds:
        faults.append(f"search frozen {args.freeze_seconds:g}s at {args.freeze_rate:g} changes/s")
    if args.connect_kills:
        faults.append(f"{args.connect_kills + 1} Connect worker kill -9")
    results.append(
        Result(
            f"total (seed {args.seed})",
            total,
            ", ".join(faults),
            max(r.rows_compared for r in results),
            "0",
            sum(r.seconds for r in results),
        )
    )
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--changes", type=int, default=100_000, help="row changes in all")
    parser.add_argument("--rounds", type=int, default=3, help="fault rounds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--large-transaction", type=int, default=20_000, help="rows of each round's large txn"
    )
    parser.add_argument(
        "--freeze-seconds", type=float, default=60.0, help="search server frozen (0: skip)"
    )
    parser.add_argument(
        "--freeze-rate",
        type=float,
        default=20.0,
        help="changes/s the workload writes while search is frozen (0: unthrottled)",
    )
    parser.add_argument(
        "--connect-kills", type=int, default=2, help="Connect worker kill -9s (0: skip)"
    )
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=MAX_OFFSETS_PER_TRIGGER,
        help="records per micro-batch of the job (a few: boundaries inside transactions)",
    )
    parser.add_argument("--state-dir", default=".cdc-sync/soak", help="stack and pipeline state")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("py4j", "urllib3", "opensearch", "elastic_transport"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    args = parse_args(argv)
    root = Path(args.state_dir).resolve()
    stack = LocalStack(root / "stack", broker="tansu", with_connect=False)
    started = not stack.is_up()
    urls = stack.start()
    try:
        search = next(s for s in stack.started() if s.name == "search")
        results = soak(urls.connections(), root, args, search.pid)
    finally:
        if started:
            stack.stop()
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
