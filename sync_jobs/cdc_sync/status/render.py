"""The status screen (plain text, fits a terminal) and its JSON twin."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from cdc_sync.status.model import ConsumerSnapshot, PartitionStatus, Snapshot
from cdc_sync.status.verdict import Verdict


def lsn(version: int | None) -> str:
    """A version is a WAL position: shown the way Postgres writes LSNs (0/1A2B3C)."""
    if version is None or version < 0:
        return "-"
    return f"{version >> 32:X}/{version & 0xFFFFFFFF:X}"


def size(value: int | None) -> str:
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(amount) < 1024 or unit == "GB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return str(value)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def clock(epoch_seconds: float | None) -> str:
    if epoch_seconds is None:
        return "-"
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def render(s: Snapshot, verdict: Verdict) -> str:
    lines = [
        f"cdc-sync status  {s.mapping}  {clock(s.taken_at)} UTC  checkpoint {s.checkpoint}",
        *(
            f"verdict: {line}" if i == 0 else f"         {line}"
            for i, line in enumerate(verdict.lines())
        ),
        "",
        f"capture   {_capture(s)}",
        f"slot      {_slot(s)}",
        f"dead letters  {'?' if s.dead_letters is None else s.dead_letters} record(s) "
        f"on {s.dead_letter_topic}",
    ]
    for c in s.consumers:
        lines += [
            "",
            f"consumer {c.name}",
            f"  job     {_job(s, c)}",
            f"  sinks   {_sinks(c)}",
            f"  batch   {_batch(s, c)}",
            f"  stages  {_stages(c)}",
        ]
    lines += ["", *_partitions(s)]
    lines += [
        "",
        f"{'sink':<7} {'table':<26} {'version':>12} {'source commit (UTC)':>20} {'age':>7}",
    ]
    for w in (w for c in s.consumers for w in c.watermarks):
        committed = None if w.source_ts_ms is None else w.source_ts_ms / 1000
        lines.append(
            f"{w.sink:<7} {w.table:<26} {lsn(w.version):>12} {clock(committed):>20} "
            f"{age(None if committed is None else s.taken_at - committed):>7}"
        )
    return "\n".join(lines)


def _partitions(s: Snapshot) -> list[str]:
    """One row per topic partition: its end offset, then per consumer the records it has still
    to process (`-`: the consumer does not read the topic) and how long the oldest waited."""
    names = [c.name for c in s.consumers]
    widths = [max(len(name), 7) for name in names]
    header = f"{'topic':<34} {'part':>4} {'end':>9}"
    header += "".join(f" {name:>{w}}" for name, w in zip(names, widths, strict=True))
    rows = [header + f" {'oldest':>7}", f"{'':<49}records waiting per consumer"]
    found: dict[tuple[str, int], dict[str, PartitionStatus]] = {}
    for c in s.consumers:
        for p in c.partitions:
            found.setdefault((p.topic, p.partition), {})[c.name] = p
    for (topic, partition), per_consumer in sorted(found.items()):
        end = max(p.end_offset for p in per_consumer.values())
        row = f"{topic:<34} {partition:>4} {end:>9}"
        for name, width in zip(names, widths, strict=True):
            held = per_consumer.get(name)
            row += f" {'-' if held is None else held.waiting:>{width}}"
        stamps = [p.oldest_waiting_ms for p in per_consumer.values() if p.waiting]
        oldest = [stamp for stamp in stamps if stamp]
        waited = s.taken_at - min(oldest) / 1000 if oldest else None
        rows.append(row + f" {age(waited) if waited is not None else '-':>7}")
    return rows


def _capture(s: Snapshot) -> str:
    c = s.capture
    if c is None:
        return "- (no connector file: give --connector or the mapping's source.connector)"
    if c.kind == "embedded":
        return f"connector {c.connector} (embedded engine: running while its slot is active)"
    tasks = ", ".join(f"task {t.id} {t.state}" for t in c.tasks) or "no tasks"
    return f"connector {c.connector} on Kafka Connect: {c.state}; {tasks}"


def _slot(s: Snapshot) -> str:
    slot = s.slot
    if slot is None:
        return "-"
    if not slot.exists:
        return f"{slot.name}: does not exist"
    keep = "unlimited" if slot.keep_bytes is None else size(slot.keep_bytes)
    share = (
        f" ({slot.retained_bytes / slot.keep_bytes:.0%})"
        if slot.keep_bytes and slot.retained_bytes is not None
        else ""
    )
    return (
        f"{slot.name} {'active' if slot.active else 'INACTIVE'}, wal {slot.wal_status}, "
        f"retains {size(slot.retained_bytes)} of {keep}{share}, "
        f"confirmed lag {size(slot.lag_bytes)}"
    )


def _job(s: Snapshot, c: ConsumerSnapshot) -> str:
    job = c.job
    if job is None:
        return "no status file (the job has not run with this checkpoint)"
    state = job.state + (f" ({job.error})" if job.error else "")
    if job.state == "running" and c.job_alive is False:  # killed: it never wrote "stopped"
        state = "not running (its process is gone; the status file still says running)"
    return (
        f"{state}, pid {job.pid} on {job.host}, last seen {age(s.taken_at - job.alive_at)} ago, "
        f"{job.batches} batch(es) since start {clock(job.started_at)}"
    )


def _sinks(c: ConsumerSnapshot) -> str:
    if c.job is None or not c.job.sink_health:
        return "-"
    parts = []
    for name, health in sorted(c.job.sink_health.items()):
        state = str(health.get("state"))
        if state != "ok":
            state += f" since {clock(health.get('since'))} ({health.get('error_class')})"
        parts.append(f"{name} {state}")
    return ", ".join(parts)


def _batch(s: Snapshot, c: ConsumerSnapshot) -> str:
    batch = c.job.last_batch if c.job else None
    if batch is None:
        return "- (none yet)"
    return (
        f"{batch.batch_id} finished {age(s.taken_at - batch.finished_at)} ago: "
        f"{batch.records} records, {batch.compacted} changes, {batch.dead_lettered} dead-lettered "
        f"in {batch.seconds:.2f} s"
    )


def _stages(c: ConsumerSnapshot) -> str:
    batch = c.job.last_batch if c.job else None
    if batch is None:
        return "-"
    return ", ".join(f"{name} {took:.2f} s" for name, took in batch.stages.items())


def to_json(s: Snapshot, verdict: Verdict) -> dict[str, Any]:
    document = dataclasses.asdict(s)
    for consumer, c in zip(document["consumers"], s.consumers, strict=True):
        consumer["waiting"] = c.waiting
        for partition, p in zip(consumer["partitions"], c.partitions, strict=True):
            partition["waiting"] = p.waiting
    return {
        "verdict": {"health": verdict.health.value, "reasons": list(verdict.reasons)},
        **document,
        "waiting": s.waiting,
    }
