"""Adversarial convergence, bounded (issue 8, item 7): a seeded random workload over every column
type, TOAST-only updates, primary-key moves, deferred keys, savepoints, rollbacks and interleaved
transactions, with faults in between: kill -9 of the sync job subprocess mid-batch (restarted on
its checkpoint), a graceful capture restart with changes made while it was down, kill -9 of the
capture process (the embedded engine's JVM) while it streams, the Redis cache flushed while
running (repaired by an incremental snapshot), and the search server frozen (SIGSTOP) while the
workload writes. Then (issue 17) adv.truncated TRUNCATEd under load, the job's database found
through the connector's settings (CDC_SYNC_PG_URL unset; a URL elsewhere refused), and a column
dropped and one renamed after TOAST-only updates while the job was stopped. Kafka Connect worker
kills: test_adversarial_connect.py. Long version: `make soak`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc_sync.core import settings
from cdc_sync.core.model import TableId
from cdc_sync.sinks.search import readback as search_readback
from cdc_sync.sinks.search.backends import open_backend
from tests.adversarial.capture import EngineCapture
from tests.adversarial.child import wait_for
from tests.adversarial.pipeline import PROJECT_ROOT, Pipeline
from tests.adversarial.scenarios import database_name
from tests.adversarial.workload import (
    TABLES,
    Workload,
    create_schema,
    drop_and_rename_after_toast_updates,
    paced,
    paced_in_background,
    swap_deferred_keys,
)
from tests.e2e.conftest import adversarial_connections, running_adversarial
from tests.fixtures.services import KafkaEndpoint, SearchServer
from tests.pg import private_database

pytestmark = pytest.mark.e2e

SEED = 8007
ADVERSARIAL_REDIS_DB = 8  # conftest: shop 3, types 4, schema evolution 5-7
LARGE_TRANSACTION_ROWS = 2000
FREEZE_SECONDS = 45.0


@pytest.fixture(scope="module")
def adversarial(
    pg_url: str,
    kafka: KafkaEndpoint,
    search_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Pipeline, Workload]]:
    root = tmp_path_factory.mktemp("adversarial")
    with private_database(pg_url, "adv_e2e") as database:
        connections = adversarial_connections(
            database, kafka, search_url, redis_url, ADVERSARIAL_REDIS_DB, root
        )
        with running_adversarial(connections, root, SEED) as running:
            yield running


def test_converges_through_kill9_capture_restart_capture_kill9_and_cache_loss(
    adversarial: tuple[Pipeline, Workload],
) -> None:
    pipeline, workload = adversarial
    # (a) kill -9 of the job subprocess while a batch is in flight, restart on the checkpoint.
    writer = paced_in_background(workload, 150)
    assert pipeline.kill_job(), "no batch was in flight when the job was killed"
    writer.join()
    workload.large_transaction(LARGE_TRANSACTION_ROWS)
    writer = paced_in_background(workload, 100)
    pipeline.kill_job()
    writer.join()
    # (b) capture stopped while the workload goes on; restarted on its offsets and slot.
    pipeline.stop_capture()
    workload.run(60)
    pipeline.start_capture()
    paced(workload, 60)
    # (c) capture (the engine's JVM) killed with SIGKILL while it streams: it re-sends from its
    # last flushed offset on restart, and the sinks fence the duplicates.
    writer = paced_in_background(workload, 100)
    pipeline.kill_capture()
    writer.join()
    # Generous: under a loaded machine the large transaction's backlog took minutes (its
    # inserts applied, its deletes still queued: verify saw only extra rows meanwhile).
    report = pipeline.wait_converged(timeout_seconds=300)
    assert {t.source_count for t in report.tables} != {0}
    assert pipeline.initial_snapshots() == 1, "a capture restart snapshotted again"
    # (d) the cache is lost while running: verify names it, an incremental snapshot repairs it.
    pipeline.flush_cache()
    broken = pipeline.verify()
    lost = {
        (str(t.table), s.sink): len(s.missing)
        for t in broken.tables
        for s in t.sinks
        if not s.matches
    }
    assert lost, "verify did not report the flushed cache"
    assert {sink for _, sink in lost} == {"cache"}, broken.table()
    cached = [t for t in broken.tables if any(s.sink == "cache" for s in t.sinks)]
    assert sum(lost.values()) == sum(t.source_count for t in cached), broken.table()
    pipeline.request_resnapshot()
    paced(workload, 40)
    pipeline.wait_converged(timeout_seconds=180)
    # Nothing was malformed or refused: the dead-letter topic holds no record.
    assert pipeline.dead_letters() == 0
    assert pipeline.job.starts == 3


def test_search_server_frozen_the_job_waits_and_converges(
    adversarial: tuple[Pipeline, Workload], search_server: SearchServer
) -> None:
    """The search server answers nothing (SIGSTOP) while the workload writes: the job retries,
    logs that it waits for the sink, does not exit, and converges once the server is back.
    Meanwhile the cache and the warehouse keep applying (invariant 8): the freshness probe's
    updates, twice a second, show there within seconds while search commits nothing."""
    if search_server.pid is None:
        pytest.skip("the search server is not a local process here: it cannot be frozen")
    pipeline, workload = adversarial
    pipeline.wait_converged(timeout_seconds=120)
    # Longer than the job's 30 s per-request sink timeout (cdc_sync.core.retry): a bulk sent
    # while frozen times out, and the job must wait, not end.
    frozen = pipeline.freeze_search(
        search_server.pid, FREEZE_SECONDS, lambda stop: write(workload, stop)
    )
    print(f"while search was frozen: {frozen.text()}")
    pipeline.wait_converged(timeout_seconds=180)
    assert pipeline.job.starts == 3  # still the process of the first test's last restart
    assert pipeline.dead_letters() == 0


def write(workload: Workload, stop: threading.Event) -> None:
    while not stop.is_set():
        workload.run(10)
        time.sleep(0.2)


def test_workload_is_deterministic_for_a_seed(pg_url: str) -> None:
    """The same seed on the same starting state runs the same statements: same final rows."""
    states = []
    for _ in range(2):
        with private_database(pg_url, "adv_seed") as database:
            create_schema(database)
            workload = Workload(database, SEED)
            workload.seed_rows()
            workload.run(200)
            workload.large_transaction(300)
            workload.run(100)
            workload.close()
            states.append(table_digests(database))
    assert states[0] == states[1]


def table_digests(database: str) -> list[tuple[str, int]]:
    with psycopg.connect(database) as conn:
        digests = []
        for table in TABLES:
            row = conn.execute(
                f"SELECT md5(string_agg(t::text, ',' ORDER BY t::text)), count(*) FROM {table} t"
            ).fetchone()
            assert row is not None
            digests.append((str(row[0]), int(row[1])))
        return digests


def test_deferred_primary_key_swap_converges(adversarial: tuple[Pipeline, Workload]) -> None:
    """Two rows of a DEFERRABLE-keyed table swap keys in one UPDATE: Debezium emits delete(a)
    create(b) delete(b) create(a), so key b's last change is a delete though Postgres holds b
    (found by this suite); the fold hands such a delete to Postgres (job.decode.fold.fold_key)."""
    pipeline, workload = adversarial
    pipeline.wait_converged(timeout_seconds=120)  # the state before: converged
    assert swap_deferred_keys(workload.context()) is not None
    pipeline.wait_converged(timeout_seconds=30)


def test_repair_restores_damaged_sinks_while_the_workload_runs(
    adversarial: tuple[Pipeline, Workload],
) -> None:
    """`cdc-sync repair` (a subprocess, as ops run it) on damage of every kind at once: Redis
    flushed, a search index's documents deleted, Delta rows corrupted, extra rows in search and
    Delta; the workload keeps writing meanwhile, and the sinks end equal to Postgres."""
    pipeline, workload = adversarial
    pipeline.wait_converged(timeout_seconds=300)
    damage(pipeline)
    broken = {(str(t.table), s.sink): s for t in pipeline.verify().tables for s in t.sinks}
    assert broken["adv.deferred", "search"].missing and broken["adv.child", "cache"].missing
    assert len(broken["adv.deferred", "delta"].different) == 3
    assert broken["adv.deferred", "delta"].extra == [str(EXTRA_ID)]
    assert broken["adv.child", "search"].extra == [EXTRA_DOC]
    finished: list[datetime] = []
    argv = [sys.executable, "-m", "cdc_sync.cli", "repair", "--mapping", str(pipeline.mapping_path)]
    # The capture runs the connector file with this override (Pipeline.capture_settings).
    argv += ["--set", f"notification.sink.topic.name={pipeline.topic_prefix}.notifications"]
    errors = pipeline.root / "repair.stderr"
    with errors.open("w") as stderr:
        repair = subprocess.Popen(
            [*argv, "--rounds", "4"],
            cwd=PROJECT_ROOT,
            env=pipeline.job.env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    printed: list[str] = []
    snapshot_started = threading.Event()

    def read() -> None:
        assert repair.stdout is not None
        for line in repair.stdout:
            printed.append(line)
            if SNAPSHOT_STARTED.search(line):
                snapshot_started.set()
        snapshot_started.set()  # exited

    def write() -> None:  # until repair's snapshot has started (however long its first round
        # takes on a loaded machine), a little beyond, then quiet: repair's last verify is clean
        while not snapshot_started.is_set():
            paced(workload, 10)
        paced(workload, 20)
        finished.append(datetime.now(tz=UTC))

    reader = threading.Thread(target=read)
    writer = threading.Thread(target=write)
    reader.start()
    writer.start()
    try:
        returncode = repair.wait(timeout=600)
    finally:
        repair.kill()
        reader.join()
        writer.join()
    stdout = "".join(printed)
    assert returncode == 0, stdout + errors.read_text()
    # The snapshot repair asked for started while the workload was still writing.
    snapshot = SNAPSHOT_STARTED.search(stdout)
    assert snapshot is not None, stdout
    assert datetime.fromisoformat(snapshot.group(1)) < finished[0], stdout
    # Per table and sink what was wrong and what repair did (counts include rows the workload
    # changed meanwhile, so only lower bounds are certain).
    for pattern in (
        r"adv\.deferred search: [1-9]\d* missing",
        r"adv\.child cache: [1-9]\d* missing",
        r"adv\.deferred delta: \d+ missing, ([3-9]|\d{2,}) different",
        r"adv\.deferred delta: \d+ extra: [1-9]\d* deleted at their stored version",
        r"adv\.child search: \d+ extra: [1-9]\d* deleted at their stored version",
    ):
        assert re.search(pattern, stdout), stdout
    assert stdout.rstrip().endswith("converged"), stdout
    # The job ran its Delta upkeep between batches all along (`--maintain-every`); on tables
    # this small a MERGE leaves one file, so there may be nothing to compact.
    logs = [pipeline.job.log, pipeline.root / "state" / "logs" / "job.log"]
    text = "".join(p.read_text(errors="replace") for p in logs if p.exists())
    assert "Delta upkeep adv.parent:" in text
    pipeline.wait_converged(timeout_seconds=120)


SNAPSHOT_STARTED = re.compile(r"snapshot (\S+) started")
EXTRA_ID = 10**9
EXTRA_DOC = "zz\\|extra|1"


def damage(pipeline: Pipeline) -> None:
    mapping, connections = pipeline.mapping, pipeline.connections
    pipeline.flush_cache()
    search = open_backend(connections.search_client, connections.require("search_url"))
    try:
        # The small documents' index: the search stand-in struggles with the parent's 60 kB ones.
        wiped = mapping.tables[TableId("adv", "deferred")].search
        child = mapping.tables[TableId("adv", "child")].search
        assert wiped is not None and child is not None
        ids = list(search_readback.documents(search, wiped.index))
        search.bulk([{"delete": {"_index": wiped.index, "_id": i}} for i in ids])
        extra = {"k": "zz|extra", "n": 1, "parent_id": 1, "qty": 1, "note": "not in postgres"}
        versioned = {"version": 5, "version_type": "external"}
        search.bulk([{"index": {"_index": child.index, "_id": EXTRA_DOC, **versioned}}, extra])
    finally:
        search.close()
    deferred = mapping.tables[TableId("adv", "deferred")].delta
    assert deferred is not None
    path = str(Path(connections.require("warehouse")) / deferred.relative_path())
    table = DeltaTable(path)
    held = table.to_pyarrow_table()
    ids = sorted(held["id"].to_pylist())[:3]
    table.update(
        predicate=f'"id" IN ({", ".join(map(str, ids))})', updates={'"val"': "'corrupted'"}
    )
    row = held.slice(0, 1)
    row = row.set_column(
        row.schema.get_field_index("id"), "id", pa.array([EXTRA_ID], row.schema.field("id").type)
    )
    write_deltalake(path, row.cast(pa.schema(DeltaTable(path).schema().to_arrow())), mode="append")


def test_truncate_under_load_converges(adversarial: tuple[Pipeline, Workload]) -> None:
    """adv.truncated is TRUNCATEd while the workload writes (to it too), its keys written again
    after: every sink drops the rows older than the truncate and keeps the later ones."""
    pipeline, workload = adversarial
    writer = paced_in_background(workload, 60)
    time.sleep(1.0)
    assert workload.truncate_and_reinsert() > 1
    writer.join()
    pipeline.wait_converged(timeout_seconds=180)
    assert pipeline.dead_letters() == 0


def test_job_and_verify_read_the_connectors_database_and_a_url_elsewhere_is_refused(
    adversarial: tuple[Pipeline, Workload],
) -> None:
    """The job ran without CDC_SYNC_PG_URL all along (the connector's CDC_SYNC_PG_* name the
    private database) and verify read the same way; with the URL on another database of the
    server the job refuses at start naming both. The full check: test_source_database.py."""
    pipeline, _ = adversarial
    assert settings.PG_URL not in pipeline.job.env
    captured = pipeline.connections.require("pg_url")
    with private_database(captured, "adv_elsewhere") as other:
        output = pipeline.refused_start(other)
    for url in (captured, other):
        assert database_name(url) in output, output


def test_column_dropped_and_renamed_after_toast_only_updates(
    adversarial: tuple[Pipeline, Workload],
) -> None:
    """While the job is stopped: TOAST-only updates and a key move of adv.arrays, then a TOASTed
    column dropped and another renamed, then a TOAST-only update of every row. The restarted job
    (on_schema_change: evolve) fills the unavailable columns from the changed table and
    converges; the workload goes on after. Late in the module: it changes the schema."""
    pipeline, workload = adversarial
    pipeline.wait_converged(timeout_seconds=180)
    pipeline.job.stop()
    assert drop_and_rename_after_toast_updates(pipeline.connections.require("pg_url")) > 0
    pipeline.job.start()
    pipeline.job.wait_up()
    paced(workload, 40)
    pipeline.wait_converged(timeout_seconds=180)
    assert pipeline.dead_letters() == 0


def test_a_second_initial_snapshot_removes_rows_deleted_before_it(
    adversarial: tuple[Pipeline, Workload],
) -> None:
    """Capture restarted without its offsets (a Connect worker killed before its first offset
    flush; an offset file or topic lost) takes a new initial snapshot on the same topics. Rows
    deleted after the first snapshot whose deletes it had not published are absent from the
    new one, and nothing else told the sinks: they kept them (before the snapshot-end sweep,
    docs/internals.md "The end of a full snapshot"). Last in the module (a second snapshot)."""
    pipeline, workload = adversarial
    pipeline.wait_converged(timeout_seconds=180)
    pipeline.stop_capture()
    assert isinstance(pipeline.capture, EngineCapture)
    pipeline.capture.forget_offsets()  # the slot stays, as after the worker's kill
    with psycopg.connect(pipeline.connections.require("pg_url"), autocommit=True) as conn:
        row = conn.execute(
            "DELETE FROM adv.deferred WHERE id = (SELECT min(id) FROM adv.deferred) RETURNING id"
        ).fetchone()
    assert row is not None
    pipeline.start_capture()
    wait_for("a second initial snapshot", lambda: pipeline.initial_snapshots() == 2, 120.0, 1.0)
    paced(workload, 20)
    pipeline.wait_converged(timeout_seconds=180)
    assert pipeline.dead_letters() == 0
