"""The targets of issue 9 beside the figures, the bounds a run's figures prove, and the helpers
of the printed tables (e2ebench.printout prints the page)."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from e2ebench.floors import all_sinks_floor

SINKS = ("search", "redis", "delta")


RESULTS = Path(__file__).resolve().parents[1] / "results"


def output_path(given: str | Path | None, kind: str) -> Path:
    """Where a run's JSON goes: `given` (its --output), else benchmarks/results/<kind>-<date>.json;
    the folder made."""
    output = Path(given) if given else RESULTS / f"{kind}-{datetime.now(UTC):%Y-%m-%d-%H%M}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    return output


def run_header(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON's first keys: when, on what machine (and its load), with which options."""
    return {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "cores": os.cpu_count(),
        "options": {k: v for k, v in vars(args).items() if k not in ("output", "tune")},
    }


# The soak's RSS is compared after this warm-up: the step before it may leave Spark's Python
# workers (spawned for large batches) alive, and they exit once idle, which is no drift.
RSS_WARM_UP_SAMPLES = 4  # of the 30-second samples: two minutes
RSS_WINDOW_SAMPLES = 10  # medians over five minutes at either end


def rss_drift(step: dict[str, Any]) -> dict[str, Any]:
    """Median RSS of the first and of the last five minutes after the warm-up, and the drift."""
    samples = step["job_rss_mb"]["every_30_s"][RSS_WARM_UP_SAMPLES:]
    if len(samples) < 2 * RSS_WINDOW_SAMPLES:  # a short soak: its first and last samples
        samples = step["job_rss_mb"]["every_30_s"] or [step["job_rss_mb"]["first"]]
        first, last = samples[0], step["job_rss_mb"]["last"]
    else:
        first = statistics.median(samples[:RSS_WINDOW_SAMPLES])
        last = statistics.median(samples[-RSS_WINDOW_SAMPLES:])
    return {
        "first_mb": round(first),
        "last_mb": round(last),
        "drift_percent": round(100 * (last - first) / first, 1),
    }


def cpu_budget(
    initial: dict[str, Any], target_rate: float, raw_search_cpu: float | None = None
) -> dict[str, Any]:
    """What the initial sync's CPU says about its bound. Every part of the pipeline shares the
    machine's cores: the sync cannot end before their CPU seconds, spread over every core,
    have run (`floor`), nor, with a job costing nothing, before the rest of the pipeline's
    (`floor_without_job`). Where that exceeds the target's time, no job can meet the target on
    this machine; otherwise `job_budget` is the CPU the job may spend to meet it.
    `raw_search_cpu`: what the same rows cost the search server in the raw bulk; the search
    server is counted at that cost where the sync cost it more (the job's writes may be what
    makes it dearer), so the bound holds for any job."""
    cpu = whole_processes(initial["cpu_seconds"])
    cores = initial["cores"]
    wall = max(initial["seconds"].values())
    total = sum(cpu.values())
    target_seconds = initial["rows"] / target_rate
    if raw_search_cpu is not None and "search" in cpu:
        cpu["search"] = min(cpu["search"], raw_search_cpu * initial["rows"] / initial["raw_rows"])
    without_job = sum(cpu.values()) - cpu["job"]
    budget = cores * target_seconds - without_job
    jvm = initial["cpu_seconds"].get("job: spark jvm")
    if budget < 0:
        verdict = "no job can meet it here: the rest of the pipeline alone needs longer"
    elif jvm is not None and jvm > budget:
        verdict = f"no Spark job can meet it here: Spark's JVM alone spent {jvm:.1f} CPU s"
    else:
        verdict = "within reach: the job's CPU is what to cut"
    return {
        "verdict": verdict,
        "busy_percent": round(100 * total / (cores * wall), 1),
        "floor_seconds": round(total / cores, 1),
        "floor_without_job_seconds": round(without_job / cores, 1),
        "target_seconds": round(target_seconds, 1),
        "job_budget_cpu_seconds": round(budget, 1),
    }


def whole_processes(cpu_seconds: dict[str, float]) -> dict[str, float]:
    """A run's CPU seconds per process, without the job's parts ("job: spark jvm", ...), which
    its "job" figure holds already."""
    return {name: value for name, value in cpu_seconds.items() if not name.startswith("job: ")}


def _drain_target(
    result: dict[str, Any], steps: list[dict[str, Any]], ceiling: float, ceiling_name: str
) -> dict[str, Any]:
    draining = [s for s in steps if s["drains"]]
    best = max(draining, key=lambda s: s["achieved_rate"]) if draining else None
    p99 = best["latency"]["all"]["p99"] if best is not None else None
    target = {
        "target": f"highest rate that drains >= 0.5 x slowest raw ({ceiling_name} "
        f"{ceiling:.1f}/s), p99 <= 3 s there",
        "figure": (
            f"{best['achieved_rate']:.0f} changes/s = {best['achieved_rate'] / ceiling:.2f} x, "
            f"p99 {seconds_text(p99)} s"
            if best is not None
            else "no step drained"
        ),
        "met": best is not None and best["achieved_rate"] >= 0.5 * ceiling
        and p99 is not None and p99 <= 3.0,
    }  # fmt: skip
    stalls = stall_wait(result["raw"], 3.0)
    if stalls:
        target["bound"] = {"verdict": stalls.removeprefix("; ")}
    return target


def stall_wait(raw: dict[str, Any], p99_target: float) -> str:
    """A clause saying the search server's own re-index stalls exceed a p99 target, if so."""
    wait = raw.get("search_update_bulks", {}).get("p99_wait_seconds")
    if wait is None or wait <= p99_target:
        return ""
    return (
        f"; the search server alone, kept busy re-indexing with nothing else running, makes 1% "
        f"of writes wait >= {wait:.2f} s"
    )


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """cdc-sync's figure over another system's (None where either is missing or theirs is 0)."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return round(ours / theirs, 3)


def cell(value: Any) -> str:
    """A figure for a table: 3 significant digits or so, lists joined by '/', '-' for none."""
    if value is None:
        return "-"
    if isinstance(value, list):
        return "/".join(cell(v) for v in value)
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f}"


def seconds_text(value: float | None) -> str:
    """Seconds with two decimals, "-" for none."""
    return "-" if value is None else f"{value:.2f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell, a dashed rule under the header."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))  # noqa: E731
    return [line(header), "  ".join("-" * w for w in widths), *map(line, rows)]


def streaming_ceiling(raw: dict[str, Any]) -> tuple[float, str]:
    """The slowest raw rate a stream meets, and its name. A stream is mostly updates and
    deletes: where the search server re-indexes an existing document slower than any sink
    takes a new row, that is the slowest rate for streaming."""
    rates = raw["rows_per_second"]
    slowest_sink = min(rates, key=rates.get)
    updates = raw["search_updates_per_second"]
    if updates < rates[slowest_sink]:
        return updates, "search re-index"
    return rates[slowest_sink], slowest_sink


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 9, item 4: each target with the figure measured and whether it is met."""
    raw = result["raw"]["rows_per_second"]
    slowest_sink = min(raw, key=raw.get)
    slowest = raw[slowest_sink]
    found: list[dict[str, Any]] = []
    initial = result.get("initial_sync")
    if initial:
        rate = initial["all_sinks_rows_per_second"]
        found.append({
            "target": f"initial sync >= 0.8 x slowest raw ({slowest_sink} {slowest:.0f} rows/s)",
            "figure": f"{rate:.0f} rows/s = {rate / slowest:.2f} x",
            "met": rate >= 0.8 * slowest,
        })  # fmt: skip
        if "cpu_seconds" in initial:
            raw_search_cpu = result["raw"].get("search_cpu_seconds")
            found[-1]["bound"] = cpu_budget(
                initial | {"raw_rows": result["raw"].get("rows", initial["rows"])},
                0.8 * slowest,
                raw_search_cpu,
            )
    steps = result.get("streaming", [])
    ceiling, ceiling_name = streaming_ceiling(result["raw"])
    at_100 = next((s for s in steps if s["target_rate"] == 100), None)
    if at_100 is None and ceiling < 100:
        found.append({
            "target": "100 changes/s: all sinks p50 <= 0.5 s, p99 <= 1.5 s",
            "figure": "not run: a slower step did not drain" if steps else "not run",
            "met": False,
            "bound": {"verdict": f"the {ceiling_name} rate, {ceiling:.1f}/s, is below 100 "
                      "changes/s (a stream is mostly updates): no job keeps up here"},
        })  # fmt: skip
    if at_100:
        lat = at_100["latency"]["all"]
        found.append({
            "target": "100 changes/s: all sinks p50 <= 0.5 s, p99 <= 1.5 s",
            "figure": f"p50 {seconds_text(lat['p50'])} s, p99 {seconds_text(lat['p99'])} s",
            "met": lat["p50"] is not None and lat["p50"] <= 0.5 and lat["p99"] <= 1.5,
        })  # fmt: skip
        floor = all_sinks_floor(at_100.get("stages", {}))
        stalls = stall_wait(result["raw"], 1.5)
        if floor is not None:
            found[-1]["bound"] = floor | {"verdict": floor["verdict"] + stalls}
        elif stalls:
            found[-1]["bound"] = {"verdict": stalls.removeprefix("; ")}
    if steps:  # the drain target needs a ladder (not run with --rates none)
        found.append(_drain_target(result, steps, ceiling, ceiling_name))
    soak = result.get("rss_soak")
    if soak:
        found.append({
            "target": "job RSS flat (+-10%) at 100 changes/s",
            "figure": f"{soak['first_mb']} -> {soak['last_mb']} MB over {soak['minutes']} min "
            f"({soak['drift_percent']:+.1f}%; medians of the first and last 5 min after 2)",
            "met": abs(soak["drift_percent"]) <= 10,
        })  # fmt: skip
    return found
