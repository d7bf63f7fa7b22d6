"""The end-to-end benchmark's comparisons: flat freshness beside a document fan-out (issue 26),
freshness against the size of the tables on both brokers (issue 28), the options that size a
run, and the printed page with every section."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cdc_sync.core.settings import Connections
from cdc_sync.mapping import load_mapping
from tests.adversarial.child import ChildProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_e2e
from e2ebench.fanout import compare, fanout_target
from e2ebench.growth import growth, render_growth
from e2ebench.pipeline import SinkCounter
from e2ebench.printout import render
from e2ebench.report import targets

pytestmark = pytest.mark.unit


def latency(p50: float, p99: float) -> dict[str, Any]:
    cuts = {"p50": p50, "p95": p99, "p99": p99, "max": p99}
    return {"probes": 40, "unresolved": 0, **{s: cuts for s in ("search", "redis", "delta", "all")}}


def consumer(**means: float) -> dict[str, Any]:
    return {"batches": 20, "records_per_batch": 12.0, "max_records": 40,
            "interval_mean_seconds": 0.5, "stage_mean_seconds": means,
            "stage_median_seconds": means, "stage_max_seconds": means}  # fmt: skip


def step(rate: float, p50: float, p99: float, **extra: Any) -> dict[str, Any]:
    return {
        "target_rate": rate, "achieved_rate": rate, "drains": True, "drained_in_seconds": 1.0,
        "latency": latency(p50, p99), "job_cpu_percent": 40.0, "job_rss_mb": {"max": 1200},
        "service_cpu_percent": {"search": 20.0},
        "stages": {"search": consumer(spark=0.2, spark_plan=0.05, decode=0.1, search=0.05)},
    } | extra  # fmt: skip


def fanned(rate: float, p50: float, p99: float) -> dict[str, Any]:
    documents = consumer(decode=0.1, documents=8.0) | {"documents": 30000, "batches": 3}
    found = step(rate, p50, p99, fanout={
        "roots": 10000, "renames": 60, "interval_seconds": 1.0, "settle_timeout": 900.0,
        "settled_seconds": 12.0, "behind": 0,
    })  # fmt: skip
    found["stages"]["documents:shop_order_documents"] = documents
    return found


def test_the_fanout_comparison_pairs_each_step_with_the_same_rate_without_it() -> None:
    plain = [step(20, 0.40, 0.80), step(100, 0.50, 1.00), step(300, 1.0, 2.0)]
    with_fanout = [fanned(20, 0.45, 0.85), fanned(100, 1.00, 3.00)]

    pairs = compare(plain, with_fanout)

    assert [(p["rate"], p["sink"]) for p in pairs][:4] == [
        (20, "search"), (20, "redis"), (20, "delta"), (20, "all")
    ]  # fmt: skip
    at_20 = pairs[0]
    assert (at_20["p50_without"], at_20["p50_with"], at_20["p50_ratio"]) == (0.40, 0.45, 1.125)
    assert at_20["within_noise"]  # +0.05 s: below both the 1.25x and the +0.1 s allowance
    assert not pairs[4]["within_noise"]  # 100/s: p50 doubled
    target = fanout_target({"streaming": plain, "fanout_steps": with_fanout})
    assert target is not None and not target["met"]
    assert "20/100 changes/s" in target["target"] and "10,000-root" in target["target"]
    assert "100/s search p50 x2.00 p99 x3.00" in target["figure"]
    assert fanout_target({"streaming": plain, "fanout_steps": []}) is None


def run_result(
    broker: str, customers: int, latest: float, decode: float, plan: float = 0.1
) -> dict[str, Any]:
    means = {"latest_offset": latest, "spark": latest + plan, "spark_plan": plan, "decode": decode}
    stages = {"search": consumer(**means)}
    return {
        "options": {"broker": broker},
        "rows": {"shop.customers": customers, "shop.orders": 10 * customers},
        "streaming": [step(20, 0.4, 0.8, stages=stages), step(100, 0.5, 1.0, stages=stages)],
    }


def test_growth_names_the_parts_that_grow_with_the_log_per_broker() -> None:
    runs = [
        run_result("tansu", 5000, latest=0.03, decode=0.10),
        run_result("tansu", 50000, latest=0.30, decode=0.40),
        run_result("noida", 5000, latest=0.02, decode=0.10),
        run_result("noida", 50000, latest=0.02, decode=0.11),
    ]

    found = {g["broker"]: g for g in growth(runs)}

    assert found["tansu"]["rows"] == (55000, 550000)
    assert found["tansu"]["ratios"]["latest_offset"] == 10.0
    assert found["tansu"]["grows"] == ["latest_offset", "decode", "spark"]
    assert found["noida"]["grows"] == []
    text = render_growth(runs)
    assert "tansu   55,000 -> 550,000  search" in text
    assert growth(runs[:1]) == []  # one size: nothing to compare


def test_growth_is_held_against_the_machines_own_pace_between_runs() -> None:
    # The larger run met a machine twice as busy: Spark's planning, which asks nothing of the
    # broker, took twice as long too. Doubled reads are the machine's; a tenfold one is the log's.
    runs = [
        run_result("noida", 5000, latest=0.02, decode=0.10, plan=0.1),
        run_result("noida", 50000, latest=0.04, decode=1.00, plan=0.2),
    ]

    [found] = growth(runs)

    assert found["ratios"]["spark_plan"] == 2.0
    assert found["grows"] == ["decode"]


def test_a_run_is_sized_by_scale_and_growth_runs_flat_consumers_without_fanout() -> None:
    quick = bench_e2e.parse_args(["--quick"])
    assert (quick.customers, quick.orders, quick.fanout) == (500, 5000, 1000)
    assert quick.fanout_rates == [20.0, 100.0]
    scaled = bench_e2e.parse_args(["--scale", "10"])
    assert (scaled.customers, scaled.orders, scaled.fanout) == (50000, 500000, 10000)
    grows = bench_e2e.parse_args(["--growth"])
    assert (grows.customers, grows.orders, grows.scale) == (5000, 50000, 10.0)
    assert bench_e2e.scaled(grows, grows.scale) == (50000, 500000)
    assert (grows.fanout, grows.consumers) == (0, "search,redis,delta")


def test_the_page_prints_every_section_of_a_run() -> None:
    plain = [step(20, 0.40, 0.80), step(100, 0.50, 1.00)]
    result: dict[str, Any] = {
        "started": "now", "machine": "here", "rows": {"shop.orders": 60000},
        "options": {"rates": [20.0, 100.0]},
        "raw": {"rows_per_second": {"search": 3000.0, "redis": 90000.0, "delta": 900000.0},
                "search_updates_per_second": 300.0},
        "initial_sync": {"rows": 80000, "seconds": {"search": 70.0, "redis": 60.0, "delta": 65.0},
                         "rows_per_second": {"search": 1143.0, "redis": 1333.0, "delta": 1231.0},
                         "all_sinks_rows_per_second": 1143.0},
        "documents_build": {"index": "shop_order_documents", "documents": 60000,
                            "seconds": 240.0, "per_second": 250.0},
        "streaming": plain,
        "fanout_steps": [fanned(20, 0.45, 0.85), fanned(100, 0.55, 1.05)],
    }  # fmt: skip
    result["targets"] = targets(result)
    result["targets_issue_28"] = bench_e2e.clock_targets(result)
    result["targets_issue_26"] = [fanout_target(result)]

    text = render(result)

    for heading in (
        "all three  3000 (search)",
        "document index shop_order_documents: 60,000 documents built 240.0 s",
        "stage breakdown per step and consumer",
        "freshness floor per consumer",
        "flat freshness beside a document fan-out",
        "60 renames of a customer with 10,000 orders",
        "targets (issue 28, deliverable 2)",
        "targets (issue 26)",
    ):
        assert heading in text, heading
    rows = [line.split()[:2] for line in text.splitlines()]
    assert ["20+fan-out", "documents:shop_order_documents"] in rows  # its own stage row


class NoRows(SinkCounter):
    """Sinks that stay empty (no services)."""

    def __post_init__(self) -> None:
        pass

    def counts(self) -> dict[str, int]:
        return {"search": 0, "redis": 0, "delta": 0}


def test_the_initial_sync_wait_ends_when_the_job_exits(tmp_path: Path) -> None:
    # A job whose query failed at start (seen: "Python worker failed to connect back" on a
    # loaded machine) had the bench wait out the whole 30-minute timeout for rows that never came.
    job = ChildProcess(
        "sync job", [sys.executable, "-c", "print('gone'); exit(3)"], {}, tmp_path / "job.log"
    )
    job.start()
    assert job.process is not None
    job.process.wait(timeout=30)
    counter = NoRows(
        load_mapping(bench_e2e.MAPPING),
        Connections(None, None, "kafka", None, "opensearch", None, None, None),
    )
    started = time.monotonic()

    with pytest.raises(AssertionError, match="exited with 3"):
        counter.wait_all(10, timeout=60, started=started, job=job)

    assert time.monotonic() - started < 5
