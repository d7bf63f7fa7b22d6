"""Job state per Kafka partition that a micro-batch hands to the next, kept beside the checkpoint.

Decoding a batch may need what earlier batches saw in the same partition (the version floors,
job.decode.version_floors; the keys a transaction that straddles the boundary created,
job.decode.open_transactions). Such state belongs to the checkpoint like the offsets: a new
checkpoint replays the topics from the start and rebuilds it. It is saved (when the batch
changed it) after every sink acknowledged a batch and before Spark commits the batch's offsets,
with the batch id and the state the batch started from: a batch that re-runs after a crash in
between (Spark re-runs it under the same id) starts from that state again, never from the state
its own records left, so a re-run decodes exactly as the first run did.

The file: `{"format": N, "batch": id, "before": [entries], "after": [entries]}`, an entry being
`{"topic", "partition", ...the value's fields}`; written atomically.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from cdc_sync.core.files import write_atomically

log = logging.getLogger(__name__)

V = TypeVar("V")
Where = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class PerBatch(Generic[V]):
    """The state after batch `batch_id`, and the state that batch started from."""

    batch_id: int | None = None
    before: dict[Where, V] = field(default_factory=dict)
    after: dict[Where, V] = field(default_factory=dict)

    def for_batch(self, batch_id: int) -> dict[Where, V]:
        """What batch `batch_id` starts from: a re-run of the stored batch starts where it did."""
        return dict(self.before if batch_id == self.batch_id else self.after)


class PerBatchFile(Generic[V]):
    """One kind of per-partition state in its file. `encode` / `decode`: a value to and from
    its entry's fields; `corrupt`: the error an unreadable file raises, `advice` what its message
    says to do; `dropped`: earlier formats not to be read, each with the warning it logs."""

    def __init__(
        self,
        path: Path,
        format_: int,
        encode: Callable[[V], dict[str, Any]],
        decode: Callable[[Mapping[str, Any]], V],
        corrupt: Callable[[str], Exception],
        advice: str,
        dropped: Mapping[int, str] | None = None,
    ) -> None:
        self.path = path
        self.format = format_
        self._encode = encode
        self._decode = decode
        self._corrupt = corrupt
        self._advice = advice
        self._dropped = dict(dropped or {})
        self._held: dict[Where, V] | None = None  # the file's `after`, as last read or written

    def load(self) -> PerBatch[V]:
        self._held = None
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self._held = {}
            return PerBatch()
        try:
            document = json.loads(text)
            if document.get("format") in self._dropped:
                log.warning("%s: %s", self.path, self._dropped[document["format"]])
                return PerBatch()
            if document.get("format") != self.format:
                raise ValueError(f"expected format {self.format}")
            stored = PerBatch(
                int(document["batch"]),
                self._values(document["before"]),
                self._values(document["after"]),
            )
            self._held = stored.after
            return stored
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise self._corrupt(f"{self.path}: {self._advice.format(error=error)}") from error

    def save(self, stored: PerBatch[V]) -> None:
        """Writes `stored`, unless the batch left the state as it found it and the file holds
        that state already: then the file tells a re-run of this batch, and the next batch,
        what it tells them written (both start from its `after`), and a batch is spared two
        fsyncs (a tenth to a fifth of a small batch's time on a busy driver, py-spy 2026-11-28)."""
        if self._held is not None and stored.before == stored.after == self._held:
            return
        document = {
            "format": self.format,
            "batch": stored.batch_id,
            "before": self._entries(stored.before),
            "after": self._entries(stored.after),
        }
        write_atomically(self.path, json.dumps(document, indent=1) + "\n")
        self._held = dict(stored.after)

    def _entries(self, values: Mapping[Where, V]) -> list[dict[str, Any]]:
        return [
            {"topic": topic, "partition": partition, **self._encode(value)}
            for (topic, partition), value in sorted(values.items())
        ]

    def _values(self, entries: list[dict[str, Any]]) -> dict[Where, V]:
        return {
            (str(entry["topic"]), int(str(entry["partition"]))): self._decode(entry)
            for entry in entries
        }
