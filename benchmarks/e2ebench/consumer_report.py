"""The printed tables per consumer of the log: each step's stage breakdown and freshness floor.

A step's `stages` (observe.stage_breakdown) hold one breakdown per consumer (search, redis,
delta, documents:<name>); each consumer is its own streaming query, so its batches, records per
batch, interval and stage seconds are its own.
"""

from __future__ import annotations

from typing import Any

from e2ebench.floors import FLAT_CONSUMERS, step_floors
from e2ebench.report import cell, table

# The order a batch runs its stages in: Spark's own (end offsets, then everything outside
# `foreachBatch`, planning and offset log among it), then the job's.
STAGE_ORDER = ("latest_offset", "spark", "spark_plan", "decode", "truncate", "write", "fill",
               "search", "redis", "delta", "documents", "dead_letter")  # fmt: skip


def step_label(step: dict[str, Any]) -> str:
    """A step's rate, marked when a document fan-out ran beside it (e2ebench.fanout)."""
    return f"{step['target_rate']:.0f}" + ("+fan-out" if step.get("fanout") else "")


def stage_names(steps: list[dict[str, Any]]) -> list[str]:
    """Every stage some consumer ran in some step, in a batch's order (unknown ones last)."""
    found = {
        name
        for s in steps
        for breakdown in s.get("stages", {}).values()
        for name in breakdown.get("stage_mean_seconds", {})
    }
    known = [name for name in STAGE_ORDER if name in found]
    return known + sorted(found - set(known))


def stage_lines(steps: list[dict[str, Any]]) -> list[str]:
    names = stage_names(steps)
    rows = []
    for s in steps:
        for consumer, st in s.get("stages", {}).items():
            rows.append(
                [
                    step_label(s),
                    consumer,
                    str(st["batches"]),
                    f"{st['records_per_batch']:.0f}",
                    cell(st["interval_mean_seconds"]),
                ]
                + [_stage_cell(st, name) for name in names]
            )
    return [
        "stage breakdown per step and consumer (mean seconds per batch that ran the stage; max "
        "in brackets; latest_offset, spark, spark_plan: Spark's own, from its progress line)",
        *table(["rate", "consumer", "batches", "records/batch", "interval", *names], rows),
    ]


def _stage_cell(breakdown: dict[str, Any], name: str) -> str:
    if name not in breakdown["stage_mean_seconds"]:
        return "-"  # a stage this consumer's batches did not run in the step
    return (
        f"{breakdown['stage_mean_seconds'][name]:.2f} ({breakdown['stage_max_seconds'][name]:.2f})"
    )


def floor_lines(steps: list[dict[str, Any]]) -> list[str]:
    rows = []
    for s in steps:
        for consumer, floor in step_floors(s.get("stages", {})).items():
            measured = s["latency"].get(consumer) if consumer in FLAT_CONSUMERS else None
            rows.append(
                [
                    step_label(s),
                    consumer,
                    cell(floor["spark_seconds"]),
                    cell(floor["plan_seconds"]),
                    cell(floor["write_seconds"]),
                    cell(floor["p50_floor_seconds"]),
                    cell(floor["p99_floor_seconds"]),
                    "-" if measured is None else f"{cell(measured['p50'])}/{cell(measured['p99'])}",
                ]
            )
    if not rows:
        return []
    return [
        "freshness floor per consumer: q x (spark + write) + spark_plan + write, medians of the "
        "step's batches (e2ebench/floors.py)",
        *table(
            ["rate", "consumer", "spark", "spark_plan", "write", "p50 floor", "p99 floor",
             "measured p50/p99"],
            rows,
        ),
    ]  # fmt: skip
