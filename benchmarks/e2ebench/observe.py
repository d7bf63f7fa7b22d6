"""What the benchmark reads besides latency: the job's CPU and RSS (its whole process tree:
Python driver, JVM, Python workers, from /proc) and the per-batch stage times it logs."""

from __future__ import annotations

import itertools
import os
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (index 0 is the state, field 3);
    OSError once the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _own_cpu(fields: list[str]) -> float:
    """utime + stime, in seconds."""
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _reaped_cpu(fields: list[str]) -> float:
    """cutime + cstime: the children this process waited for, in seconds."""
    return (int(fields[13]) + int(fields[14])) / CLOCK_TICKS


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(_stat(entry.name)[1])
        except OSError:
            continue
        tree[ppid].append(int(entry.name))
    return tree


def process_tree(pid: int) -> list[int]:
    tree = _children()
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += tree.get(current, [])
    return found


def cpu_snapshot(job_pid: int, services: dict[str, int]) -> dict[str, float]:
    """Cumulative CPU seconds per part of the pipeline: the job's process tree, the embedded
    capture (this process: Debezium's JVM runs in it) and each service of the stack."""
    found = {"job": tree_usage(job_pid).cpu_seconds, "capture": _own_cpu(_stat("self"))}
    found.update(job_cpu_by_part(job_pid))
    found.update({name: tree_usage(pid).cpu_seconds for name, pid in services.items()})
    return found


JOB_PARTS = ("job: python driver", "job: spark jvm", "job: python workers")


def job_cpu_by_part(job_pid: int) -> dict[str, float]:
    """The job's CPU seconds split by process: the Python driver (`job_pid`), Spark's JVM, and
    the Python worker processes (the daemon and the workers it forked, reaped ones included)."""
    parts = dict.fromkeys(JOB_PARTS, 0.0)
    for member in process_tree(job_pid):
        try:
            fields = _stat(member)
            command = Path(f"/proc/{member}/comm").read_text().strip()
        except OSError:
            continue
        if member == job_pid:  # its reaped children: the JVM, once the job ends
            parts[JOB_PARTS[0]] += _own_cpu(fields)
        elif command == "java":  # the python daemon is its child, and reaps the workers
            parts[JOB_PARTS[1]] += _own_cpu(fields)
        else:
            parts[JOB_PARTS[2]] += _own_cpu(fields) + _reaped_cpu(fields)
    return parts


class CpuTracker:
    """CPU seconds a process tree spent since the first sample, exited members included: each
    member's own CPU as last seen, by (pid, start time). Spark's Python workers come and go,
    and not every one is reaped into a parent's counters (live totals went negative). Sample
    often: a member that starts and exits between two samples is missed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[tuple[int, str], float] = {}

    def sample(self) -> float:
        for member in process_tree(self.pid):
            try:
                fields = _stat(member)
            except OSError:
                continue
            key = (member, fields[19])  # starttime: a reused pid is another process
            self.seen[key] = _own_cpu(fields)
        return sum(self.seen.values())


@dataclass(frozen=True)
class Usage:
    cpu_seconds: float
    rss_bytes: int


def tree_usage(pid: int) -> Usage:
    """CPU seconds and RSS of `pid` and its descendants. The CPU counts user + system time of
    the live processes and of the children they waited for; a child that exits unreaped takes
    its time with it (`CpuTracker` keeps it, for the streaming steps)."""
    cpu, rss = 0.0, 0
    for member in process_tree(pid):
        try:
            fields = _stat(member)
            pages = int(Path(f"/proc/{member}/statm").read_text().split()[1])
        except OSError:
            continue  # exited meanwhile
        cpu += _own_cpu(fields) + _reaped_cpu(fields)
        rss += pages * PAGE_BYTES
    return Usage(cpu, rss)


# cdc_sync.job.settle.applier.BatchMetrics.summary(), after the logging prefix (cdc_sync.cli):
# "<date> <time>,<ms> INFO cdc_sync.job.settle.applier: search batch 7: records=180 ...
# documents=0 ... in 1.2s (...)" (the consumer of the log first: job.consumers).
BATCH_LINE = re.compile(
    r"^(?P<when>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO cdc_sync\.job\.settle\.applier: "
    r"(?P<consumer>\S+) batch (?P<batch>\d+): records=(?P<records>\d+) .* "
    r"in (?P<seconds>[\d.]+)s \((?P<stages>.*)\)$"
)
DOCUMENTS = re.compile(r" documents=(\d+) ")
STAGE = re.compile(r"(\w+):([\d.]+)s")
# cdc_sync.job.observe.query_progress.progress_line: Spark's phases of the same batch, in
# milliseconds.
SPARK_LINE = re.compile(
    r"INFO cdc_sync\.job\.observe\.query_progress: (?P<consumer>\S+) batch (?P<batch>\d+): "
    r"spark (?P<total>\d+)ms \((?P<phases>.*)\)"
)
SPARK_PHASE = re.compile(r"(\w+):(\d+)ms")


@dataclass(frozen=True)
class BatchLine:
    logged_at: float  # epoch seconds
    consumer: str  # the consumer of the log whose batch it is (job.consumers)
    batch: int
    records: int
    applier_seconds: float
    stages: dict[str, float]
    documents: int = 0  # documents rendered (a document consumer's batch)


# Spark's phases between reading the end offsets and running `foreachBatch` (planning, the
# offset log): a change the end offsets took in waits for these before any sink is written.
SPARK_PLAN_PHASES = ("queryPlanning", "walCommit")
# The stages Spark's progress line adds to a batch's (seconds): its own time outside
# `foreachBatch` (what a batch holding no record costs it: end offsets, planning, offset and
# commit logs), the part of it before `foreachBatch`, and the end offsets alone (the source's
# `latestOffset`: what asks the broker, and may grow with its log).
SPARK_STAGES = ("spark", "spark_plan", "latest_offset")


def spark_overheads(text: str) -> dict[tuple[str, int], dict[str, float]]:
    """Per (consumer, batch), Spark's own seconds of the batch (SPARK_STAGES)."""
    found: dict[tuple[str, int], dict[str, float]] = {}
    for match in SPARK_LINE.finditer(text):
        phases = {name: int(ms) for name, ms in SPARK_PHASE.findall(match["phases"])}
        found[(match["consumer"], int(match["batch"]))] = {
            "spark": (int(match["total"]) - phases.get("addBatch", 0)) / 1000,
            "spark_plan": sum(phases.get(name, 0) for name in SPARK_PLAN_PHASES) / 1000,
            "latest_offset": phases.get("latestOffset", 0) / 1000,
        }
    return found


def batch_lines(log: Path) -> list[BatchLine]:
    found: list[BatchLine] = []
    text = log.read_text(errors="replace")
    spark = spark_overheads(text)
    for line in text.splitlines():
        match = BATCH_LINE.match(line)
        if match is None:
            continue
        stages = {name: float(secs) for name, secs in STAGE.findall(match["stages"])}
        stages.update(spark.get((match["consumer"], int(match["batch"])), {}))
        when = datetime.strptime(match["when"], "%Y-%m-%d %H:%M:%S,%f")
        found.append(
            BatchLine(
                when.timestamp(),  # naive: local time, as logging writes it
                match["consumer"],
                int(match["batch"]),
                int(match["records"]),
                float(match["seconds"]),
                stages,
                int(documents[1]) if (documents := DOCUMENTS.search(line)) else 0,
            )
        )
    return found


def stage_breakdown(lines: list[BatchLine], start: float, end: float) -> dict[str, dict[str, Any]]:
    """Per consumer of the log, its batches logged in [start, end): count, records, mean,
    median and max seconds per stage, `interval` (the mean time between its batch ends:
    trigger, Spark's bookkeeping and every stage). A stage's figures are over the batches that
    ran it (a batch of heartbeats alone writes no sink), beside how many did
    (`stage_batches`)."""
    by_consumer: dict[str, list[BatchLine]] = defaultdict(list)
    for b in lines:
        if start <= b.logged_at < end:
            by_consumer[b.consumer].append(b)
    return {name: _breakdown(window) for name, window in sorted(by_consumer.items())}


def _breakdown(window: list[BatchLine]) -> dict[str, Any]:
    ran: dict[str, list[float]] = defaultdict(list)
    for b in window:
        for name, secs in b.stages.items():
            ran[name].append(secs)
    gaps = [b.logged_at - a.logged_at for a, b in itertools.pairwise(window)]
    found = {
        "batches": len(window),
        "records_per_batch": sum(b.records for b in window) / len(window),
        "max_records": max(b.records for b in window),
        "stage_mean_seconds": {n: round(sum(s) / len(s), 3) for n, s in ran.items()},
        "stage_median_seconds": {n: round(statistics.median(s), 3) for n, s in ran.items()},
        "stage_max_seconds": {n: round(max(s), 3) for n, s in ran.items()},
        "stage_batches": {n: len(s) for n, s in ran.items()},
        "interval_mean_seconds": round(sum(gaps) / len(gaps), 3) if gaps else None,
    }
    if any(b.documents for b in window):
        found["documents"] = sum(b.documents for b in window)
    return found
