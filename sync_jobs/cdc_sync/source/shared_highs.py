"""High watermarks asked of the broker once for every planner of the machine.

Each consumer of the log is a streaming query of its own, and Spark runs each query's planner
(`latestOffset`) in a Python worker process of its own: four consumers asked the broker for
every partition's high watermark four times a trigger. On a broker whose ListOffsets costs in
proportion to the partition's log (the Tansu stand-in: ~0.3 s a trigger at 50,000 records)
that is most of the broker's work at a low change rate. Through `SharedHighs` a planner takes
the high watermarks another planner asked for less than `max_age_ms` ago, from a small file
beside the other processes' (locked while one of them asks, so that the others wait for its
answer instead of asking too).

A high watermark only grows: one read a moment ago plans a batch that ends a little earlier,
never one that reads past what the broker holds; what arrived since is the next batch's. A
planner never plans twice with one read: the queries trigger together, so within a trigger the
planners share one answer, and each trigger brings a newer one. (Reused across triggers, a
read as old as the trigger interval held every consumer's records back a trigger in two: the
Tansu runs' batches came every 0.40-0.50 s on a 0.25 s trigger.)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cdc_sync.source.offsets import PartitionOffsets, TopicPartition

AskHighs = Callable[[Sequence[TopicPartition]], PartitionOffsets]


class SharedHighs:
    def __init__(self, bootstrap: str, max_age_ms: int, directory: Path | None = None) -> None:
        self.max_age_ms = max_age_ms
        where = directory or Path(tempfile.gettempdir())
        name = hashlib.sha256(bootstrap.encode()).hexdigest()[:16]
        self.path = where / f"cdc-sync-highs-{os.getuid()}-{name}.json"
        self._planned_with = 0.0  # when the read this planner last planned with was answered

    def highs(self, partitions: Sequence[TopicPartition], ask: AskHighs) -> PartitionOffsets:
        """The partitions' high watermarks: those another planner read within `max_age_ms`
        and after the read this one last planned with, else `ask`'s (which are then kept for
        the others)."""
        if self.max_age_ms <= 0 or not partitions:
            return ask(partitions)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            kept = self._kept()
            if kept is not None and all(f"{t}:{p}" in kept[1] for t, p in partitions):
                self._planned_with = kept[0]
                return {(t, p): kept[1][f"{t}:{p}"] for t, p in partitions}
            found = ask(partitions)
            self._planned_with = self._keep(found)
            return found

    def _kept(self) -> tuple[float, dict[str, int]] | None:
        """When the kept read was answered, and its highs; None: none, too old, or one this
        planner has planned with already."""
        try:
            held = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        at = float(held["at"])
        age_ms = (time.time() - at) * 1000
        if not 0 <= age_ms <= self.max_age_ms or at <= self._planned_with:
            return None
        highs = held["highs"]
        assert isinstance(highs, dict)
        return at, {str(k): int(v) for k, v in highs.items()}

    def _keep(self, highs: PartitionOffsets) -> float:
        """Kept for the others, stamped with the time of the answer (returned)."""
        at = time.time()
        held = {"at": at, "highs": {f"{t}:{p}": h for (t, p), h in highs.items()}}
        fresh = self.path.with_suffix(f".{os.getpid()}.tmp")
        fresh.write_text(json.dumps(held))
        fresh.replace(self.path)
        return at
