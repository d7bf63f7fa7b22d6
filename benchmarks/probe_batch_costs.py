"""Per-batch fixed costs at a low change rate, A/B against an earlier commit, in one run.

    .venv/bin/python benchmarks/probe_batch_costs.py [--baseline REV] [--rounds 2]
        [--rate 20] [--seconds 60] [--customers 500] [--orders 5000] [--py-spy SECONDS]

On a local stack of its own (as bench_e2e starts it, small by default) it loads the shop rows,
starts the embedded capture and the job, waits for the initial sync, then per round runs each
variant's job on the same checkpoint, one after the other: the code at `--baseline` (exported
with `git archive` into a temporary directory, put first on the job's PYTHONPATH) and this
worktree's. Each variant drives `--rate` changes/s for `--seconds` with the bench's probes and
reads the job's own per-batch stage seconds (`BatchMetrics.summary()` plus Spark's phases, by
e2ebench's parser). `--py-spy S` also samples the job's whole process tree (Python driver and
the source's planner worker) for S seconds mid-step and prints the busiest frames of ours.
Variants alternate within each round so machine noise hits both; compare shares, not seconds.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # tests.*, e2ebench.*

from e2ebench.consumer_report import stage_names  # noqa: E402
from e2ebench.ladder import StepPlan, run_step  # noqa: E402
from e2ebench.load import MixedWorkload, load_rows  # noqa: E402
from e2ebench.observe import process_tree  # noqa: E402
from e2ebench.pipeline import (  # noqa: E402
    MAPPING,
    SinkCounter,
    drop_run_data,
    start_capture,
    start_job,
    stop_run,
)
from e2ebench.sampler import Sampler  # noqa: E402

from cdc_sync.localstack.stack import LocalStack  # noqa: E402
from cdc_sync.mapping import load_mapping  # noqa: E402
from tests.adversarial.pipeline import JobProcess  # noqa: E402

log = logging.getLogger("probe_batch_costs")
PROBE_ROWS = 32
CURRENT = "worktree"
# py-spy names files relative to sys.path: cdc_sync's subpackages, and the source's planner.
OURS = ("(job/", "(source/", "(sinks/", "(core/", "(debezium/", "(schema/",
        "python_streaming_source_runner")  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--baseline", help="git revision to compare against (default: none)")
    parser.add_argument(
        "--candidate", help="git revision to measure instead of the worktree's files as they are"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=20.0, help="changes/s")
    parser.add_argument("--seconds", type=float, default=60.0, help="workload seconds a step")
    parser.add_argument("--settle", type=float, default=15.0, help="idle seconds after a start")
    parser.add_argument("--customers", type=int, default=500)
    parser.add_argument("--orders", type=int, default=5000)
    parser.add_argument("--py-spy", type=float, default=0.0, help="seconds to sample (0: off)")
    parser.add_argument("--state-dir", default=".cdc-sync/probe-batch")
    parser.add_argument("--output", help="JSON path (default: beside the run's logs)")
    return parser.parse_args(argv)


def export_revision(revision: str, into: Path) -> Path:
    """`sync_jobs/` as of `revision`, for the job's PYTHONPATH."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "sync_jobs"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "sync_jobs"


def use_sources(job: JobProcess, sources: Path) -> None:
    """Put `sources` before this worktree's sync_jobs (the editable install's .pth comes after
    PYTHONPATH; Spark passes PYTHONPATH on to its Python workers)."""
    parts = job.env["PYTHONPATH"].split(os.pathsep)
    job.env["PYTHONPATH"] = os.pathsep.join([str(sources), *parts])


def sample_tree(pid: int, seconds: float, output: Path) -> list[subprocess.Popen[bytes]]:
    """py-spy on each Python process of the job's tree (the driver, and the source's planner
    worker that Spark's JVM runs), collapsed stacks, one file each beside `output`."""
    py_spy = Path(sys.executable).parent / "py-spy"
    spies = []
    for member in process_tree(pid):
        try:
            command = Path(f"/proc/{member}/comm").read_text().strip()
        except OSError:
            continue
        if not command.startswith("python"):
            continue
        out = output.with_name(f"{output.stem}-{member}.txt")
        argv = [str(py_spy), "record", "--pid", str(member), "--idle", "--rate", "50", "--format",
                "raw", "--duration", str(int(seconds)), "--output", str(out)]  # fmt: skip
        spies.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


def busiest_frames(collapsed: Path, top: int = 30) -> list[tuple[str, int]]:
    """Inclusive samples per frame of ours (`OURS`), busiest first; idle samples included, so a
    frame waiting on the broker counts as much as one computing."""
    counts: collections.Counter[str] = collections.Counter()
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, samples = line.rpartition(" ")
        if not samples.isdigit():
            continue
        frames = {frame for frame in stack.split(";") if any(part in frame for part in OURS)}
        for frame in frames:
            counts[frame] += int(samples)
    return counts.most_common(top)


def run_variant(
    name: str,
    job: JobProcess,
    workload: MixedWorkload,
    sampler: Sampler,
    args: argparse.Namespace,
    run_dir: Path,
    round_no: int,
) -> dict[str, Any]:
    job.start()
    job.wait_up(timeout_seconds=300)
    time.sleep(args.settle)
    assert job.process is not None
    spies: list[subprocess.Popen[bytes]] = []
    spy_out = run_dir / f"py-spy-{name}-{round_no}.txt"
    if args.py_spy > 0:

        def delayed() -> None:
            time.sleep(max(0.0, (args.seconds - args.py_spy) / 2))
            assert job.process is not None
            spies.extend(sample_tree(job.process.pid, args.py_spy, spy_out))

        starter = threading.Thread(target=delayed, daemon=True)
        starter.start()
    plan = StepPlan(args.rate, args.seconds, 0.5, 10.0, drain_timeout=60.0)
    step = run_step(plan, workload, sampler, job.process.pid, {}, run_dir / "state/logs/job.log")
    for spy in spies:
        spy.wait(timeout=60)
    job.stop()
    job.process = None  # the same JobProcess starts again on the same checkpoint
    step["variant"], step["round"] = name, round_no
    step["py_spy_top"] = {
        path.name: busiest_frames(path) for path in sorted(run_dir.glob(f"{spy_out.stem}-*.txt"))
    }
    return step


def render(steps: list[dict[str, Any]]) -> str:
    """A row per variant, round and consumer of the log (each runs its own query)."""
    names = stage_names(steps)
    head = [
        "variant",
        "round",
        "consumer",
        "batches",
        "rec/batch",
        "interval",
        "p50",
        "p99",
        *names,
    ]
    lines = [" | ".join(head)]
    for step in steps:
        for consumer, stages in step["stages"].items():
            means = stages.get("stage_mean_seconds", {})
            latency = step["latency"].get(consumer) or step["latency"].get("all", {})
            row = [step["variant"], str(step["round"]), consumer, str(stages.get("batches", 0)),
                   f"{stages.get('records_per_batch', 0):.0f}",
                   str(stages.get("interval_mean_seconds")),
                   str(latency.get("p50")), str(latency.get("p99")),
                   *(f"{means[n]:.3f}" if n in means else "-" for n in names)]  # fmt: skip
            lines.append(" | ".join(row))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("py4j", "urllib3", "opensearch", "elastic_transport"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    args = parse_args(argv)
    run_dir = Path(args.state_dir).resolve() / f"run-{int(time.time())}"
    stack = LocalStack(run_dir / "stack", broker="tansu", with_connect=False)
    urls = stack.start()
    mapping = load_mapping(MAPPING)
    connections = urls.connections(run_dir / "warehouse")
    scratch = Path(tempfile.mkdtemp(prefix="probe-batch-"))
    variants: dict[str, Path | None] = {}
    if args.baseline:
        variants[args.baseline] = export_revision(args.baseline, scratch / "baseline")
    if args.candidate:
        variants[args.candidate] = export_revision(args.candidate, scratch / "candidate")
    else:
        variants[CURRENT] = None
    steps: list[dict[str, Any]] = []
    job = capture = counter = sampler = workload = None
    try:
        rows = load_rows(urls.pg_url, args.customers, args.orders)
        job = start_job(connections, run_dir, [])  # this worktree's code, for the initial sync
        counter = SinkCounter(mapping, connections)
        capture = start_capture(connections, run_dir)
        counter.wait_all(sum(rows.values()), timeout=900, started=time.monotonic())
        job.stop()
        job.process = None
        base_env = dict(job.env)
        workload = MixedWorkload(urls.pg_url, args.customers, args.orders, PROBE_ROWS + 1)
        sampler = Sampler(mapping, connections, PROBE_ROWS)
        for round_no in range(args.rounds):
            order = list(variants.items())
            if round_no % 2:
                order.reverse()
            for name, sources in order:
                job.env = dict(base_env)
                if sources is not None:
                    use_sources(job, sources)
                step = run_variant(name, job, workload, sampler, args, run_dir, round_no)
                log.info("%s round %d: %s", name, round_no, json.dumps(step["stages"]))
                steps.append(step)
    finally:
        stop_run((sampler, workload, counter), job, capture, stack)
        drop_run_data(run_dir)
        shutil.rmtree(scratch, ignore_errors=True)
    output = Path(args.output) if args.output else run_dir / "probe.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"options": vars(args), "steps": steps}, indent=2, default=str))
    print(render(steps))
    for step in steps:
        for name, frames in step.get("py_spy_top", {}).items():
            for frame, samples in frames[:25]:
                print(f"{name}: {samples:6d} {frame}")
    print(f"JSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
