"""Search frozen for a minute: Redis and Delta keep their freshness (issue 28, invariant 8).

    .venv/bin/python benchmarks/bench_freeze.py [--quick] [--customers N] [--orders M]
        [--rate R] [--step-seconds S] [--freeze-seconds S] [--warmup-seconds S]
        [--broker tansu|noida] [--output FILE]

On a local stack of its own (Postgres, broker, osmem-server, Redis; stopped afterwards) with the
demo shop schema and bench_e2e's rows (N customers, 10 N orders, 100 products): the initial sync,
a warm-up at `--rate` changes/s (bench_e2e's mixed workload), then, at the same rate, a step with
every sink answering and a step with the search server frozen (SIGSTOP) for `--freeze-seconds`,
each with commit -> visible p50/p95/p99 per sink from bench_e2e's probes (Redis and Delta only
while search is frozen); after the thaw, how long search takes to show a probe committed then.
Prints the two steps side by side per sink and writes JSON
(benchmarks/results/freeze-<date>.json unless --output).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # tests.*, e2ebench.*

from bench_e2e import PROBE_ROWS, SEARCH_SERVICE, initial_sync, job_log  # noqa: E402
from bench_pgsync import fresh_stack, run_header, start_process  # noqa: E402
from e2ebench.freeze import BESIDE_SEARCH, FreezeRun, comparison, freeze_steps, render  # noqa: E402
from e2ebench.ladder import StepPlan, run_step  # noqa: E402
from e2ebench.load import MixedWorkload, load_rows  # noqa: E402
from e2ebench.observe import cpu_snapshot  # noqa: E402
from e2ebench.pipeline import (  # noqa: E402
    MAPPING,
    SinkCounter,
    drop_run_data,
    start_capture,
    start_job,
    stop_run,
)
from e2ebench.report import output_path  # noqa: E402
from e2ebench.sampler import Sampler  # noqa: E402

from cdc_sync.mapping import load_mapping  # noqa: E402

log = logging.getLogger("bench_freeze")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="500 customers, 5,000 orders, 20 s steps and freeze")  # fmt: skip
    parser.add_argument("--customers", type=int, help="parent rows (default 5000)")
    parser.add_argument("--orders", type=int, help="child rows (default 10 x customers)")
    parser.add_argument("--rate", type=float, default=20.0, help="changes/s in every step")
    parser.add_argument("--step-seconds", type=float, help="the step without a freeze (60)")
    parser.add_argument("--freeze-seconds", type=float, help="search frozen this long (60)")
    parser.add_argument("--warmup-seconds", type=float, help="workload before the steps (30)")
    parser.add_argument("--probe-interval", type=float, default=0.5, help="seconds between probes")
    parser.add_argument(
        "--drain-slack",
        type=float,
        default=10.0,
        help="a step drains when a probe committed at its end shows within this many seconds",
    )
    parser.add_argument("--broker", default="tansu", choices=("tansu", "noida"))
    parser.add_argument(
        "--job-arg",
        action="append",
        default=[],
        help="extra `cdc-sync run` argument (repeatable): --job-arg=--trigger-seconds=0.2",
    )
    parser.add_argument("--state-dir", default=".cdc-sync/bench-freeze")
    parser.add_argument(
        "--keep-state", action="store_true", help="keep the run's stack data, tables, checkpoint"
    )
    parser.add_argument(
        "--output", help="JSON path (default benchmarks/results/freeze-<date>.json)"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.customers = args.customers or (500 if quick else 5000)
    args.orders = args.orders or 10 * args.customers
    args.step_seconds = args.step_seconds or (20.0 if quick else 60.0)
    args.freeze_seconds = args.freeze_seconds or (20.0 if quick else 60.0)
    if args.warmup_seconds is None:
        args.warmup_seconds = 10.0 if quick else 30.0
    return args


def plans(args: argparse.Namespace) -> tuple[StepPlan, StepPlan, StepPlan]:
    """The warm-up, the step without a freeze and the frozen one."""
    timeout = max(60.0, 2 * args.freeze_seconds)  # search's backlog after the thaw included

    def plan(seconds: float) -> StepPlan:
        return StepPlan(args.rate, seconds, args.probe_interval, args.drain_slack, timeout)

    return plan(args.warmup_seconds), plan(args.step_seconds), plan(args.freeze_seconds)


def run(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(args.state_dir).resolve() / f"run-{int(time.time())}"
    stack, urls = fresh_stack(args, run_dir)  # stopped in the `finally` below
    mapping = load_mapping(MAPPING)
    connections = urls.connections(run_dir / "warehouse")
    result: dict[str, Any] = run_header(args)
    job = capture = counter = workload = everywhere = beside = None
    try:
        result["rows"] = load_rows(urls.pg_url, args.customers, args.orders)
        services = {s.name: s.pid for s in stack.started()}
        job = start_job(connections, run_dir, list(args.job_arg))
        assert job.process is not None
        job_pid = job.process.pid
        counter = SinkCounter(mapping, connections)
        started = time.monotonic()
        capture = start_capture(connections, run_dir)
        snapshot: Callable[[], dict[str, float]] = lambda: cpu_snapshot(job_pid, services)  # noqa: E731
        result["initial_sync"] = initial_sync(
            counter, capture, job, sum(result["rows"].values()), started, snapshot
        )
        log.info("initial sync %s", result["initial_sync"])
        workload = MixedWorkload(urls.pg_url, args.customers, args.orders, PROBE_ROWS + 1)
        everywhere = Sampler(mapping, connections, PROBE_ROWS)
        beside = Sampler(mapping, connections, PROBE_ROWS, sinks=BESIDE_SEARCH)
        warmup, plain, frozen_plan = plans(args)
        if warmup.seconds > 0:  # the search stand-in is slow right after a bulk load
            step = run_step(warmup, workload, everywhere, job_pid, services, job_log(run_dir))
            result["warmup"] = step["latency"]
        freeze = FreezeRun(workload, job_pid, services, job_log(run_dir))
        search_pid = services[SEARCH_SERVICE]
        result.update(freeze_steps(freeze, everywhere, beside, plain, frozen_plan, search_pid))
        result["comparison"] = comparison(result)
        log.info("comparison %s", json.dumps(result["comparison"]))
        result["workload"] = dict(workload.done)
    finally:
        stop_run((everywhere, beside, workload, counter), job, capture, stack)
        drop_run_data(run_dir, keep=args.keep_state)
    result["job_log"] = str(job_log(run_dir))
    return result


def main(argv: list[str] | None = None) -> int:
    start_process()
    args = parse_args(argv)
    result = run(args)
    output = output_path(args.output, "freeze")
    output.write_text(json.dumps(result, indent=2, default=str))
    print(render(result))
    print(f"\nJSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
