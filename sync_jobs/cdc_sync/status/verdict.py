"""healthy / lagging / stopped, with the reasons: pure rules over a `Snapshot`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from cdc_sync.status.model import ConsumerSnapshot, Snapshot


class Health(StrEnum):
    HEALTHY = "healthy"
    LAGGING = "lagging"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Thresholds:
    max_lag_seconds: float = 30.0  # the oldest record not yet processed may wait this long
    max_lag_records: int = 10_000  # records waiting for one consumer across its topics
    stale_after_seconds: float = 30.0  # a job silent this long is taken for dead
    max_slot_fraction: float = 0.8  # of max_slot_wal_keep_size the slot may retain


@dataclass(frozen=True)
class Verdict:
    health: Health
    reasons: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        return 0 if self.health is Health.HEALTHY else 1

    def lines(self) -> list[str]:
        """`HEALTH: reason`, further reasons indented below."""
        first, *more = self.reasons or ("",)
        return [f"{self.health.value.upper()}: {first}", *(f"  also: {r}" for r in more)]


def judge(snapshot: Snapshot, thresholds: Thresholds) -> Verdict:
    stopped = _stopped(snapshot, thresholds)
    if stopped:
        return Verdict(Health.STOPPED, tuple(stopped + _lagging(snapshot, thresholds)))
    lagging = _lagging(snapshot, thresholds)
    if lagging:
        return Verdict(Health.LAGGING, tuple(lagging))
    waiting = snapshot.waiting
    return Verdict(Health.HEALTHY, (f"{waiting} record(s) in flight" if waiting else "caught up",))


def _stopped(s: Snapshot, t: Thresholds) -> list[str]:
    reasons = [f"cannot read {problem}" for problem in s.problems]
    if not s.consumers:
        reasons.append(f"the mapping {s.mapping} routes no table to any sink or document")
    for consumer in s.consumers:
        reasons += [f"{consumer.name}: {why}" for why in _consumer_stopped(s, consumer, t)]
    reasons += _capture_stopped(s)
    return reasons


def _consumer_stopped(s: Snapshot, c: ConsumerSnapshot, t: Thresholds) -> list[str]:
    job = c.job
    reasons = [] if c.stale_checkpoint is None else [c.stale_checkpoint]
    if job is None:
        reasons.append(f"no status beside its checkpoint {c.checkpoint} (has the job run?)")
    elif job.state == "failed":
        reasons.append(f"failed: {job.error}")
    elif job.state == "stopped":
        reasons.append(f"stopped {_ago(s.taken_at - job.alive_at)}")
    elif c.job_alive is False:
        reasons.append(f"the job's process (pid {job.pid}) is gone (killed?)")
    elif s.taken_at - job.alive_at > t.stale_after_seconds:
        reasons.append(f"silent for {s.taken_at - job.alive_at:.0f} s (killed?)")
    if job is not None and job.state == "running":
        for sink, health in sorted(job.sink_health.items()):
            if health.get("state") == "failed":
                reasons.append(f"sink {sink} gave up ({health.get('error_class')})")
    return reasons


def _capture_stopped(s: Snapshot) -> list[str]:
    reasons = []
    capture = s.capture
    if capture is not None and capture.kind == "kafka-connect":
        if capture.state != "RUNNING":
            reasons.append(f"connector {capture.connector} is {capture.state}")
        reasons += [
            f"connector task {task.id} is {task.state}"
            for task in capture.tasks
            if task.state != "RUNNING"
        ]
        if capture.state == "RUNNING" and not capture.tasks:
            reasons.append(f"connector {capture.connector} has no tasks")
    slot = s.slot
    if slot is not None:
        if not slot.exists and capture is not None and capture.offsets_file is not None:
            reasons.append(
                f"the capture's stored offsets ({capture.offsets_file}) belong to replication "
                f"slot {slot.name}, which does not exist (database re-created, or slot "
                "dropped): start over with `cdc-sync capture --connector "
                f"{capture.connector_file} --reset`"
            )
        elif not slot.exists:
            reasons.append(f"replication slot {slot.name} does not exist")
        elif slot.wal_status == "lost":
            reasons.append(f"replication slot {slot.name} lost WAL it needed: re-snapshot")
        elif not slot.active:
            reasons.append(f"replication slot {slot.name} is inactive: capture is not running")
    return reasons


def _lagging(s: Snapshot, t: Thresholds) -> list[str]:
    reasons = []
    for consumer in s.consumers:
        reasons += [f"{consumer.name}: {why}" for why in _consumer_lagging(s, consumer, t)]
    slot = s.slot
    if slot is not None and slot.exists and slot.wal_status != "lost":
        if slot.wal_status == "unreserved":
            reasons.append(f"replication slot {slot.name} is about to lose WAL (unreserved)")
        elif (
            slot.keep_bytes
            and slot.retained_bytes is not None
            and slot.retained_bytes > t.max_slot_fraction * slot.keep_bytes
        ):
            reasons.append(
                f"replication slot {slot.name} retains {slot.retained_bytes / slot.keep_bytes:.0%}"
                " of max_slot_wal_keep_size"
            )
    return reasons


def _consumer_lagging(s: Snapshot, c: ConsumerSnapshot, t: Thresholds) -> list[str]:
    reasons = []
    if c.job is not None and c.job.state == "running":
        for sink, health in sorted(c.job.sink_health.items()):
            if health.get("state") == "waiting":
                reasons.append(
                    f"sink {sink} is being retried ({health.get('error_class')}, "
                    f"{health.get('failures')} failed attempt(s))"
                )
    if c.waiting > t.max_lag_records:
        reasons.append(f"{c.waiting} records wait (over {t.max_lag_records})")
    oldest = [p for p in c.partitions if p.waiting and p.oldest_waiting_ms is not None]
    if oldest:
        first = min(oldest, key=lambda p: p.oldest_waiting_ms or 0)
        age = s.taken_at - (first.oldest_waiting_ms or 0) / 1000
        if age > t.max_lag_seconds:
            reasons.append(
                f"a record has waited {age:.0f} s on {first.topic}[{first.partition}] "
                f"(over {t.max_lag_seconds:g} s)"
            )
    return reasons


def _ago(seconds: float) -> str:
    return f"{max(0.0, seconds):.0f} s ago"
