"""End-to-end benchmark: raw sink rates, initial sync, streaming freshness per sink and per
consumer of the log (issues 9, 28 and 26).

    .venv/bin/python benchmarks/bench_e2e.py [--quick] [--customers N] [--orders M] [--scale K]
        [--fanout F] [--rates 20,100,300,1000] [--step-seconds S] [--rss-minutes M]
        [--warmup-seconds S] [--broker tansu|noida] [--output FILE]
    .venv/bin/python benchmarks/bench_e2e.py --growth [--scale 10]   # 1x and Kx, both brokers
    .venv/bin/python benchmarks/bench_e2e.py --compare RUN.json RUN.json ...

On a local stack of its own (Postgres, a broker stand-in, osmem-server, Redis; stopped
afterwards) with the demo shop schema: loads N customers and M orders and a fan-out customer
with F orders and their lines, measures each sink's raw ingest rate on those rows, then starts
the sync job (a subprocess: its CPU and RSS are its own; one streaming query per consumer of
the log) and the embedded capture and times the initial sync per sink and the document index's
build; then, after a warm-up at the first rate (`--warmup-seconds`, not counted: the search
stand-in is slow for its next bulks after a load), runs a ladder of mixed insert/update/delete
rates, each with commit -> visible
p50/p95/p99 per sink, whether the backlog drains, the job's CPU/RSS and the search server's CPU,
and each consumer's per-batch stage times from the job's log; at 20 and 100 changes/s the step
runs again while the fan-out customer is renamed over and over. Prints the tables with the
targets of issues 9, 28 and 26 beside the figures (the bound of each missed one) and writes
JSON (benchmarks/results/e2e-<date>.json unless --output). `--growth` runs the ladder at 1x and
at --scale x the rows on both brokers and prints which part of a batch grows with the log;
`--compare` prints that comparison from saved runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # tests.*, e2ebench.*

from e2ebench import raw  # noqa: E402
from e2ebench.docprobe import count_documents  # noqa: E402
from e2ebench.documents import DOCUMENT  # noqa: E402
from e2ebench.fanout import FanoutRows, fanout_target, load_fanout, run_fanout_step  # noqa: E402
from e2ebench.growth import render_growth  # noqa: E402
from e2ebench.ladder import StepParts, StepPlan, rate_ladder, run_step  # noqa: E402
from e2ebench.load import MixedWorkload, load_rows, source_counts  # noqa: E402
from e2ebench.observe import cpu_snapshot, tree_usage  # noqa: E402
from e2ebench.pipeline import (  # noqa: E402
    MAPPING,
    SinkCounter,
    drop_run_data,
    start_capture,
    start_job,
    stop_run,
    wait_captured,
)
from e2ebench.printout import render  # noqa: E402
from e2ebench.report import output_path, rss_drift, streaming_ceiling, targets  # noqa: E402
from e2ebench.sampler import Sampler  # noqa: E402
from e2ebench.sink_targets import clock_targets  # noqa: E402

from cdc_sync.core.settings import Connections  # noqa: E402
from cdc_sync.job.consumers import DOCUMENTS_PREFIX, consumer_names  # noqa: E402
from cdc_sync.localstack.stack import LocalStack  # noqa: E402
from cdc_sync.mapping import MappingFile, load_mapping  # noqa: E402
from tests.adversarial.pipeline import JobProcess  # noqa: E402

log = logging.getLogger("bench_e2e")
PROBE_ROWS = 32
DOCUMENTS_BUILD_TIMEOUT = 3600.0  # from capture start
FANOUT_SETTLE_TIMEOUT = 900.0  # after a fan-out step, until the last rename shows everywhere
BROKERS = ("tansu", "noida")  # the stand-ins (docs/performance.md: how each reads its log)
SEARCH_SERVICE = "search"  # the stack's name for the search server (service CPU columns)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="500 customers, 5,000 orders, a 1,000-order fan-out, rates 20,100, "
                        "20 s steps")  # fmt: skip
    parser.add_argument("--customers", type=int, help="parent rows (default 5000)")
    parser.add_argument("--orders", type=int, help="child rows (default 10 x customers)")
    parser.add_argument(
        "--scale",
        type=float,
        help="K times the customers and orders (the fan-out stays; --growth: the larger size, 10)",
    )
    parser.add_argument(
        "--fanout",
        type=int,
        help="orders of the fan-out customer, 2 lines each (default 10000; --quick 1000; "
        "--growth 0; 0: no fan-out rows or steps)",
    )
    parser.add_argument(
        "--fanout-rates",
        default="20,100",
        help="the ladder's rates whose step runs again beside the fan-out (issue 26)",
    )
    parser.add_argument(
        "--fanout-interval", type=float, default=1.0, help="seconds between fan-out renames"
    )
    parser.add_argument(
        "--consumers",
        help="the job's consumers of the log (`cdc-sync run --consumers`; default: all the "
        "mapping's; --growth: search,redis,delta)",
    )
    parser.add_argument(
        "--growth",
        action="store_true",
        help="the run at 1x and at --scale x the rows on both brokers, then the comparison",
    )
    parser.add_argument(
        "--compare", nargs="+", metavar="JSON", help="print the comparison of saved runs only"
    )
    parser.add_argument(
        "--rates", help="changes/s ladder (default 20,100,300,1000; none: initial sync only)"
    )
    parser.add_argument("--step-seconds", type=float, help="workload seconds per step (60)")
    parser.add_argument("--probe-interval", type=float, default=0.5, help="seconds between probes")
    parser.add_argument(
        "--drain-slack",
        type=float,
        default=10.0,
        help="a step drains when a probe committed at its end shows within this many seconds",
    )
    parser.add_argument(
        "--rss-minutes",
        type=float,
        default=0.0,
        help="then run 100 changes/s this long and report the RSS drift (issue 9: 30)",
    )
    parser.add_argument("--broker", default="tansu", choices=("tansu", "noida"))
    parser.add_argument(
        "--search-url",
        help="a search server of your own (scratch: the run creates and drops its indices) "
        "instead of the local stack's stand-in; its CPU is then not counted",
    )
    parser.add_argument(
        "--search-client", default="opensearch", choices=("opensearch", "elasticsearch")
    )
    parser.add_argument(
        "--partitions", type=int, help="partitions per captured topic (default: the connector's)"
    )
    parser.add_argument(
        "--trigger-seconds", type=float, help="the job's trigger (default: the job's own)"
    )
    parser.add_argument(
        "--job-arg",
        action="append",
        default=[],
        help="extra `cdc-sync run` argument (repeatable): --job-arg=--max-offsets-per-trigger=2000",
    )
    parser.add_argument("--state-dir", default=".cdc-sync/bench")
    parser.add_argument(
        "--keep-state", action="store_true", help="keep the run's stack data, tables, checkpoint"
    )
    parser.add_argument(
        "--warmup-seconds",
        type=float,
        help="workload at the ladder's first rate before its steps, not counted (60; --quick "
        "10; 0: none): the search stand-in is slow for its next bulks after a load",
    )
    parser.add_argument("--output", help="JSON path (default benchmarks/results/e2e-<date>.json)")
    args = parser.parse_args(argv)
    quick = args.quick
    if args.growth:
        args.scale = args.scale or 10.0
        args.fanout = 0 if args.fanout is None else args.fanout
        args.consumers = args.consumers or "search,redis,delta"
    args.base_customers = args.customers or (500 if quick else 5000)
    args.base_orders = args.orders or 10 * args.base_customers
    args.customers, args.orders = scaled(args, 1.0 if args.growth else args.scale or 1.0)
    args.fanout = (1000 if quick else 10000) if args.fanout is None else args.fanout
    args.fanout_rates = [float(r) for r in args.fanout_rates.split(",") if r]
    ladder = args.rates or ("20,100" if quick else "20,100,300,1000")
    args.rates = [] if ladder == "none" else [float(r) for r in ladder.split(",")]
    args.step_seconds = args.step_seconds or (20.0 if quick else 60.0)
    if args.warmup_seconds is None:
        args.warmup_seconds = 10.0 if quick else 60.0
    return args


def scaled(args: argparse.Namespace, scale: float) -> tuple[int, int]:
    """Customers and orders at `scale` times the asked (or default) size."""
    return round(scale * args.base_customers), round(scale * args.base_orders)


def initial_sync(
    counter: SinkCounter,
    capture: Any,
    job: JobProcess,
    expected: int,
    started: float,
    cpu_before: Callable[[], dict[str, float]],
) -> dict[str, Any]:
    """Seconds until each sink holds every row, and the CPU each part of the pipeline spent
    meanwhile (`cpu_before` reads the counters; called once now, once at the end)."""
    before = cpu_before()
    counting = time.thread_time()
    wait_captured(capture)
    capture_seconds = time.monotonic() - started
    # The sinks at 100 rows/s at worst (the default size syncs at ~500).
    timeout = max(1800.0, expected / 100)
    reached = counter.wait_all(expected, timeout=timeout, started=started, job=job)
    after = cpu_before()
    # This thread polled the sinks' counts, in the capture's process: not the pipeline's work.
    counting = time.thread_time() - counting
    cpu = {name: after[name] - before[name] for name in after}
    cpu["capture"] -= counting
    return {
        "cpu_seconds": {name: round(seconds, 1) for name, seconds in cpu.items()},
        "counting_cpu_seconds": round(counting, 1),
        "cores": os.cpu_count(),
        "rows": expected,
        "capture_seconds": round(capture_seconds, 1),
        "seconds": {k: round(v, 1) for k, v in reached.items()},
        "rows_per_second": {k: round(expected / v, 1) for k, v in reached.items()},
        "all_sinks_rows_per_second": round(expected / max(reached.values()), 1),
    }


def job_log(run_dir: Path) -> Path:
    """The job's detailed log (cdc_sync.core.logs): its batch lines carry the stage times."""
    return run_dir / "state" / "logs" / "job.log"


def documents_build(
    search_url: str,
    pg_url: str,
    mapping: MappingFile,
    started: float,
    job: JobProcess,
    timeout: float = DOCUMENTS_BUILD_TIMEOUT,
) -> dict[str, Any]:
    """Seconds from `started` (capture start) until the document index holds a document for
    every root its filter keeps (its consumer builds it beside the sinks' initial sync)."""
    spec = mapping.documents[DOCUMENT]
    where = f" WHERE {spec.filter}" if spec.filter else ""
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {spec.table}{where}".encode()).fetchone()
    expected = int(row[0]) if row else 0
    found = 0
    while time.monotonic() - started < timeout:
        job.raise_if_dead()
        found = count_documents(search_url, spec.index)
        if found >= expected:
            seconds = time.monotonic() - started
            return {"index": spec.index, "documents": expected, "seconds": round(seconds, 1),
                    "per_second": round(expected / seconds, 1)}  # fmt: skip
        time.sleep(1.0)
    return {"index": spec.index, "documents": expected, "seconds": None, "found": found,
            "timeout": timeout}  # fmt: skip


def ladder(
    args: argparse.Namespace,
    result: dict[str, Any],
    parts: StepParts,
    fanout: Callable[[StepPlan], dict[str, Any]] | None,
) -> None:
    """The ladder's steps into result["streaming"], and beside each of --fanout-rates the same
    step with the fan-out running into result["fanout_steps"]; stops at a step that does not
    drain (higher rates will not drain either)."""
    result["streaming"], result["fanout_steps"] = [], []
    rates = rate_ladder(args.rates, streaming_ceiling(result["raw"])[0])

    def plan_of(rate: float, seconds: float) -> StepPlan:
        return StepPlan(rate, seconds, args.probe_interval, args.drain_slack,
                        drain_timeout=max(60.0, 2 * seconds))  # fmt: skip

    if rates and args.warmup_seconds > 0:
        # The search stand-in is slow for its next bulks after a load (the initial sync, the
        # document build): lazy work the next writes start. Measured in steady state.
        step = run_step(plan_of(rates[0], args.warmup_seconds), *parts)
        log.info("warm-up at %s: %s", rates[0], json.dumps(step["latency"]))
        result["warmup"] = {"rate": rates[0], "seconds": args.warmup_seconds,
                            "drains": step["drains"], "latency": step["latency"]}  # fmt: skip
    for rate in rates:
        plan = plan_of(rate, args.step_seconds)
        step = run_step(plan, *parts)
        log.info("step %s: %s", rate, json.dumps(step))
        result["streaming"].append(step)
        if not step["drains"]:
            break
        if fanout is not None and rate in args.fanout_rates:
            step = fanout(plan)
            log.info("step %s beside the fan-out: %s", rate, json.dumps(step))
            result["fanout_steps"].append(step)


def run(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(args.state_dir).resolve() / f"run-{int(time.time())}"
    stack = LocalStack(run_dir / "stack", broker=args.broker, with_connect=False)
    urls = stack.start()
    if args.search_url:
        urls = dataclasses.replace(urls, search_url=args.search_url)
    mapping = load_mapping(MAPPING)
    connections = dataclasses.replace(
        urls.connections(run_dir / "warehouse"), search_client=args.search_client
    )
    result: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "options": {k: v for k, v in vars(args).items() if k != "output"},
    }
    job = capture = counter = sampler = workload = None
    try:
        result["rows"] = load_rows(urls.pg_url, args.customers, args.orders)
        fanout_rows = load_fanout(urls.pg_url, args.fanout) if args.fanout else None
        if fanout_rows is not None:
            result["fanout_rows"] = dataclasses.asdict(fanout_rows)
            result["rows"] = source_counts_of(urls.pg_url)
        log.info("loaded %s", result["rows"])
        services = {s.name: s.pid for s in stack.started()}
        search_pid = services.pop(SEARCH_SERVICE)
        if not args.search_url:  # the stand-in runs on these cores: count it
            services[SEARCH_SERVICE] = search_pid
        rates = raw.measure(urls.pg_url, mapping, urls.search_url, args.search_client,
                            urls.redis_url, run_dir / "raw-delta",
                            None if args.search_url else
                            lambda: tree_usage(search_pid).cpu_seconds)  # fmt: skip
        result["raw"] = {
            "search_updates_per_second": round(rates.search_updates, 1),
            "search_update_warmup_seconds": round(rates.search_update_warmup_seconds, 1),
            "search_cpu_seconds": rates.search_cpu_seconds,
            "search_update_bulks": {
                "count": len(rates.search_update_bulk_seconds),
                "max_seconds": round(max(rates.search_update_bulk_seconds), 3),
                # freshness percentiles the server's own re-index stalls alone imply
                "p99_wait_seconds": round(raw.wait_quantile(rates.search_update_bulk_seconds), 3),
                "p95_wait_seconds": round(
                    raw.wait_quantile(rates.search_update_bulk_seconds, 0.05), 3
                ),
            },
            "rows": rates.rows,
            "rows_per_second": {k: round(v, 1) for k, v in rates.per_sink.items()},
        }
        log.info("raw rates %s", result["raw"])
        trigger = (
            [] if args.trigger_seconds is None else ["--trigger-seconds", str(args.trigger_seconds)]
        )
        subset = ["--consumers", args.consumers] if args.consumers else []
        job_args = [*trigger, *subset, *args.job_arg]
        consumers = args.consumers.split(",") if args.consumers else consumer_names(mapping)
        job = start_job(connections, run_dir, job_args)
        assert job.process is not None
        counter = SinkCounter(mapping, connections)
        job_pid = job.process.pid
        started = time.monotonic()
        capture = start_capture(connections, run_dir, args.partitions)
        result["initial_sync"] = initial_sync(
            counter, capture, job, sum(result["rows"].values()), started,
            lambda: cpu_snapshot(job_pid, services),
        )  # fmt: skip
        log.info("initial sync %s", result["initial_sync"])
        documents = f"{DOCUMENTS_PREFIX}{DOCUMENT}" in consumers
        if documents:  # the ladder starts once its consumer is idle too
            result["documents_build"] = documents_build(
                urls.search_url, urls.pg_url, mapping, started, job
            )
            log.info("document index built %s", result["documents_build"])
        workload = MixedWorkload(urls.pg_url, args.customers, args.orders, PROBE_ROWS + 1)
        sampler = Sampler(mapping, connections, PROBE_ROWS)
        parts = StepParts(workload, sampler, job.process.pid, services, job_log(run_dir))
        fanout = None
        if documents and fanout_rows is not None:
            fanout = fanout_step(args, parts, connections, mapping, fanout_rows)
        ladder(args, result, parts, fanout)
        if args.rss_minutes > 0:
            plan = StepPlan(100, 60 * args.rss_minutes, args.probe_interval, args.drain_slack, 120)
            workload.steady = True  # the tables keep their size over the soak
            step = run_step(plan, *parts)
            result["rss_soak"] = {"minutes": args.rss_minutes, **rss_drift(step), "step": step}
        result["job_rss_mb_end"] = round(tree_usage(job.process.pid).rss_bytes / 2**20)
        result["workload"] = dict(workload.done)
    finally:
        stop_run((sampler, workload, counter), job, capture, stack)
        drop_run_data(run_dir, keep=args.keep_state)
        if not args.keep_state:  # the job's state but its logs (the JSON points at them)
            for kept in (run_dir / "state").iterdir() if (run_dir / "state").exists() else ():
                if kept.is_dir() and kept.name != "logs":
                    shutil.rmtree(kept, ignore_errors=True)
    result["job_log"] = str(job_log(run_dir)) if job else None
    result["targets"] = targets(result)
    result["targets_issue_28"] = clock_targets(result)
    issue_26 = fanout_target(result)
    result["targets_issue_26"] = [issue_26] if issue_26 is not None else []
    return result


def fanout_step(
    args: argparse.Namespace,
    parts: StepParts,
    connections: Connections,
    mapping: MappingFile,
    rows: FanoutRows,
) -> Callable[[StepPlan], dict[str, Any]]:
    """A plan's step again, beside the fan-out (e2ebench.fanout)."""
    index = mapping.documents[DOCUMENT].index
    return lambda plan: run_fanout_step(
        plan, parts, connections, index, rows, args.fanout_interval, FANOUT_SETTLE_TIMEOUT
    )


def source_counts_of(pg_url: str) -> dict[str, int]:
    with psycopg.connect(pg_url) as conn:
        return source_counts(conn)


def save(result: dict[str, Any], output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2, default=str))
    print(render(result))
    print(f"\nJSON: {output}")


def growth(args: argparse.Namespace, output: Path) -> list[dict[str, Any]]:
    """The run at 1x and at --scale x the rows, on each broker stand-in, one after the other
    (each on a stack of its own); each run's JSON beside `output`, named by broker and size."""
    results = []
    for broker in BROKERS:
        for scale in (1.0, args.scale):
            run_args = argparse.Namespace(**vars(args))
            run_args.broker = broker
            run_args.customers, run_args.orders = scaled(args, scale)
            try:
                result = run(run_args)
            except Exception:  # the other runs still compare
                log.exception("the %s run at %gx the rows failed", broker, scale)
                continue
            save(result, output.with_name(f"{output.stem}-{broker}-{scale:g}x.json"))
            results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("py4j", "urllib3", "opensearch", "elastic_transport"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    args = parse_args(argv)
    if args.compare:
        print(render_growth([json.loads(Path(name).read_text()) for name in args.compare]))
        return 0
    output = output_path(args.output, "e2e")
    if args.growth:
        print("\n" + render_growth(growth(args, output)))
    else:
        save(run(args), output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
