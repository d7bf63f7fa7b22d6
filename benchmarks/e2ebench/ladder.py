"""One streaming step: the mixed workload at a rate while the sampler probes, then the drain."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from e2ebench.load import MixedWorkload
from e2ebench.observe import CpuTracker, batch_lines, stage_breakdown, tree_usage
from e2ebench.sampler import Sampler, latency_summary

DRAIN_STEP_SHARE = 0.55  # of the ceiling: the drain target's 0.5, and room for the workload


@dataclass(frozen=True)
class StepPlan:
    rate: float  # changes/s
    seconds: float
    probe_interval: float
    drain_slack: float  # a step drains when a probe committed at its end shows within this
    drain_timeout: float


class StepParts(NamedTuple):
    """What every step of a run shares, in run_step's order."""

    workload: MixedWorkload
    sampler: Sampler
    job_pid: int
    services: dict[str, int]
    job_log: Path


def run_step(
    plan: StepPlan,
    workload: MixedWorkload,
    sampler: Sampler,
    job_pid: int,
    services: dict[str, int],
    job_log: Path,
    during: Callable[[threading.Event], None] | None = None,
) -> dict[str, Any]:
    """The workload at `plan.rate` while the sampler probes, then the drain probe. `during`:
    more work running beside the workload until it ends (e2ebench.fanout's renames), given
    the event that ends it."""
    stop = threading.Event()
    probing = threading.Thread(target=sampler.run, args=(plan.probe_interval, stop), daemon=True)
    beside = None if during is None else threading.Thread(target=during, args=(stop,), daemon=True)
    rss: list[int] = []
    job_cpu = CpuTracker(job_pid)
    cpu_before = job_cpu.sample()
    service_cpu = {name: tree_usage(pid).cpu_seconds for name, pid in services.items()}
    wall_start, started = time.time(), time.monotonic()
    probing.start()
    writer_result: dict[str, Any] = {}

    def write() -> None:
        writer_result["committed"], writer_result["seconds"] = workload.run(
            plan.rate, plan.seconds, threading.Event()
        )

    writing = threading.Thread(target=write, daemon=True)
    writing.start()
    if beside is not None:
        beside.start()
    while writing.is_alive():
        rss.append(tree_usage(job_pid).rss_bytes)
        job_cpu.sample()
        writing.join(timeout=1.0)
    stop.set()
    probing.join()
    if beside is not None:
        beside.join()
    # Drain: one more probe, committed now, must show within the slack.
    final = sampler.drain_probe()
    drained_in = None
    if sampler.wait_visible(final, plan.drain_timeout):
        drained_in = max(final.seen.values())
    # Older probes still in flight get their chance while the backlog drains.
    for probe in list(sampler.probes):
        if not probe.done:
            sampler.wait_visible(probe, 5.0)
    elapsed = time.monotonic() - started
    usage_after = tree_usage(job_pid)
    rss.append(usage_after.rss_bytes)
    probes = [p for p in sampler.take() if p is not final]
    return {
        "target_rate": plan.rate,
        "achieved_rate": round(writer_result["committed"] / writer_result["seconds"], 1),
        "changes": writer_result["committed"],
        "seconds": round(elapsed, 1),
        "drained_in_seconds": None if drained_in is None else round(drained_in, 2),
        "drains": drained_in is not None and drained_in <= plan.drain_slack,
        # Per sink: which consumer held the drain (each runs on its own clock).
        "drained_in_seconds_by_sink": {k: round(v, 2) for k, v in sorted(final.seen.items())},
        "latency": latency_summary(probes),
        "job_cpu_percent": round(100 * (job_cpu.sample() - cpu_before) / elapsed, 1),
        "job_rss_mb": {
            "first": round(rss[0] / 2**20),
            "last": round(rss[-1] / 2**20),
            "max": round(max(rss) / 2**20),
            # One sample a second while the workload writes; every 30th kept for the JSON.
            "every_30_s": [round(sample / 2**20) for sample in rss[::30]],
        },
        "service_cpu_percent": {
            name: round(100 * (tree_usage(pid).cpu_seconds - service_cpu[name]) / elapsed, 1)
            for name, pid in services.items()
        },
        "stages": stage_breakdown(batch_lines(job_log), wall_start, time.time()),
    }


def rate_ladder(rates: list[float], ceiling: float) -> list[float]:
    """The rates to step through: the asked ones, led by just over half the slowest raw rate a
    stream meets when that is below them all (the drain target's rate; the search stand-in
    re-indexes a few documents a second in a 50,000-document index), so that target is tried."""
    half = float(math.ceil(DRAIN_STEP_SHARE * ceiling))
    return [half, *rates] if rates and half < min(rates) else rates
