"""Spark's own share of each micro-batch, logged beside the job's batch line.

The batch line (`BatchMetrics.summary`) times what runs inside `foreachBatch`; Spark spends
more around it: asking the source for its latest offsets, writing the offset log, committing.
When freshness is off, these say whether the time went to Spark's bookkeeping or to the job.

Read from `StreamingQuery.lastProgress` when the next batch starts (one py4j call), not from a
Python `StreamingQueryListener`: that one converts every event field by field over py4j on the
listener bus, and blocked `SparkSession.stop()` while an event was half converted.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

# StreamingQueryProgress.durationMs keys, in the order a trigger runs them.
PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")


def progress_line(progress: Any, consumer: str = "job") -> str:
    durations: dict[str, int] = dict(progress.durationMs or {})
    phases = " ".join(f"{name}:{durations[name]}ms" for name in PHASES if name in durations)
    total = durations.get("triggerExecution", 0)
    return f"{consumer} batch {progress.batchId}: spark {total}ms ({phases})"


def log_previous_batch(query: StreamingQuery | None, batch_id: int, consumer: str = "job") -> None:
    """Log Spark's phases of the batch before `batch_id`, which ended before this one began."""
    if query is None:
        return
    progress = query.lastProgress
    if progress is not None and progress.batchId == batch_id - 1:
        log.info("%s", progress_line(progress, consumer))
