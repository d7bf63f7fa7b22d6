"""Side by side with pgsync: the same rows, workload and sampler, one run, printed as ratios.

    .venv/bin/python benchmarks/bench_pgsync.py [--customers N] [--orders M] [--rates 20,100]
        [--step-seconds S] [--tune KEY=VALUE ...] [--systems pgsync,pgsync-tuned,cdc-sync]

Each system gets a fresh local stack (Postgres, osmem-server search stand-in, Redis; the broker
idles for pgsync) loaded with the demo shop rows (N customers, M orders: e2ebench/load.py), then:
- pgsync (PyPI `pgsync` 7.x, in its own venv `.cdc-sync/pgsync-venv`, created on first use;
  never a project dependency) over shop.customers and shop.orders, flat documents with the
  search routes' fields (e2ebench/pgsync.py): `bootstrap`, its daemon as a subprocess, the initial
  sync timed until its indices hold every row; once with its defaults and once tuned (`--tune`,
  pgsync setting names; default TUNED below);
- cdc-sync: the sync job and the embedded capture as in bench_e2e.py (search, Redis and Delta),
  its initial sync timed per sink;
then, for each, the same ladder of MixedWorkload rates with the same probe sampler (pgsync: its
customers index, search only). Prints initial-sync rows/s and commit -> visible-in-search
p50/p99 per rate for each system and the ratios cdc-sync / pgsync (rows/s: above 1 is cdc-sync
faster; seconds: below 1 is cdc-sync fresher), and writes JSON
(benchmarks/results/pgsync-<date>.json unless --output). Every process a phase starts is
stopped by PID when the phase ends, also on errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # tests.*, e2ebench.*

from bench_e2e import PROBE_ROWS, SEARCH_SERVICE, initial_sync, job_log  # noqa: E402
from e2ebench import pgsync  # noqa: E402
from e2ebench.ladder import StepPlan, run_step  # noqa: E402
from e2ebench.load import MixedWorkload, load_rows  # noqa: E402
from e2ebench.observe import cpu_snapshot, tree_usage  # noqa: E402
from e2ebench.pipeline import (  # noqa: E402
    MAPPING,
    SinkCounter,
    drop_run_data,
    start_capture,
    start_job,
    stop_run,
)
from e2ebench.report import cell, output_path, ratio, run_header  # noqa: E402
from e2ebench.sampler import Sampler  # noqa: E402

from cdc_sync.core.model import TableId  # noqa: E402
from cdc_sync.localstack.stack import LocalStack, StackUrls  # noqa: E402
from cdc_sync.mapping import MappingFile, load_mapping  # noqa: E402

log = logging.getLogger("bench_pgsync")
SYSTEMS = ("pgsync", "pgsync-tuned", "cdc-sync")
# The setting that decides pgsync's freshness (pgsync/sync.py `_poll_db_once`): its producer
# queues the NOTIFY payloads in Redis only once REDIS_WRITE_CHUNK_SIZE (default 500) have
# gathered or no notification came for POLL_TIMEOUT (0.1 s). A paced workload of tens of changes
# a second leaves no such pause, so with the default a change waits for ~500 others (measured:
# p50 15 s at 100 changes/s, 0.18 s with 1). Its bulk size (ELASTICSEARCH_CHUNK_SIZE) is left.
TUNED = {"REDIS_WRITE_CHUNK_SIZE": "1"}
PROBE_TABLE = TableId("shop", "customers")


def add_run_options(parser: argparse.ArgumentParser, systems: tuple[str, ...]) -> None:
    """The options a side-by-side run shares with bench_documents.py: probes, pgsync's tuned
    column, which systems run, the job's extra arguments, the broker."""
    parser.add_argument("--probe-interval", type=float, default=0.5, help="seconds between probes")
    parser.add_argument(
        "--drain-slack",
        type=float,
        default=10.0,
        help="a step drains when a probe committed at its end shows within this many seconds",
    )
    parser.add_argument(
        "--tune",
        action="append",
        metavar="KEY=VALUE",
        help="a pgsync setting of the tuned column (repeatable; default "
        + " ".join(f"{k}={v}" for k, v in TUNED.items())
        + ")",
    )
    parser.add_argument(
        "--systems", default=",".join(systems), help=f"which to run, in order ({','.join(systems)})"
    )
    parser.add_argument(
        "--job-arg", action="append", default=[], help="extra `cdc-sync run` argument (repeatable)"
    )
    parser.add_argument("--broker", default="tansu", choices=("tansu", "noida"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--customers", type=int, default=5000, help="parent rows (5000)")
    parser.add_argument("--orders", type=int, help="child rows (default 10 x customers)")
    parser.add_argument("--rates", default="20,100", help="changes/s ladder (20,100)")
    parser.add_argument("--step-seconds", type=float, default=60.0, help="seconds per step (60)")
    add_run_options(parser, SYSTEMS)
    parser.add_argument("--state-dir", default=".cdc-sync/bench-pgsync")
    parser.add_argument("--keep-state", action="store_true", help="keep each phase's stack data")
    parser.add_argument(
        "--output", help="JSON path (default benchmarks/results/pgsync-<date>.json)"
    )
    args = parser.parse_args(argv)
    args.orders = args.orders or 10 * args.customers
    args.rates = [] if args.rates == "none" else [float(r) for r in args.rates.split(",")]
    args.systems = args.systems.split(",")
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"--systems: unknown {sorted(unknown)}; expected some of {SYSTEMS}")
    args.tuning = TUNED if args.tune is None else dict(tuning_setting(s) for s in args.tune)
    return args


def tuning_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"--tune {text!r}: expected KEY=VALUE (a pgsync setting name)")
    return key, value


def ladder(
    args: argparse.Namespace,
    workload: MixedWorkload,
    sampler: Sampler,
    pid: int,
    services: dict[str, int],
    detail_log: Path,
) -> list[dict[str, Any]]:
    """bench_e2e's steps at each rate; stops after a step that does not drain (as bench_e2e)."""
    steps = []
    for rate in args.rates:
        plan = StepPlan(rate, args.step_seconds, args.probe_interval, args.drain_slack,
                        drain_timeout=max(60.0, 2 * args.step_seconds))  # fmt: skip
        step = run_step(plan, workload, sampler, pid, services, detail_log)
        log.info("step %s: %s", rate, json.dumps(step["latency"]))
        steps.append(step)
        if not step["drains"]:
            break
    return steps


def fresh_stack(args: argparse.Namespace, run_dir: Path) -> tuple[LocalStack, StackUrls]:
    stack = LocalStack(run_dir / "stack", broker=args.broker, with_connect=False)
    return stack, stack.start()


def run_pgsync(
    args: argparse.Namespace, mapping: MappingFile, run_dir: Path, tuning: dict[str, str]
) -> dict[str, Any]:
    bin_dir = pgsync.ensure_venv()
    result: dict[str, Any] = {"version": pgsync.installed_version(bin_dir), "settings": tuning}
    stack, urls = fresh_stack(args, run_dir)  # stopped in the `finally` below, from here on
    deployment = workload = sampler = None
    try:
        rows = load_rows(urls.pg_url, args.customers, args.orders)
        result["rows"] = rows
        expected = sum(rows[str(table)] for table in pgsync.TABLES)
        env = pgsync.environment(
            urls.pg_url, urls.search_url, urls.redis_url, run_dir / "pgsync", tuning
        )
        deployment = pgsync.PgSync(bin_dir, run_dir / "pgsync", env, urls.search_url)
        deployment.write_schema(pgsync.schema_document(mapping, urls.pg_url.rsplit("/", 1)[1]))
        bootstrap_seconds = deployment.bootstrap()
        started = time.monotonic()
        deployment.start_daemon()
        assert deployment.pid is not None
        search_pid = next(s.pid for s in stack.started() if s.name == SEARCH_SERVICE)
        cpu_before = tree_usage(deployment.pid).cpu_seconds, tree_usage(search_pid).cpu_seconds
        deployment.wait_documents(expected, timeout=1800)
        seconds = time.monotonic() - started  # from the spawn: its start-up counts
        result["initial_sync"] = {
            "rows": expected,
            "bootstrap_seconds": round(bootstrap_seconds, 1),
            "seconds": round(seconds, 1),
            "rows_per_second": round(expected / seconds, 1),
            "cpu_seconds": {
                "pgsync": round(tree_usage(deployment.pid).cpu_seconds - cpu_before[0], 1),
                "search": round(tree_usage(search_pid).cpu_seconds - cpu_before[1], 1),
            },
        }
        log.info("pgsync initial sync %s", result["initial_sync"])
        workload = MixedWorkload(urls.pg_url, args.customers, args.orders, PROBE_ROWS + 1)
        sampler = Sampler(
            mapping, urls.connections(), PROBE_ROWS, sinks=("search",),
            search_index=pgsync.index_name(PROBE_TABLE),
        )  # fmt: skip
        services = {SEARCH_SERVICE: search_pid}
        result["streaming"] = ladder(
            args, workload, sampler, deployment.pid, services, deployment.log
        )
        result["workload"] = dict(workload.done)
        result["log"] = str(deployment.log)
    finally:
        for closing in (sampler, workload):
            if closing is not None:
                closing.close()
        if deployment is not None:
            deployment.stop()
        stack.stop()
        drop_run_data(run_dir, ("stack",), keep=args.keep_state)
    return result


def run_cdc_sync(args: argparse.Namespace, mapping: MappingFile, run_dir: Path) -> dict[str, Any]:
    """bench_e2e's initial sync and ladder (without its raw-rate phase) on a fresh stack."""
    stack, urls = fresh_stack(args, run_dir)
    connections = urls.connections(run_dir / "warehouse")
    result: dict[str, Any] = {}
    job = capture = counter = sampler = workload = None
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
            counter, capture, sum(result["rows"].values()), started, snapshot
        )
        log.info("cdc-sync initial sync %s", result["initial_sync"])
        workload = MixedWorkload(urls.pg_url, args.customers, args.orders, PROBE_ROWS + 1)
        sampler = Sampler(mapping, connections, PROBE_ROWS)
        result["streaming"] = ladder(args, workload, sampler, job_pid, services, job_log(run_dir))
        result["workload"] = dict(workload.done)
        result["log"] = str(job_log(run_dir))
    finally:
        stop_run((sampler, workload, counter), job, capture, stack)
        drop_run_data(run_dir, keep=args.keep_state)
    return result


# -- the side-by-side table ------------------------------------------------------------------


def _latency(phase: dict[str, Any] | None, rate: float, sink: str) -> dict[str, Any] | None:
    if phase is None:
        return None
    step = next((s for s in phase.get("streaming", []) if s["target_rate"] == rate), None)
    return None if step is None else step["latency"].get(sink)


def _search_cut(rate: float, cut: str) -> Callable[[dict[str, Any] | None], float | None]:
    return lambda phase: (_latency(phase, rate, "search") or {}).get(cut)


def compare(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: cdc-sync's, each pgsync column's, and the ratios cdc-sync / pgsync."""
    phases = result["systems"]
    ours = phases.get("cdc-sync")
    theirs = [name for name in ("pgsync", "pgsync-tuned") if name in phases]
    rows: list[dict[str, Any]] = []

    def add(figure: str, unit: str, pick: Callable[[dict[str, Any] | None], float | None]) -> None:
        row: dict[str, Any] = {"figure": figure, "unit": unit, "cdc-sync": pick(ours)}
        for name in theirs:
            row[name] = pick(phases[name])
            row[f"ratio vs {name}"] = ratio(row["cdc-sync"], row[name])
        rows.append(row)

    def initial(phase: dict[str, Any] | None) -> float | None:
        if phase is None or "initial_sync" not in phase:
            return None
        rate = phase["initial_sync"]["rows_per_second"]
        return float(rate["search"] if isinstance(rate, dict) else rate)  # cdc-sync: per sink

    add("initial sync into search", "rows/s", initial)
    for rate in result["options"]["rates"]:
        for cut in ("p50", "p99"):
            # cdc-sync's probes also wait for Redis and Delta; search is what pgsync writes
            add(f"{rate:.0f} changes/s search {cut}", "s", _search_cut(rate, cut))
    if ours is not None:
        all_sinks = ours.get("initial_sync", {}).get("all_sinks_rows_per_second")
        rows.append({"figure": "cdc-sync initial sync, all three sinks", "unit": "rows/s",
                     "cdc-sync": all_sinks})  # fmt: skip
        for rate in result["options"]["rates"]:
            lat = _latency(ours, rate, "all") or {}
            rows.append({"figure": f"cdc-sync {rate:.0f} changes/s all sinks p50/p99", "unit": "s",
                         "cdc-sync": [lat.get("p50"), lat.get("p99")]})  # fmt: skip
    return rows


def render(result: dict[str, Any]) -> str:
    rows = result["comparison"]
    columns = ["figure", "unit", "cdc-sync"] + [
        name for name in ("pgsync", "ratio vs pgsync", "pgsync-tuned", "ratio vs pgsync-tuned")
        if any(name in row for row in rows)
    ]  # fmt: skip
    table = [[r["figure"], r["unit"]] + [cell(r.get(c)) for c in columns[2:]] for r in rows]
    widths = [max(len(r[i]) for r in [columns, *table]) for i in range(len(columns))]
    lines = [
        f"cdc-sync vs pgsync {result['started']} ({result['machine']})",
        f"rows: {result['options']['customers']} customers + {result['options']['orders']} "
        f"orders; steps of {result['options']['step_seconds']:.0f} s; tuned pgsync: "
        + " ".join(f"{k}={v}" for k, v in result["options"]["tuning"].items()),
        "ratio = cdc-sync / pgsync (rows/s: > 1 cdc-sync faster; seconds: < 1 cdc-sync fresher)",
        "initial sync: each system's rows over its seconds (pgsync: customers + orders, from its"
        " daemon's start; cdc-sync: also 100 products, and Redis and Delta, from capture start)",
        "",
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    for name, phase in result["systems"].items():
        for step in phase.get("streaming", []):
            if not step["drains"]:
                lines.append(
                    f"  {name}: {step['target_rate']:.0f} changes/s did not drain "
                    f"(drain probe {step['drained_in_seconds']} s); higher rates not run"
                )
    return "\n".join(lines)


def start_process() -> None:
    """Logging, the job's Python, and SIGTERM as Ctrl-C: what a side-by-side run needs first."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("py4j", "urllib3", "opensearch", "elastic_transport"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # A SIGTERM unwinds like Ctrl-C: each phase's `finally` stops what it started, by PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def main(argv: list[str] | None = None) -> int:
    start_process()
    args = parse_args(argv)
    mapping = load_mapping(MAPPING)
    base = Path(args.state_dir).resolve() / f"run-{int(time.time())}"
    result: dict[str, Any] = {
        **run_header(args),
        "systems": {},
    }
    output = output_path(args.output, "pgsync")
    # pgsync first: the cdc-sync phase starts Debezium's JVM in this process, for good.
    for name in args.systems:
        log.info("== %s", name)
        if name == "cdc-sync":
            phase = run_cdc_sync(args, mapping, base / name)
        else:
            phase = run_pgsync(args, mapping, base / name, {} if name == "pgsync" else args.tuning)
        result["systems"][name] = phase
        # Written after each phase: a failure later keeps what was measured.
        result["comparison"] = compare(result)
        output.write_text(json.dumps(result, indent=2, default=str))
    print(render(result))
    print(f"\nJSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
