"""Spark's own share of each micro-batch, logged beside the job's batch line.

The batch line (`BatchMetrics.summary`) times what runs inside `foreachBatch`; Spark spends
more around it: asking the source for its latest offsets, writing the offset log, committing.
When freshness is off, these say whether the time went to Spark's bookkeeping or to the job.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger(__name__)

# StreamingQueryProgress.durationMs keys, in the order a trigger runs them.
PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")


def progress_line(progress: Any) -> str:
    durations: dict[str, int] = dict(progress.durationMs or {})
    phases = " ".join(f"{name}:{durations[name]}ms" for name in PHASES if name in durations)
    total = durations.get("triggerExecution", 0)
    return f"batch {progress.batchId}: spark {total}ms ({phases}) rows={progress.numInputRows}"


class ProgressLog(StreamingQueryListener):
    """Logs one line per batch with Spark's phase durations (into the job log, not the console)."""

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        log.info("%s", progress_line(event.progress))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
