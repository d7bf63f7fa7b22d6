"""Search frozen, the cache and the warehouse fresh (invariant 8: no sink waits for another).

Two streaming steps at the same rate, measured as the ladder measures (ladder.run_step, the
sampler's probes): one with every sink answering, one with the search server SIGSTOPped (it
keeps its sockets and answers nothing) where only Redis and Delta are probed (a request to a
frozen server blocks until it times out); after the thaw, how long search takes to show a probe
committed then (it catches up on what it missed). bench_freeze.py runs them on its own stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2ebench.ladder import StepPlan, run_step
from e2ebench.load import MixedWorkload
from e2ebench.report import cell, table
from e2ebench.sampler import SINKS, Sampler
from tests.adversarial.child import frozen

BESIDE_SEARCH = ("redis", "delta")  # the sinks probed while search is frozen


@dataclass(frozen=True)
class FreezeRun:
    """What the steps run against: the workload, the job and the stack's services."""

    workload: MixedWorkload
    job_pid: int
    services: dict[str, int]  # name -> pid, the search server's among them
    job_log: Path


def freeze_steps(
    run: FreezeRun,
    everywhere: Sampler,
    beside: Sampler,
    plan: StepPlan,
    freeze: StepPlan,
    search_pid: int,
) -> dict[str, Any]:
    """The step without a freeze (`everywhere` probes every sink), then the one with search
    frozen (`beside` probes Redis and Delta; `freeze.seconds` of workload, then its drain probe,
    all while frozen), then search's catch-up after the thaw."""
    assert beside.sinks == BESIDE_SEARCH, f"the frozen step probes {BESIDE_SEARCH} only"
    steps = {"no freeze": run_step(plan, run.workload, everywhere, **_observed(run))}
    with frozen(search_pid):
        steps["search frozen"] = run_step(freeze, run.workload, beside, **_observed(run))
    catch_up = everywhere.drain_probe()  # committed right after the thaw
    caught_up = everywhere.wait_visible(catch_up, freeze.drain_timeout)
    return {
        "steps": steps,
        "after_thaw": {"visible": caught_up, "seconds": dict(catch_up.seen)},
    }


def _observed(run: FreezeRun) -> dict[str, Any]:
    return {"job_pid": run.job_pid, "services": run.services, "job_log": run.job_log}


def comparison(result: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per sink probed in both steps: p50 / p99 without and with the freeze, and the p99 ratio
    (the issue's measure: Redis and Delta keep their normal p99)."""
    plain = result["steps"]["no freeze"]["latency"]
    frozen_step = result["steps"]["search frozen"]["latency"]
    found: dict[str, dict[str, float | None]] = {}
    for sink in BESIDE_SEARCH:
        before, during = plain[sink], frozen_step[sink]
        found[sink] = {
            "p50": before["p50"],
            "p99": before["p99"],
            "frozen_p50": during["p50"],
            "frozen_p99": during["p99"],
            "p99_ratio": (
                round(during["p99"] / before["p99"], 2)
                if during["p99"] is not None and before["p99"]
                else None
            ),
        }
    return found


def render(result: dict[str, Any]) -> str:
    options, steps = result["options"], result["steps"]
    frozen_step = steps["search frozen"]
    lines = [
        f"cdc-sync: search frozen {options['freeze_seconds']:g} s at {options['rate']:g} "
        f"changes/s, {result['started']} ({result['machine']})",
        f"rows: {result['rows']}; initial sync into all sinks "
        f"{max(result['initial_sync']['seconds'].values()):.1f} s",
        "",
    ]
    rows = []
    compared = result["comparison"]
    catch_up = result["after_thaw"]
    for sink in SINKS:
        plain = steps["no freeze"]["latency"][sink]
        if sink in compared:
            during = frozen_step["latency"][sink]
            frozen_cell = f"{cell(during['p50'])} / {cell(during['p99'])}"
            ratio = cell(compared[sink]["p99_ratio"])
        else:
            seen = catch_up["seconds"].get(sink)
            frozen_cell = (
                f"frozen; a probe committed at the thaw showed after {seen:.1f} s"
                if seen is not None
                else "frozen; not caught up"
            )
            ratio = "-"
        rows.append([sink, f"{cell(plain['p50'])} / {cell(plain['p99'])}", frozen_cell, ratio])
    lines += table(["sink", "no freeze p50 / p99 s", "search frozen p50 / p99 s", "p99 x"], rows)
    lines += [
        "",
        f"probes: {steps['no freeze']['latency']['probes']} without a freeze, "
        f"{frozen_step['latency']['probes']} while frozen "
        f"({frozen_step['latency']['unresolved']} unresolved); changes/s achieved "
        f"{steps['no freeze']['achieved_rate']:g} and {frozen_step['achieved_rate']:g}",
    ]
    return "\n".join(lines)
