"""Issue 28's targets (deliverable 2: search and Redis at the floor, each sink on its own clock)
beside the run's figures; each missed one with the bound the same run's figures prove: the
freshness floor of the sink's own consumer in that step (e2ebench.floors), the search server's
own stalls, the slowest raw rate, the initial sync's CPU.
"""

from __future__ import annotations

from typing import Any

from e2ebench.floors import all_sinks_floor, consumer_floor
from e2ebench.report import cpu_budget, seconds_text, stall_wait, streaming_ceiling

# The last `make bench` before the job ran one query per consumer (docs/performance.md): the
# extra reads and decoding of several consumers must not cost the initial sync below it.
LAST_INITIAL_ROWS_PER_SECOND = 1004.0
FAST_SINKS = ("search", "redis")  # off Delta's commit: at the micro-batch floor
FAST_P50, FAST_P99 = 0.25, 0.5
DELTA_P99 = 1.5
FLOOR_RATES = (20.0, 100.0)
BUSY_RATE, BUSY_P99 = 300.0, 2.0
DRAIN_RATE = 1000.0


def clock_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issue 28's deliverable 2 the run's options asked for, with its figure,
    whether it is met, and the bound of a missed one."""
    asked = result.get("options", {}).get("rates")
    steps = {s["target_rate"]: s for s in result.get("streaming", [])}
    found: list[dict[str, Any]] = []
    if result.get("initial_sync"):
        found.append(_initial_target(result))
    rates = [r for r in (*FLOOR_RATES, BUSY_RATE, DRAIN_RATE) if asked is None or r in asked]
    for rate in rates:
        step = steps.get(rate)
        if rate in FLOOR_RATES:
            found += [
                _latency_target(result, step, rate, s, FAST_P50, FAST_P99) for s in FAST_SINKS
            ]
            found.append(_latency_target(result, step, rate, "delta", None, DELTA_P99))
        elif rate == BUSY_RATE:
            found.append(_latency_target(result, step, rate, "all", None, BUSY_P99))
        else:
            found.append(_drain_target(result, step, rate))
    return found


def _initial_target(result: dict[str, Any]) -> dict[str, Any]:
    initial = result["initial_sync"]
    raw = result["raw"]["rows_per_second"]
    slowest_sink = min(raw, key=raw.get)
    rate = initial["all_sinks_rows_per_second"]
    per_sink = ", ".join(f"{s} {r:.0f}" for s, r in sorted(initial["rows_per_second"].items()))
    target: dict[str, Any] = {
        "target": f"initial sync into all three sinks >= {LAST_INITIAL_ROWS_PER_SECOND:,.0f} "
        "rows/s (the last run before one query per consumer)",
        "figure": f"{rate:.0f} rows/s = {rate / raw[slowest_sink]:.2f} x the slowest raw "
        f"({slowest_sink} {raw[slowest_sink]:.0f}/s); per sink {per_sink}",
        "met": rate >= LAST_INITIAL_ROWS_PER_SECOND,
    }
    if "cpu_seconds" in initial:
        target["bound"] = cpu_budget(
            initial | {"raw_rows": result["raw"].get("rows", initial["rows"])},
            LAST_INITIAL_ROWS_PER_SECOND,
            result["raw"].get("search_cpu_seconds"),
        )
    return target


def _latency_target(
    result: dict[str, Any],
    step: dict[str, Any] | None,
    rate: float,
    sink: str,
    p50_max: float | None,
    p99_max: float,
) -> dict[str, Any]:
    limits = ([f"p50 <= {p50_max} s"] if p50_max is not None else []) + [f"p99 <= {p99_max} s"]
    name = "all sinks" if sink == "all" else sink
    target: dict[str, Any] = {"target": f"{rate:.0f} changes/s: {name} {', '.join(limits)}"}
    if step is None:
        return target | _not_run(result, rate)
    latency = step["latency"].get(sink, {})
    p50, p99 = latency.get("p50"), latency.get("p99")
    target["figure"] = f"p50 {seconds_text(p50)} s, p99 {seconds_text(p99)} s"
    target["met"] = (
        p99 is not None
        and p99 <= p99_max
        and (p50_max is None or (p50 is not None and p50 <= p50_max))
    )
    if target["met"]:
        return target
    stages = step.get("stages", {})
    floor = (
        all_sinks_floor(stages, "p99")
        if sink == "all"
        else consumer_floor(sink, stages.get(sink, {}))
    )
    stalls = stall_wait(result["raw"], p99_max) if sink in ("search", "all") else ""
    if floor is None:
        if stalls:
            target["bound"] = {"verdict": stalls.removeprefix("; "), "proven": True}
        return target
    above = floor["p99_floor_seconds"] > p99_max or (
        p50_max is not None and floor["p50_floor_seconds"] > p50_max
    )
    reach = (
        "above the target: no batch of these costs meets it"
        if above
        else "below the target: the rest is the consumer's other stages and waiting"
    )
    target["bound"] = floor | {
        "verdict": f"{floor['verdict']}, {reach}{stalls}",
        "proven": above or bool(stalls),
    }
    return target


def _drain_target(
    result: dict[str, Any], step: dict[str, Any] | None, rate: float
) -> dict[str, Any]:
    target: dict[str, Any] = {"target": f"{rate:.0f} changes/s drains"}
    if step is None:
        return target | _not_run(result, rate)
    by_sink = step.get("drained_in_seconds_by_sink", {})
    per_sink = ", ".join(f"{s} {v:.1f} s" for s, v in by_sink.items())
    target["met"] = bool(step["drains"])
    target["figure"] = (
        f"drain probe visible in {step['drained_in_seconds']} s" if step["drains"]
        else f"does not drain: drain probe {step['drained_in_seconds'] or 'not'} seen"
    ) + (f" ({per_sink})" if per_sink else "")  # fmt: skip
    ceiling, ceiling_name = streaming_ceiling(result["raw"])
    if not step["drains"] and ceiling < rate:
        target["bound"] = {"verdict": _below_ceiling(rate, ceiling, ceiling_name), "proven": True}
    return target


def _not_run(result: dict[str, Any], rate: float) -> dict[str, Any]:
    """A step the ladder did not reach (a slower one did not drain), and what bounds it."""
    found: dict[str, Any] = {"figure": "not run: a slower step did not drain", "met": False}
    ceiling, ceiling_name = streaming_ceiling(result["raw"])
    if ceiling < rate:
        found["bound"] = {"verdict": _below_ceiling(rate, ceiling, ceiling_name), "proven": True}
    return found


def _below_ceiling(rate: float, ceiling: float, name: str) -> str:
    return (
        f"the {name} rate, {ceiling:.1f}/s, is below {rate:.0f} changes/s (a stream is mostly "
        "updates): no job keeps up here"
    )
