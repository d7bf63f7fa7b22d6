"""`cdc-sync status`: the verdict rules, the screen and its JSON, the job's status file and the
checkpoint reader, all without services."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cdc_sync.core.model import TableId
from cdc_sync.job.observe.checkpoint import processed_offsets
from cdc_sync.job.observe.status_file import JobStatus, StatusRecorder, read_status
from cdc_sync.job.settle.applier import BatchMetrics, TableProgress
from cdc_sync.job.write.health import SinkHealth
from cdc_sync.sinks.base import WriteResult
from cdc_sync.status.gather import StatusFileWatermarks
from cdc_sync.status.model import (
    CaptureStatus,
    ConsumerSnapshot,
    PartitionStatus,
    SlotStatus,
    Snapshot,
    TaskState,
)
from cdc_sync.status.process import job_alive, process_start
from cdc_sync.status.render import lsn, render, to_json
from cdc_sync.status.verdict import Health, Thresholds, judge

pytestmark = pytest.mark.unit
NOW = 1_800_000_000.0
CUSTOMERS = TableId("shop", "customers")


def job(**changes: object) -> JobStatus:
    status = JobStatus(
        mapping="shop",
        pid=42,
        host="h",
        started_at=NOW - 600,
        alive_at=NOW - 2,
        sink_tables={"search": ["shop.customers"], "redis": ["shop.customers"]},
        sink_health={"search": {"state": "ok"}, "redis": {"state": "ok"}},
    )
    return replace(status, **changes)  # type: ignore[arg-type]


CONSUMER_FIELDS = ("job", "partitions", "watermarks", "job_alive", "stale_checkpoint")


def snapshot(**changes: object) -> Snapshot:
    """A healthy snapshot of one consumer of the log (search); `changes` to the consumer's
    fields (job, partitions, watermarks, job_alive) or the snapshot's."""
    consumer = ConsumerSnapshot(
        "search",
        "/ck/search",
        job(),
        (PartitionStatus("cdc.shop.customers", 0, 130, 0, 130),),
    )
    own = {name: value for name, value in changes.items() if name in CONSUMER_FIELDS}
    healthy = Snapshot(
        taken_at=NOW,
        mapping="shop",
        checkpoint="/ck",
        capture=CaptureStatus("kafka-connect", "shop", "RUNNING", (TaskState(0, "RUNNING"),)),
        slot=SlotStatus("shop_slot", True, True, "reserved", 10 << 20, 0, 1 << 30),
        consumers=(replace(consumer, **own),),  # type: ignore[arg-type]
        dead_letter_topic="cdc.dead_letter",
        dead_letters=0,
    )
    rest = {name: value for name, value in changes.items() if name not in CONSUMER_FIELDS}
    return replace(healthy, **rest)  # type: ignore[arg-type]


def verdict_of(s: Snapshot, **thresholds: float) -> tuple[Health, str]:
    verdict = judge(s, Thresholds(**thresholds))  # type: ignore[arg-type]
    return verdict.health, " | ".join(verdict.reasons)


def test_caught_up_pipeline_is_healthy_and_exits_0() -> None:
    verdict = judge(snapshot(), Thresholds())
    assert (verdict.health, verdict.reasons, verdict.exit_code) == (
        Health.HEALTHY,
        ("caught up",),
        0,
    )


def test_a_few_fresh_records_in_flight_are_healthy() -> None:
    partition = PartitionStatus("cdc.shop.customers", 0, 135, 0, 130, int((NOW - 2) * 1000))
    assert verdict_of(snapshot(partitions=(partition,))) == (
        Health.HEALTHY,
        "5 record(s) in flight",
    )


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"job": None}, "search: no status beside its checkpoint /ck/search"),
        ({"job": job(state="stopped", alive_at=NOW - 90)}, "search: stopped 90 s ago"),
        ({"job": job(state="failed", error="PolicyViolation: x")}, "search: failed: Policy"),
        ({"job": job(alive_at=NOW - 300)}, "search: silent for 300 s (killed?)"),
        (
            {"job": job(sink_health={"redis": {"state": "failed", "error_class": "Timeout"}})},
            "sink redis gave up (Timeout)",
        ),
        ({"capture": CaptureStatus("kafka-connect", "shop", "PAUSED")}, "connector shop is PAUSED"),
        (
            {
                "capture": CaptureStatus(
                    "kafka-connect", "shop", "RUNNING", (TaskState(0, "FAILED"),)
                )
            },
            "connector task 0 is FAILED",
        ),
        ({"slot": SlotStatus("s", exists=False)}, "replication slot s does not exist"),
        ({"slot": SlotStatus("s", True, False, "reserved")}, "slot s is inactive"),
        ({"slot": SlotStatus("s", True, True, "lost")}, "slot s lost WAL"),
        ({"problems": ("the broker: KafkaException: down",)}, "cannot read the broker"),
        (
            {"stale_checkpoint": "checkpoint /ck/search: it is ahead. Start over: `rm -r`"},
            "search: checkpoint /ck/search: it is ahead. Start over: `rm -r`",
        ),
        (
            {
                "capture": CaptureStatus(
                    "embedded", "shop", None, offsets_file="o/shop.offsets", connector_file="c.json"
                ),
                "slot": SlotStatus("s", exists=False),
            },
            "the capture's stored offsets (o/shop.offsets) belong to replication slot s, which "
            "does not exist (database re-created, or slot dropped): start over with "
            "`cdc-sync capture --connector c.json --reset`",
        ),
    ],
)
def test_stopped_names_the_reason(changes: dict[str, object], expected: str) -> None:
    health, reasons = verdict_of(snapshot(**changes))
    assert health is Health.STOPPED
    assert expected in reasons


def test_records_waiting_too_long_is_lagging() -> None:
    partition = PartitionStatus("cdc.shop.customers", 0, 140, 0, 130, int((NOW - 45) * 1000))
    health, reasons = verdict_of(snapshot(partitions=(partition,)), max_lag_seconds=30)
    assert health is Health.LAGGING
    assert "search: a record has waited 45 s on cdc.shop.customers[0] (over 30 s)" in reasons
    assert verdict_of(snapshot(partitions=(partition,)), max_lag_seconds=60)[0] is Health.HEALTHY


def test_too_many_records_waiting_is_lagging() -> None:
    partition = PartitionStatus("t", 0, 20_000, 0, 5_000, int(NOW * 1000))
    health, reasons = verdict_of(snapshot(partitions=(partition,)), max_lag_records=10_000)
    assert (health, reasons) == (Health.LAGGING, "search: 15000 records wait (over 10000)")


def test_a_sink_being_retried_is_lagging() -> None:
    waiting = job(sink_health={"search": {"state": "waiting", "error_class": "X", "failures": 3}})
    health, reasons = verdict_of(snapshot(job=waiting))
    assert (health, reasons) == (
        Health.LAGGING,
        "search: sink search is being retried (X, 3 failed attempt(s))",
    )


def test_a_slot_near_max_slot_wal_keep_size_is_lagging() -> None:
    slot = SlotStatus("s", True, True, "extended", 900 << 20, 0, 1 << 30)
    health, reasons = verdict_of(snapshot(slot=slot), max_slot_fraction=0.8)
    assert health is Health.LAGGING
    assert "retains 88% of max_slot_wal_keep_size" in reasons


def test_stopped_wins_over_lagging_and_keeps_both_reasons() -> None:
    partition = PartitionStatus("t", 0, 200, 0, 100, int((NOW - 100) * 1000))
    s = snapshot(partitions=(partition,), job=job(state="stopped", alive_at=NOW - 100))
    health, reasons = verdict_of(s)
    assert health is Health.STOPPED
    assert "search: stopped" in reasons and "a record has waited 100 s" in reasons


def test_waiting_counts_from_the_low_watermark_before_the_first_commit() -> None:
    assert PartitionStatus("t", 0, 50, 10, None).waiting == 40
    assert PartitionStatus("t", 0, 50, 10, 5).waiting == 40  # retention removed 5..9
    assert PartitionStatus("t", 0, 50, 0, 50).waiting == 0


def test_screen_shows_every_part_and_json_says_the_same() -> None:
    marks = job(tables={"shop.customers": _mark(NOW - 5)})
    s = snapshot(job=marks, watermarks=tuple(StatusFileWatermarks(marks).watermarks()))
    verdict = judge(s, Thresholds())
    screen = render(s, verdict)
    assert screen.splitlines()[1] == "verdict: HEALTHY: caught up"
    for expected in (
        "connector shop on Kafka Connect: RUNNING; task 0 RUNNING",
        "shop_slot active, wal reserved, retains 10.0 MB of 1.0 GB (1%)",
        "0 record(s) on cdc.dead_letter",
        "search  shop.customers",
        "redis   shop.customers",
        "0/1A2B3C",
    ):
        assert expected in screen
    assert max(len(line) for line in screen.splitlines()) <= 120
    document = json.loads(json.dumps(to_json(s, verdict)))
    assert document["verdict"] == {"health": "healthy", "reasons": ["caught up"]}
    [consumer] = document["consumers"]
    assert consumer["partitions"][0]["waiting"] == 0
    assert {w["sink"] for w in consumer["watermarks"]} == {"search", "redis"}


def test_each_consumer_is_judged_and_shown_on_its_own() -> None:
    """Invariant 8: one consumer of the log behind (a stalled search server) leaves the others
    current; the verdict names the one behind, the screen shows each one's records waiting."""
    behind = PartitionStatus("cdc.shop.customers", 0, 200, 0, 130, int((NOW - 90) * 1000))
    search = ConsumerSnapshot("search", "/ck/search", job(), (behind,))
    current = PartitionStatus("cdc.shop.customers", 0, 200, 0, 200)
    redis_job = job(sink_health={"redis": {"state": "ok"}})
    redis = ConsumerSnapshot("redis", "/ck/redis", redis_job, (current,))
    s = snapshot(consumers=(search, redis))
    verdict = judge(s, Thresholds(max_lag_seconds=30))
    assert verdict.health is Health.LAGGING
    assert verdict.reasons == (
        "search: a record has waited 90 s on cdc.shop.customers[0] (over 30 s)",
    )
    assert s.waiting == 70  # the slowest consumer's
    screen = render(s, verdict).splitlines()
    header = next(line for line in screen if line.startswith("topic"))
    assert header.split()[-3:] == ["search", "redis", "oldest"]
    row = next(line for line in screen if line.startswith("cdc.shop.customers"))
    assert row.split()[2:] == ["200", "70", "0", "90", "s"]


def test_versions_render_as_lsns() -> None:
    assert lsn(0x1_0000_00FF) == "1/FF"
    assert lsn(None) == lsn(-1) == "-"


def _mark(source_seconds: float) -> object:
    from cdc_sync.job.observe.status_file import TableMark

    return TableMark(0x1A2B3C, int(source_seconds * 1000), NOW - 3)


def _metrics(batch_id: int, version: int, source_ts_ms: int) -> BatchMetrics:
    metrics = BatchMetrics(batch_id, records=3, changes=3, compacted=2)
    metrics.tables[CUSTOMERS] = TableProgress(2, version, source_ts_ms)
    metrics.sinks["search"] = WriteResult(applied=2)
    metrics.offsets[("cdc.shop.customers", 0)] = 41
    metrics.stages.update({"decode": 1.0, "fold": 0.5, "search": 0.1})
    metrics.seconds = 0.2
    return metrics


def test_recorder_writes_marks_batches_and_health_and_keeps_marks_across_restarts(
    tmp_path: Path,
) -> None:
    health = SinkHealth(["search"])
    recorder = StatusRecorder(tmp_path, "shop", {"search": [CUSTOMERS]}, health)
    recorder(_metrics(0, version=100, source_ts_ms=5_000))
    recorder(_metrics(1, version=90, source_ts_ms=4_000))  # older: the mark stays
    health.waiting("search", "bulk", NOW, TimeoutError())
    recorder.beat()
    status = read_status(tmp_path)
    assert status is not None and status.state == "running"
    assert status.tables["shop.customers"].version == 100
    assert status.tables["shop.customers"].source_ts_ms == 5_000
    assert status.last_batch is not None and status.last_batch.batch_id == 1
    assert status.last_batch.seconds == pytest.approx(1.7)
    assert status.last_batch.offsets == {"cdc.shop.customers": {"0": 41}}
    assert status.sink_health["search"]["state"] == "waiting"
    recorder.close()
    stopped = read_status(tmp_path)
    assert stopped is not None and stopped.state == "stopped"

    again = StatusRecorder(tmp_path, "shop", {"search": [CUSTOMERS]})
    restarted = read_status(tmp_path)
    assert restarted is not None and restarted.state == "running"
    assert restarted.tables["shop.customers"].version == 100
    assert not list(tmp_path.glob("*.tmp"))  # replaced atomically, no leftovers
    again.close()


def test_recorder_notices_the_query_ending(tmp_path: Path) -> None:
    recorder = StatusRecorder(tmp_path, "shop", {}, heartbeat_seconds=0.05)
    recorder.start_heartbeat(lambda: ("failed", "StreamingQueryException: boom"))
    recorder.close()
    status = read_status(tmp_path)
    assert status is not None and (status.state, status.error) == (
        "failed",
        "StreamingQueryException: boom",
    )


def test_unreadable_status_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "cdc_sync_status.json").write_text("{")
    with pytest.raises(ValueError, match=r"cdc_sync_status\.json: unreadable job status"):
        read_status(tmp_path)


def _offset_entry(offsets: dict[str, dict[str, int]]) -> str:
    return "v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps(offsets)


def test_checkpoint_reader_takes_the_newest_committed_batch(tmp_path: Path) -> None:
    assert processed_offsets(tmp_path) is None
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    (tmp_path / "offsets" / "0").write_text(_offset_entry({"t": {"0": 10}}))
    (tmp_path / "offsets" / "1").write_text(_offset_entry({"t": {"0": 20, "1": 5}}))
    (tmp_path / "offsets" / ".1.crc").write_text("x")
    (tmp_path / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    processed = processed_offsets(tmp_path)
    assert processed is not None
    assert (processed.batch_id, processed.offsets) == (0, {("t", 0): 10})  # 1 planned only
    (tmp_path / "commits" / "1").write_text('v1\n{"nextBatchWatermarkMs":0}')
    processed = processed_offsets(tmp_path)
    assert processed is not None and processed.offsets == {("t", 0): 20, ("t", 1): 5}


def test_checkpoint_reader_rejects_a_foreign_file(tmp_path: Path) -> None:
    for folder in ("offsets", "commits"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "0").write_text("garbage")
    with pytest.raises(ValueError, match="not a Spark offset log entry"):
        processed_offsets(tmp_path)


def test_table_progress_keeps_the_newest_commit_time_past_a_change_without_one() -> None:
    from cdc_sync.core.model import Change, Coordinates, Op

    def change(version: int, ts: int | None) -> Change:
        return Change(CUSTOMERS, (("id", 1),), Op.DELETE, version, None, Coordinates("t", 0, 0), ts)

    progress = TableProgress().add(change(5, 1_000)).add(change(6, None))  # a tombstone delete
    assert (progress.max_version, progress.max_source_ts_ms) == (6, 1_000)
    assert TableProgress().add(change(1, None)).max_source_ts_ms is None


def test_recorder_follows_a_restarted_query(tmp_path: Path) -> None:
    import time

    recorder = StatusRecorder(tmp_path, "shop", {}, heartbeat_seconds=0.05)
    recorder.start_heartbeat(lambda: ("stopped", None))  # e.g. an availableNow drain ended
    time.sleep(0.5)
    first = read_status(tmp_path)
    assert first is not None and first.state == "stopped"
    recorder.start_heartbeat(lambda: ("running", None))
    time.sleep(0.2)
    again = read_status(tmp_path)
    assert again is not None and again.state == "running"
    recorder.close()
    closed = read_status(tmp_path)
    assert closed is not None and closed.state == "stopped"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_killed_job_is_not_shown_running() -> None:
    here = socket.gethostname()
    killed = job(pid=_dead_pid(), host=here, alive_at=NOW - 5)  # fresh: not yet stale
    alive = job_alive(killed)
    assert alive is False
    s = snapshot(job=killed, job_alive=alive)
    verdict = judge(s, Thresholds())
    assert verdict.health is Health.STOPPED
    assert f"the job's process (pid {killed.pid}) is gone" in verdict.reasons[0]
    line = next(line for line in render(s, verdict).splitlines() if line.startswith("  job "))
    assert "running," not in line
    assert line.startswith("  job     not running (its process is gone")


def test_the_job_process_is_alive_only_when_it_is_the_job() -> None:
    here = socket.gethostname()
    started = process_start(os.getpid())
    assert started is not None and abs(started - time.time()) < 3600
    assert job_alive(job(pid=os.getpid(), host=here, started_at=time.time())) is True
    # This pid, but a job that started before this process did: a reused pid, not the job.
    assert job_alive(job(pid=os.getpid(), host=here, started_at=started - 60)) is False
    assert job_alive(job(pid=os.getpid(), host=f"not-{here}")) is None  # cannot tell
