"""Freshness against the size of the tables (issue 28): the same ladder at several sizes and on
both broker stand-ins, side by side, and which part of a batch grows with the log.

What asks the broker is what may grow: the end offsets Spark reads each trigger
(`latest_offset`, the source's `latestOffset` in Spark's progress line) and the reads of each
batch's ranges (inside `decode`). The Tansu stand-in answers offset requests and reads by
scanning the partition's log; noida-db does not (docs/performance.md). Runs one after the other
do not share the machine's load, so each part is held against a control that asks nothing of
the broker (CONTROL: Spark's planning and offset log, `spark_plan`): a part whose seconds at
the largest size, over its seconds at the smallest on the same broker, are GROWS times the
control's ratio or more grows with the log.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from e2ebench.floors import FLAT_CONSUMERS
from e2ebench.report import cell, ratio, table

PARTS = ("latest_offset", "decode", "spark")  # mean seconds a batch (observe.stage_breakdown)
CONTROL = "spark_plan"  # Spark's planning and offset log: local work, the machine's own pace
GROWS = 1.5


def total_rows(result: dict[str, Any]) -> int:
    return sum(result["rows"].values())


def broker(result: dict[str, Any]) -> str:
    return str(result.get("options", {}).get("broker", "tansu"))


def step_figures(step: dict[str, Any], consumer: str) -> dict[str, float | None] | None:
    """A consumer's mean seconds per part, and its sink's p50/p99, in one step."""
    breakdown = step.get("stages", {}).get(consumer)
    if not breakdown:
        return None
    means = breakdown["stage_mean_seconds"]
    found: dict[str, float | None] = {part: means.get(part) for part in (*PARTS, CONTROL)}
    found["interval"] = breakdown.get("interval_mean_seconds")
    latency = step["latency"].get(consumer) if consumer in FLAT_CONSUMERS else None
    found["p50"] = latency["p50"] if latency else None
    found["p99"] = latency["p99"] if latency else None
    return found


def _figures(result: dict[str, Any]) -> dict[tuple[float, str], dict[str, float | None]]:
    """(rate, consumer) -> figures, for every step of the run's ladder."""
    found = {}
    for step in result.get("streaming", []):
        for consumer in step.get("stages", {}):
            figures = step_figures(step, consumer)
            if figures is not None:
                found[(step["target_rate"], consumer)] = figures
    return found


def growth(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per broker and consumer, each part's seconds at the largest size over the smallest
    (sums over the rates both ladders ran), where a broker has runs of two sizes."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        runs[broker(result)].append(result)
    found = []
    for name, same_broker in sorted(runs.items()):
        small, large = min(same_broker, key=total_rows), max(same_broker, key=total_rows)
        if total_rows(large) == total_rows(small):
            continue
        a, b = _figures(small), _figures(large)
        consumers = sorted({consumer for _, consumer in a.keys() & b.keys()})
        for consumer in consumers:
            keys = [k for k in a.keys() & b.keys() if k[1] == consumer]
            ratios = {
                part: ratio(_sum(b, keys, part), _sum(a, keys, part))
                for part in (*PARTS, CONTROL, "p50", "p99")
            }
            pace = ratios[CONTROL] or 1.0
            found.append({
                "broker": name,
                "consumer": consumer,
                "rows": (total_rows(small), total_rows(large)),
                "rates": sorted(rate for rate, _ in keys),
                "ratios": ratios,
                "grows": [p for p in PARTS if (ratios[p] or 0) >= GROWS * pace],
            })  # fmt: skip
    return found


def _sum(figures: dict[Any, dict[str, float | None]], keys: list[Any], part: str) -> float | None:
    values = [figures[k][part] for k in keys]
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def render_growth(results: list[dict[str, Any]]) -> str:
    ordered = sorted(results, key=lambda r: (broker(r), total_rows(r)))
    rows = []
    for result in ordered:
        for (rate, consumer), f in sorted(_figures(result).items()):
            rows.append(
                [broker(result), f"{total_rows(result):,}", f"{rate:.0f}", consumer]
                + [cell(f[part]) for part in (*PARTS, "interval")]
                + [f"{cell(f['p50'])}/{cell(f['p99'])}"]
            )
    lines = [
        "freshness against the size of the tables: per batch, mean seconds (latest_offset: "
        "Spark's end-offset read; decode: the batch's reads from the broker and decoding)",
        *table(
            ["broker", "rows", "rate", "consumer", *PARTS, "interval", "p50/p99 s"],
            rows,
        ),
    ]
    found = growth(results)
    if found:
        lines += [
            "",
            "growth, largest / smallest size on one broker (sums over the rates both ran; "
            f"{CONTROL}: the control, which asks nothing of the broker; a part grows with the log "
            f"at {GROWS}x the control's ratio or more)",
            *table(
                ["broker", "rows", "consumer", *PARTS, CONTROL, "p50", "p99", "grows with the log"],
                [
                    [g["broker"], f"{g['rows'][0]:,} -> {g['rows'][1]:,}", g["consumer"]]
                    + [cell(g["ratios"][part]) for part in (*PARTS, CONTROL, "p50", "p99")]
                    + [", ".join(g["grows"]) or "-"]
                    for g in found
                ],
            ),
        ]
    return "\n".join(lines)
