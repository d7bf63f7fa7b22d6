"""The end-to-end benchmark's pure parts: it reads the job's per-batch log line (so a change to
`BatchMetrics.summary()` must keep the benchmark's stage breakdown working), percentiles, and
the issue-9 targets it prints."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cdc_sync.job.observe.query_progress import progress_line
from cdc_sync.job.settle.applier import BatchMetrics
from cdc_sync.sinks.base import WriteResult

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from e2ebench.ladder import rate_ladder
from e2ebench.observe import CpuTracker, batch_lines, process_tree, stage_breakdown, tree_usage
from e2ebench.raw import wait_quantile
from e2ebench.report import freshness_floor, render, rss_drift, targets
from e2ebench.sampler import percentiles

pytestmark = pytest.mark.unit


def job_log_line(metrics: BatchMetrics) -> str:
    """The line as `cdc-sync run` logs it (cdc_sync.cli's format)."""
    record = logging.LogRecord(
        "cdc_sync.job.settle.applier", logging.INFO, __file__, 1, "%s", (metrics.summary(),), None
    )
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    return formatter.format(record)


def test_batch_line_of_the_job_log_is_parsed_with_every_stage(tmp_path: Path) -> None:
    metrics = BatchMetrics(7, records=180, changes=170, compacted=160, seconds=1.25)
    metrics.sinks["search"] = WriteResult(applied=150, fenced=10)
    metrics.stages.update({"decode": 0.4, "fold": 0.3, "fill": 0.02, "search": 0.5})
    log = tmp_path / "job.log"
    log.write_text(f"noise\n{job_log_line(metrics)}\nmore noise\n")

    [line] = batch_lines(log)

    assert (line.batch, line.records, line.applier_seconds) == (7, 180, 1.25)
    assert line.stages == {"decode": 0.4, "fold": 0.3, "fill": 0.02, "search": 0.5}
    assert abs(line.logged_at - time.time()) < 60


def test_stage_breakdown_averages_the_batches_of_a_window(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    lines = []
    for batch, search in ((1, 1.0), (2, 3.0)):
        metrics = BatchMetrics(batch, records=100 * batch, seconds=search)
        metrics.stages.update({"decode": 0.5, "search": search})
        lines.append(job_log_line(metrics))
    log.write_text("\n".join(lines) + "\n")

    breakdown = stage_breakdown(batch_lines(log), time.time() - 60, time.time() + 60)

    assert breakdown["batches"] == 2
    assert breakdown["records_per_batch"] == 150
    assert breakdown["stage_mean_seconds"] == {"decode": 0.5, "search": 2.0}
    assert breakdown["stage_max_seconds"]["search"] == 3.0
    assert stage_breakdown(batch_lines(log), 0, 1) == {"batches": 0}


def test_percentiles() -> None:
    values = [i / 100 for i in range(1, 101)]
    found = percentiles(values)
    assert found["p50"] == pytest.approx(0.505)
    assert found["p99"] == pytest.approx(0.9901)
    assert found["max"] == 1.0
    assert percentiles([])["p50"] is None


def raw_rates(
    search: float, redis: float, delta: float, updates: float, **measured: Any
) -> dict[str, Any]:
    """A run's raw figures: each sink's insert rate, the search re-index rate, and more."""
    rows = {"search": search, "redis": redis, "delta": delta}
    return {"rows_per_second": rows, "search_updates_per_second": updates, **measured}


def target(result: dict[str, Any], first_word: str) -> dict[str, Any]:
    """The issue-9 target of `result` whose text starts with `first_word`."""
    return next(t for t in targets(result) if t["target"].split(" ")[0] == first_word)


def step(rate: float, p50: float, p99: float, drains: bool) -> dict[str, object]:
    latency = {"p50": p50, "p95": p99, "p99": p99, "max": p99}
    return {"target_rate": rate, "achieved_rate": rate, "drains": drains,
            "latency": {"all": latency}}  # fmt: skip


def test_targets_compare_with_the_slowest_raw_rate_of_the_same_run() -> None:
    result = {
        "raw": raw_rates(500.0, 20000.0, 60000.0, updates=800.0),
        "initial_sync": {"all_sinks_rows_per_second": 450.0},
        "streaming": [
            step(100, 0.3, 1.2, True),
            step(300, 0.8, 2.5, True),
            step(1000, 9.0, 30.0, False),
        ],
    }

    found = {t["target"].split(" ")[0]: t for t in targets(result)}

    assert found["initial"]["met"] and "0.90 x" in found["initial"]["figure"]
    assert found["100"]["met"]
    drain = found["highest"]
    assert drain["met"] and "300 changes/s = 0.60 x" in drain["figure"]


def test_a_stream_is_held_to_the_search_servers_reindex_rate_when_that_is_slowest() -> None:
    # Updates of existing documents are what a stream mostly is: where the server re-indexes
    # slower than any sink inserts, that rate is the ceiling the drain target compares with.
    result = {
        "raw": raw_rates(2000.0, 80000.0, 900000.0, updates=4.0),
        "streaming": [step(3, 0.9, 2.8, True), step(20, 17.0, 30.0, False)],
    }

    drain = target(result, "highest")

    assert "search re-index 4.0/s" in drain["target"]
    assert drain["met"] and "3 changes/s = 0.75 x" in drain["figure"]


def test_the_rss_drift_leaves_out_the_warm_up_and_compares_medians() -> None:
    # Python workers of the step before exit in the first minutes: no drift.
    settling = {"job_rss_mb": {"every_30_s": [3000, 2600, 2000] + [1400] * 57, "last": 1400}}
    assert rss_drift(settling) == {"first_mb": 1400, "last_mb": 1400, "drift_percent": 0.0}
    # A leak: RSS grows all along.
    growing = {"job_rss_mb": {"every_30_s": list(range(1400, 2000, 10)), "last": 1990}}
    assert rss_drift(growing)["drift_percent"] > 10


def test_the_initial_syncs_cpu_says_when_no_job_could_meet_the_target() -> None:
    # 11,000 rows; the target (0.8 x 1,000 rows/s) is 13.75 s, 27.5 CPU seconds on 2 cores.
    initial = {
        "rows": 11000,
        "cores": 2,
        "seconds": {"search": 20.0, "redis": 18.0, "delta": 21.0},
        "all_sinks_rows_per_second": 11000 / 21.0,
        "cpu_seconds": {
            "job": 12.0,
            "capture": 14.0,
            "search": 16.0,
            "tansu": 0.5,
            "job: spark jvm": 7.0,
            "job: python workers": 5.0,
        },
    }
    result = {
        "raw": raw_rates(1000.0, 30000.0, 50000.0, updates=900.0),
        "initial_sync": initial,
    }

    found = target(result, "initial")

    assert not found["met"]
    bound = found["bound"]
    assert bound["target_seconds"] == 13.8
    assert bound["busy_percent"] == 101.2  # 42.5 CPU s over 2 x 21 s
    assert bound["floor_seconds"] == 21.2
    # Without the job, capture and search alone need 30.5 CPU s: more than the target allows.
    assert bound["floor_without_job_seconds"] == 15.2
    assert bound["job_budget_cpu_seconds"] == -3.0
    assert bound["verdict"].startswith("no job can")
    # Where the raw bulk cost the search server less, that cost is what the bound counts.
    result["raw"]["search_cpu_seconds"] = 10.0
    result["raw"]["rows"] = 11000
    bound = target(result, "initial")["bound"]
    assert bound["floor_without_job_seconds"] == 12.2  # (14 + 10 + 0.5) / 2
    assert bound["job_budget_cpu_seconds"] == 3.0
    assert bound["verdict"].startswith("no Spark job")  # its JVM alone spent 7 CPU s


def test_sparks_phases_of_a_batch_and_the_freshness_floor_they_imply(tmp_path: Path) -> None:
    metrics = BatchMetrics(4, records=60, seconds=0.3)
    metrics.stages.update({"decode": 0.1, "delta": 0.2})
    progress = SimpleNamespace(
        batchId=4,
        durationMs={"triggerExecution": 600, "latestOffset": 80, "queryPlanning": 10,
                    "walCommit": 70, "addBatch": 350, "commitOffsets": 90},
    )  # fmt: skip
    spark = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(
        logging.LogRecord("cdc_sync.job.observe.query_progress", logging.INFO, __file__, 1, "%s",
                          (progress_line(progress),), None)
    )  # fmt: skip
    log = tmp_path / "job.log"
    log.write_text(f"{job_log_line(metrics)}\n{spark}\n")

    [line] = batch_lines(log)
    assert line.stages["spark"] == 0.25 and line.stages["spark_plan"] == 0.08

    stages = stage_breakdown([line], time.time() - 60, time.time() + 60)
    floor = freshness_floor(stages)
    assert floor is not None
    # A batch takes >= 0.25 + 0.2 s; a change waits half of one, then planning and Delta.
    assert floor["batch_floor_seconds"] == 0.45
    assert floor["p50_floor_seconds"] == 0.505  # 0.225 + 0.08 + 0.2
    result = {
        "raw": {"rows_per_second": {"search": 900.0}, "search_updates_per_second": 500.0},
        "streaming": [step(100, 0.7, 1.9, True) | {"stages": stages}],
    }
    at_100 = target(result, "100")
    assert not at_100["met"] and at_100["bound"] == floor


def test_the_ladder_tries_the_drain_target_and_100_per_s_is_bounded_by_a_slower_server() -> None:
    # 50,000 orders on the search stand-in: it re-indexes ~3 documents a second.
    assert rate_ladder([20, 100, 300], ceiling=3.4) == [2, 20, 100, 300]
    assert rate_ladder([20, 100], ceiling=500) == [20, 100]
    assert rate_ladder([], ceiling=3.4) == []
    result = {
        "raw": raw_rates(2000.0, 80000.0, 900000.0, updates=3.4),
        "streaming": [step(1, 0.9, 2.0, True), step(20, 30.0, 50.0, False)],
    }
    at_100 = target(result, "100")
    assert not at_100["met"] and "search re-index rate, 3.4/s" in at_100["bound"]["verdict"]


def test_the_search_servers_own_stalls_bound_the_p99_of_anything_it_writes() -> None:
    # 99 quick bulks and one 2.5 s stall: 1% of random moments wait more than ~2.45 s.
    bulks = [0.03] * 99 + [2.5]
    assert abs(wait_quantile(bulks) - (2.5 - 0.01 * sum(bulks))) < 1e-6
    assert wait_quantile([0.03] * 100) <= 0.03
    result = {
        "raw": raw_rates(
            900.0,
            9000.0,
            90000.0,
            updates=300.0,
            search_update_bulks={"p99_wait_seconds": wait_quantile(bulks)},
        ),
        "streaming": [step(100, 0.45, 2.6, True), step(160, 0.9, 3.4, True)],
    }
    found = {t["target"].split(" ")[0]: t for t in targets(result)}
    assert "wait >= 2.45 s" in found["100"]["bound"]["verdict"]
    assert "bound" not in found["highest"]  # 2.45 s does not explain a p99 over 3 s


PARENT_IGNORING_ITS_CHILDREN = """
import os, signal, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # exited children vanish: no cutime
if os.fork() == 0:
    while time.process_time() < 0.5:
        pass
    os._exit(0)
time.sleep(30)
"""


def test_the_cpu_of_a_worker_that_exited_unreaped_stays_counted(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT_IGNORING_ITS_CHILDREN)
    parent = subprocess.Popen([sys.executable, str(script)])
    try:
        tracker = CpuTracker(parent.pid)
        deadline = time.monotonic() + 20
        while len(process_tree(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        while len(process_tree(parent.pid)) == 2 and time.monotonic() < deadline:
            during = tracker.sample()
            time.sleep(0.05)
        assert during >= 0.3  # the child burnt CPU, and the tracker saw most of it
        assert tree_usage(parent.pid).cpu_seconds < 0.3  # live counters lost it
        assert tracker.sample() >= during
    finally:
        parent.kill()
        parent.wait()


def test_the_stage_table_shows_a_stage_that_only_some_steps_ran() -> None:
    # A TRUNCATE in the first step's window, none in the second's: the second's cell is "-".
    def stages(**means: float) -> dict[str, Any]:
        return {"batches": 3, "records_per_batch": 10.0, "interval_mean_seconds": 0.4,
                "stage_mean_seconds": means, "stage_max_seconds": means}  # fmt: skip

    result = {
        "started": "now",
        "machine": "here",
        "rows": {},
        "raw": raw_rates(900.0, 9000.0, 90000.0, updates=300.0),
        "streaming": [
            step(20, 0.4, 0.8, True) | {"stages": stages(decode=0.1, truncate=0.03)},
            step(100, 0.5, 0.9, True) | {"stages": stages(decode=0.2)},
        ],
    }
    for s in result["streaming"]:
        s |= {"job_cpu_percent": 10.0, "job_rss_mb": {"max": 900}, "service_cpu_percent": {}}
        s["latency"] |= {
            "probes": 40,
            **{k: s["latency"]["all"] for k in ("search", "redis", "delta")},
        }
    result["targets"] = targets(result)

    text = render(result)

    [row_100] = [line for line in text.splitlines() if line.startswith("100 ") and "0.20" in line]
    assert row_100.split()[-1] == "-"
