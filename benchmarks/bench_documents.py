"""Nested documents side by side with pgsync: the same schema, rows, workload and probes.

    .venv/bin/python benchmarks/bench_documents.py [--quick] [--customers N] [--orders M]
        [--products P] [--fanout F] [--rates 20,100] [--step-seconds S] [--tune KEY=VALUE ...]
        [--systems baseline,pgsync,pgsync-tuned,cdc-sync] [--output FILE]

Measures the demo mapping's document index `shop_order_documents` (mappings/shop.yaml: one
document per order not cancelled, its `customer`, its `lines` ordered by line_no, each line's
`product`) and pgsync on the same nested schema (e2ebench/pgsync.py `nested_schema_document`,
typed with cdc-sync's own index mapping). Each phase gets a fresh local stack loaded alike
(e2ebench/documents.py: N customers, M orders, P products, a customer with F orders, 1-5 lines
an order; no order is cancelled), then:
- baseline: no sync system; the workload at each rate and a burst of probe writes, to measure
  what they alone cost Postgres (e2ebench/pgload.py);
- pgsync (PyPI `pgsync` 7.x in its own venv; once with its defaults, once tuned as
  bench_pgsync.py) and cdc-sync (the sync job and the embedded capture, as bench_e2e.py; the
  job runs the document index's consumer only, the work pgsync does, unless `--with-flat`
  keeps the mapping's flat routes in search, Redis and Delta beside it):
  1. initial build: seconds until a search count of its index shows every document;
  2. freshness per rate: child changes only (line quantity updates, line inserts and deletes,
     product price and name updates, customer renames), commit -> visible in the order
     document p50/p99 from probes (e2ebench/docprobe.py), run_step's ladder;
  3. fan-out, after the first step (the same history for every system): the customer with F
     orders renamed, seconds until every order shows it; `--fanout-renames` (3) renames one
     after the other, the median kept (the local search server stalls now and then for
     seconds whoever writes: a single rename measured whether it met a stall);
  4. (cdc-sync) the server's raw rewrite rate of a sample of the index's documents, into
     scratch indices, no job (e2ebench/docserver.py): a rate needing more documents/s than
     that (documents a change reaches, from a drained step's batch lines) cannot drain on this
     server for any system (e2ebench/docbound.py);
  5. Postgres per change followed (workload and probes) over each step's window (workload,
     drain, settle; a system's steady background such as heartbeats counts): scans on the four
     tables, scans on every table, rows read, transactions, less the baseline's cost of the
     same changes (its stats, its reasoning: e2ebench/pgload.py).
Prints the figures with the ratios cdc-sync / pgsync and what pgsync cannot express, and writes
JSON (benchmarks/results/documents-<date>.json unless --output). Every process a phase starts
is stopped by PID when the phase ends, also on errors.

pgsync's schema cannot express the root filter (it indexes every order: the rows and workload
hold no cancelled order, so both indices hold the same orders) nor the lines' order (JSON_AGG's
order); its documents also carry its `_meta` keys.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # tests.*, e2ebench.*

from bench_e2e import PROBE_ROWS, SEARCH_SERVICE, job_log  # noqa: E402
from bench_pgsync import (  # noqa: E402
    TUNED,
    add_run_options,
    fresh_stack,
    run_header,
    start_process,
    tuning_setting,
)
from e2ebench import pgsync  # noqa: E402
from e2ebench.docprobe import DocumentSampler, count_documents  # noqa: E402
from e2ebench.docreport import bounds, compare, render  # noqa: E402
from e2ebench.docserver import raw_rewrite_rates  # noqa: E402
from e2ebench.documents import (  # noqa: E402
    DOCUMENT,
    ChildWorkload,
    DocumentRows,
    document_properties,
    load_document_rows,
)
from e2ebench.ladder import StepPlan, run_step  # noqa: E402
from e2ebench.load import PRODUCTS  # noqa: E402
from e2ebench.observe import batch_lines, cpu_snapshot, stage_breakdown, tree_usage  # noqa: E402
from e2ebench.pgload import Counters, delta, read_counters  # noqa: E402
from e2ebench.pipeline import (  # noqa: E402
    CONNECTOR,
    MAPPING,
    drop_run_data,
    start_capture,
    start_job,
    stop_run,
)
from e2ebench.report import output_path  # noqa: E402

from cdc_sync.localstack.stack import StackUrls  # noqa: E402
from cdc_sync.mapping import MappingFile, load_mapping  # noqa: E402

log = logging.getLogger("bench_documents")
SYSTEMS = ("baseline", "pgsync", "pgsync-tuned", "cdc-sync")
PROBE_BURST = 3 * (PROBE_ROWS + 1)  # baseline probe writes: each slot three times
BUILD_TIMEOUT = 1800.0
FANOUT_TIMEOUT = 600.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 50 customers, 500 orders, 100 products, fan-out 100, "
                        "10 s steps")  # fmt: skip
    parser.add_argument("--customers", type=int, help="customers (5000)")
    parser.add_argument("--orders", type=int, help="orders (default 10 x customers)")
    parser.add_argument(
        "--products", type=int, help=f"products (default = customers, at least {PRODUCTS})"
    )
    parser.add_argument("--fanout", type=int, help="orders of the fan-out customer (1000)")
    parser.add_argument(
        "--fanout-renames", type=int, default=3,
        help="renames of the fan-out customer, one after the other; the median is kept (3)",
    )  # fmt: skip
    parser.add_argument("--rates", default="20,100", help="changes/s ladder (20,100)")
    parser.add_argument("--step-seconds", type=float, help="seconds per step (60)")
    add_run_options(parser, SYSTEMS)
    parser.add_argument(
        "--raw-sample",
        type=int,
        default=10_000,
        help="documents of cdc-sync's index rewritten raw into scratch indices after its steps "
        "(10,000): the server's own rate for them, against which a rate's bound is read",
    )
    parser.add_argument("--state-dir", default=".cdc-sync/bench-documents")
    parser.add_argument("--keep-state", action="store_true", help="keep each phase's stack data")
    parser.add_argument(
        "--with-flat",
        action="store_true",
        help="cdc-sync also keeps the flat routes (search, Redis, Delta) beside the documents",
    )
    parser.add_argument(
        "--output", help="JSON path (default benchmarks/results/documents-<date>.json)"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.customers = args.customers or (50 if quick else 5000)
    args.orders = args.orders or 10 * args.customers
    args.products = max(args.products or args.customers, PRODUCTS)
    args.fanout = args.fanout or (100 if quick else 1000)
    args.step_seconds = args.step_seconds or (10.0 if quick else 60.0)
    args.rates = [] if args.rates == "none" else [float(r) for r in args.rates.split(",")]
    args.systems = args.systems.split(",")
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"--systems: unknown {sorted(unknown)}; expected some of {SYSTEMS}")
    if args.fanout_renames < 1:
        parser.error("--fanout-renames: at least 1")
    if args.customers <= PROBE_ROWS + 1 or args.orders <= PROBE_ROWS + 1:
        parser.error(f"--customers and --orders: more than {PROBE_ROWS + 1} (the probes' rows)")
    args.tuning = TUNED if args.tune is None else dict(tuning_setting(s) for s in args.tune)
    args.document = DOCUMENT
    return args


def load(args: argparse.Namespace, mapping: MappingFile, urls: StackUrls) -> DocumentRows:
    spec = mapping.documents[DOCUMENT]
    rows = load_document_rows(
        urls.pg_url, spec, args.customers, args.orders, args.products, args.fanout
    )
    log.info("loaded %s", rows)
    return rows


def probing(
    args: argparse.Namespace, mapping: MappingFile, urls: StackUrls, index: str
) -> tuple[DocumentSampler, ChildWorkload]:
    """The sampler (it picks the probes' rows) and the workload that leaves them alone."""
    sampler = DocumentSampler(mapping, urls.connections(), PROBE_ROWS, index)
    workload = ChildWorkload(
        urls.pg_url, args.customers, args.orders, PROBE_ROWS + 1,
        products=args.products, reserved=sampler.reserved,
    )  # fmt: skip
    return sampler, workload


def ladder(
    args: argparse.Namespace,
    pg_url: str,
    workload: ChildWorkload,
    sampler: DocumentSampler,
    pid: int,
    services: dict[str, int],
    detail_log: Path,
    rows: DocumentRows,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """run_step at each rate, Postgres's counters read before the first and after each (its
    delta from the read before); stops after a step that does not drain (as bench_pgsync).
    The fan-out follows the first step (or the build, with no rates), its delta from that
    step's read: the same history for every system, whichever steps each goes on to run
    (pgsync stops after 20/s; a fan-out behind the 100/s step's backlog measured that backlog,
    not the fan-out)."""
    steps: list[dict[str, Any]] = []
    reading = read_counters(pg_url)
    found: dict[str, Any] | None = None
    for rate in args.rates:
        if steps and found is None:
            found = fanout(sampler, rows, pg_url, reading, args.fanout_renames)
            reading = read_counters(pg_url)
        plan = StepPlan(rate, args.step_seconds, args.probe_interval, args.drain_slack,
                        drain_timeout=max(60.0, 2 * args.step_seconds))  # fmt: skip
        step = run_step(plan, workload, sampler, pid, services, detail_log)
        after = read_counters(pg_url)
        step["postgres"], reading = delta(reading, after), after
        step["probes_written"] = step["latency"]["probes"] + 1  # and the drain probe
        step["latency_by_kind"] = sampler.by_kind
        log.info("step %s: %s", rate, json.dumps(step["latency"]))
        steps.append(step)
        if not step["drains"]:
            break
    return steps, found or fanout(sampler, rows, pg_url, reading, args.fanout_renames)


def fanout(
    sampler: DocumentSampler, rows: DocumentRows, pg_url: str, reading: Counters, renames: int
) -> dict[str, Any]:
    """The fan-out customer renamed `renames` times, each after the last one showed: seconds
    until the first and every order shows it, the median of the renames (each in `renames`);
    Postgres's counters from `reading` over all of them (the UPDATEs' own scans included)."""
    each = [sampler.fanout(rows.fanout_customer, FANOUT_TIMEOUT) for _ in range(renames)]
    found = {
        "orders": each[0]["orders"],
        "first_seconds": median_of(r["first_seconds"] for r in each),
        "all_seconds": median_of(r["all_seconds"] for r in each),
        "missing": max(r["missing"] for r in each),
        "renames": each,
    }
    found["postgres"] = delta(reading, read_counters(pg_url))
    log.info("fan-out %s", {k: v for k, v in found.items() if k != "postgres"})
    return found


def median_of(seconds: Iterable[float | None]) -> float | None:
    """The median, or None when any is (a rename that never showed everywhere)."""
    found = list(seconds)
    known = [s for s in found if s is not None]
    return statistics.median(known) if len(known) == len(found) else None


def sample_document(sampler: DocumentSampler) -> dict[str, Any] | None:
    """Order 1's document as the index holds it (to compare the two systems' contents)."""
    docs = sampler.search.mget(sampler.alias, ["1"])
    return docs[0].get("_source") if docs and docs[0].get("found") else None


def run_baseline(args: argparse.Namespace, mapping: MappingFile, run_dir: Path) -> dict[str, Any]:
    """The workload and probe writes with no sync system: what they alone cost Postgres."""
    stack, urls = fresh_stack(args, run_dir)
    result: dict[str, Any] = {"steps": []}
    sampler = workload = None
    try:
        result["rows"] = load(args, mapping, urls).counts
        sampler, workload = probing(args, mapping, urls, mapping.documents[DOCUMENT].index)
        postgres = next(s.pid for s in stack.started() if s.name == "postgres")
        reading = read_counters(urls.pg_url)
        for rate in args.rates:
            cpu = tree_usage(postgres).cpu_seconds
            changes, seconds = workload.run(rate, args.step_seconds, threading.Event())
            cpu = tree_usage(postgres).cpu_seconds - cpu
            after_workload = read_counters(urls.pg_url)
            probes = sampler.write_unobserved(PROBE_BURST)
            after_probes = read_counters(urls.pg_url)
            result["steps"].append({
                "target_rate": rate,
                "changes": changes,
                "achieved_rate": round(changes / seconds, 1),
                "workload": {"postgres": delta(reading, after_workload),
                             "postgres_cpu_seconds": round(cpu, 2)},
                "probes": probes,
                "probe_burst": {"postgres": delta(after_workload, after_probes)},
            })  # fmt: skip
            reading = after_probes
            log.info("baseline %s: %d changes", rate, changes)
        result["workload"] = dict(workload.done)
    finally:
        for closing in (sampler, workload):
            if closing is not None:
                closing.close()
        stack.stop()
        drop_run_data(run_dir, ("stack",), keep=args.keep_state)
    return result


def run_pgsync(
    args: argparse.Namespace, mapping: MappingFile, run_dir: Path, tuning: dict[str, str]
) -> dict[str, Any]:
    spec = mapping.documents[DOCUMENT]
    bin_dir = pgsync.ensure_venv()
    result: dict[str, Any] = {"version": pgsync.installed_version(bin_dir), "settings": tuning}
    stack, urls = fresh_stack(args, run_dir)  # stopped in the `finally` below, from here on
    deployment = workload = sampler = None
    try:
        rows = load(args, mapping, urls)
        result["rows"] = rows.counts
        index = pgsync.document_index_name(spec)
        env = pgsync.environment(
            urls.pg_url, urls.search_url, urls.redis_url, run_dir / "pgsync", tuning
        )
        deployment = pgsync.PgSync(
            bin_dir, run_dir / "pgsync", env, urls.search_url, indices=(index,)
        )
        properties = document_properties(urls.pg_url, mapping, CONNECTOR, DOCUMENT)
        database = urls.pg_url.rsplit("/", 1)[1]
        deployment.write_schema(pgsync.nested_schema_document(spec, database, properties))
        bootstrap_seconds = deployment.bootstrap()
        started = time.monotonic()
        deployment.start_daemon()
        assert deployment.pid is not None
        services = {
            s.name: s.pid for s in stack.started() if s.name in (SEARCH_SERVICE, "postgres")
        }
        cpu_before = {
            n: tree_usage(p).cpu_seconds for n, p in [("pgsync", deployment.pid), *services.items()]
        }
        # pgsync cannot filter: it indexes every order (the rows hold no cancelled one)
        deployment.wait_documents(rows.roots, timeout=BUILD_TIMEOUT)
        seconds = time.monotonic() - started  # from the spawn: its start-up counts
        result["initial_build"] = {
            "documents": rows.roots,
            "roots": rows.roots,
            "bootstrap_seconds": round(bootstrap_seconds, 1),
            "seconds": round(seconds, 1),
            "documents_per_second": round(rows.roots / seconds, 1),
            "cpu_seconds": {
                n: round(tree_usage(p).cpu_seconds - cpu_before[n], 1)
                for n, p in [("pgsync", deployment.pid), *services.items()]
            },
        }
        log.info("%s initial build %s", index, result["initial_build"])
        sampler, workload = probing(args, mapping, urls, index)
        result["sample_document"] = sample_document(sampler)
        result["streaming"], result["fanout"] = ladder(
            args, urls.pg_url, workload, sampler, deployment.pid, services, deployment.log, rows
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
    """The job and capture as bench_e2e's; the build timed on the document index's alias."""
    spec = mapping.documents[DOCUMENT]
    stack, urls = fresh_stack(args, run_dir)
    connections = urls.connections(run_dir / "warehouse")
    result: dict[str, Any] = {}
    job = capture = sampler = workload = None
    try:
        rows = load(args, mapping, urls)
        result["rows"] = rows.counts
        services = {s.name: s.pid for s in stack.started()}
        consumers = [] if args.with_flat else ["--consumers", f"documents:{DOCUMENT}"]
        job = start_job(connections, run_dir, [*consumers, *args.job_arg])
        assert job.process is not None
        job_pid = job.process.pid
        cpu_before = cpu_snapshot(job_pid, services)
        wall_started, started = time.time(), time.monotonic()
        capture = start_capture(connections, run_dir)
        deadline = started + BUILD_TIMEOUT
        while (count := count_documents(urls.search_url, spec.index)) < rows.expected:
            if job.process.poll() is not None:
                raise RuntimeError(f"the sync job exited in the initial build; see {run_dir}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{spec.index}: {count} of {rows.expected} documents")
            time.sleep(0.2)
        seconds = time.monotonic() - started
        cpu_after = cpu_snapshot(job_pid, services)
        result["initial_build"] = {
            "documents": rows.expected,
            "roots": rows.roots,
            "seconds": round(seconds, 1),
            "documents_per_second": round(rows.expected / seconds, 1),
            "cpu_seconds": {n: round(cpu_after[n] - cpu_before[n], 1) for n in cpu_after},
            # Where the build's seconds went: the job's batches (snapshot rows merged, then the
            # batch that ends the snapshot renders every root), from its batch lines.
            "stages": stage_breakdown(batch_lines(job_log(run_dir)), wall_started, time.time()),
        }
        log.info("%s initial build %s", spec.index, result["initial_build"])
        sampler, workload = probing(args, mapping, urls, spec.index)
        result["sample_document"] = sample_document(sampler)
        result["streaming"], result["fanout"] = ladder(
            args, urls.pg_url, workload, sampler, job_pid, services, job_log(run_dir), rows
        )
        result["workload"] = dict(workload.done)
        result["log"] = str(job_log(run_dir))
        # The same documents on the same server, no job: what a rate's bound is read against.
        result["raw_rewrites"] = raw_rewrite_rates(
            urls.search_url, services[SEARCH_SERVICE], spec.index, args.raw_sample
        )
        log.info("raw rewrites of %s: %s", spec.index, result["raw_rewrites"])
    finally:
        stop_run((sampler, workload), job, capture, stack)
        drop_run_data(run_dir, keep=args.keep_state)
    return result


def main(argv: list[str] | None = None) -> int:
    start_process()
    args = parse_args(argv)
    mapping = load_mapping(MAPPING)
    base = Path(args.state_dir).resolve() / f"run-{int(time.time())}"
    result: dict[str, Any] = {
        **run_header(args),
        "baseline": None,
        "systems": {},
    }
    output = output_path(args.output, "documents")
    # pgsync before cdc-sync: the cdc-sync phase starts Debezium's JVM in this process, for good.
    for name in args.systems:
        log.info("== %s", name)
        if name == "baseline":
            result["baseline"] = run_baseline(args, mapping, base / name)
        elif name == "cdc-sync":
            result["systems"][name] = run_cdc_sync(args, mapping, base / name)
        else:
            tuning = {} if name == "pgsync" else args.tuning
            result["systems"][name] = run_pgsync(args, mapping, base / name, tuning)
        # Written after each phase: a failure later keeps what was measured.
        result["comparison"] = compare(result)
        result["drain_bounds"] = bounds(result)
        output.write_text(json.dumps(result, indent=2, default=str))
    print(render(result))
    print(f"\nJSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
