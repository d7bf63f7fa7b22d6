"""The freshness floor of each consumer of the log: what its fixed per-batch costs alone imply.

Each consumer (job.consumers: search, redis, delta, documents:<name>) runs its own streaming
query, so each has its own cycle. Its batches run back to back, and each takes at least Spark's
own seconds (`spark`: end offsets, planning, offset log, commit log, outside `foreachBatch`:
what a batch holding no record costs it) plus the consumer's write (its sink's stage; a
document consumer's `documents`), which every batch carrying a change pays whatever it holds.
A change reaches Kafka at a random moment of that cycle, waits for the next read of the end
offsets (a share q of the cycle at the q-quantile), then for the batch's planning and offset
log (`spark_plan`) and its write. Decoding, the TOAST fill and capture only add, so

    floor(q) = q * (spark + write) + spark_plan + write

is a lower bound of the q-quantile of commit -> visible in that consumer's sink. The stages
are the medians of the step's batches that ran them (a batch of heartbeats alone writes no
sink), so one long stall does not raise the floor.
"""

from __future__ import annotations

from typing import Any

FLAT_CONSUMERS = ("search", "redis", "delta")  # the sinks' consumers: stage name = consumer name
DOCUMENT_STAGE = "documents"  # a document consumer's write (BatchApplier._documents)


def write_stage(consumer: str) -> str:
    """The stage of `consumer`'s batch line that times its write."""
    return consumer if consumer in FLAT_CONSUMERS else DOCUMENT_STAGE


def consumer_floor(consumer: str, breakdown: dict[str, Any]) -> dict[str, Any] | None:
    """`consumer`'s p50 and p99 floors from its stage breakdown in a step (observe), or None
    when the step holds no batch of it with Spark's figures and a write."""
    medians = breakdown.get("stage_median_seconds", {})
    write = write_stage(consumer)
    if not {"spark", "spark_plan", write} <= medians.keys():
        return None
    spark, plan, took = medians["spark"], medians["spark_plan"], medians[write]
    batch = spark + took
    p50, p99 = 0.5 * batch + plan + took, 0.99 * batch + plan + took
    return {
        "consumer": consumer,
        "spark_seconds": round(spark, 3),
        "plan_seconds": round(plan, 3),
        "write_seconds": round(took, 3),
        "batch_floor_seconds": round(batch, 3),
        "p50_floor_seconds": round(p50, 3),
        "p99_floor_seconds": round(p99, 3),
        "verdict": (
            f"{consumer}: p50 >= {p50:.2f} s, p99 >= {p99:.2f} s from Spark's own seconds of a "
            f"batch ({spark:.2f} s, what a batch with no record costs it; {plan:.2f} s of them "
            f"after reading the end offsets) and its {write} write ({took:.2f} s) alone"
        ),
    }


def step_floors(stages: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each consumer's floor in a step (`stages`: observe.stage_breakdown's, per consumer)."""
    found = {name: consumer_floor(name, breakdown) for name, breakdown in stages.items()}
    return {name: floor for name, floor in found.items() if floor is not None}


def all_sinks_floor(
    stages: dict[str, dict[str, Any]], quantile: str = "p50"
) -> dict[str, Any] | None:
    """The floor of commit -> visible in every sink at `quantile` (p50 | p99): a probe is
    visible everywhere once the slowest sink shows it, so each quantile is at least the
    highest of the flat consumers' floors; that consumer's floor."""
    floors = [f for name, f in step_floors(stages).items() if name in FLAT_CONSUMERS]
    if not floors:
        return None
    return max(floors, key=lambda f: float(f[f"{quantile}_floor_seconds"]))
