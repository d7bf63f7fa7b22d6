"""The highest snapshot point per Kafka partition, kept beside the Spark checkpoint.

The first transaction Debezium streams after a snapshot carries no commit position, only its
changes' own LSNs, which can lie before the snapshot's consistent point S; it is versioned no
lower than the snapshot points before it in its partition
(`cdc_sync.debezium.decoder.commit_order_version`): the points of snapshot rows read while
capture had streamed no commit (`Change.snapshot_point`), never the versions of streamed
changes, so a copy of that transaction sent again later is not lifted above the transactions
that followed it. Decoding scans each partition in offset order and needs the points of
records already processed by earlier micro-batches: `<checkpoint>/cdc_sync_versions.json`
holds them.

It belongs to the checkpoint like the offsets: a new checkpoint replays the topics from the
start and rebuilds it. It is saved after every sink acknowledged a batch and before Spark
commits the batch's offsets, with the batch id and the floors the batch started from: a batch
that re-runs after a crash in between (Spark re-runs it under the same id) starts from those
again. Starting it from floors that include its own records would lift its first transaction
after a snapshot to the point of a later snapshot in the same batch, above a transaction in
between (a delete, say), which could then lose to the older change of a key both touched.
Format 1 held the highest version of any record (before streamed copies of the first
transaction could be told apart); it is dropped on load, with a warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cdc_sync.core.files import write_atomically

log = logging.getLogger(__name__)

FILE_NAME = "cdc_sync_versions.json"
FORMAT = 2
DROPPED_FORMATS = (1,)  # highest versions, not snapshot points: unusable as floors

Floors = dict[tuple[str, int], int]  # (topic, partition) -> highest snapshot point seen


@dataclass(frozen=True)
class StoredFloors:
    """The floors after batch `batch_id`, and the ones that batch started from."""

    batch_id: int | None = None
    before: Floors = field(default_factory=dict)
    after: Floors = field(default_factory=dict)

    def for_batch(self, batch_id: int) -> Floors:
        """What batch `batch_id` starts from: a re-run of the stored batch starts where it did."""
        return dict(self.before if batch_id == self.batch_id else self.after)


class VersionFloorsCorrupt(RuntimeError):
    """A stored floors file that cannot be read; the message names the file."""


class FileVersionFloors:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def beside_checkpoint(cls, checkpoint_dir: Path) -> FileVersionFloors:
        return cls(checkpoint_dir / FILE_NAME)

    def load(self) -> StoredFloors:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return StoredFloors()
        try:
            document = json.loads(text)
            if document.get("format") in DROPPED_FORMATS:
                log.warning(
                    "%s: version floors of an earlier release (format %s) dropped; a snapshot "
                    "whose rows were applied before this start does not lift a transaction "
                    "streamed after it (`cdc-sync verify` finds such a row)",
                    self.path,
                    document["format"],
                )
                return StoredFloors()
            if document.get("format") != FORMAT:
                raise ValueError(f"expected format {FORMAT}")
            return StoredFloors(
                int(document["batch"]),
                _floors(document["before"]),
                _floors(document["after"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise VersionFloorsCorrupt(
                f"{self.path}: version floors are unreadable ({error}); restore the file, or "
                "delete it (the first transaction after a snapshot may then be fenced by "
                "snapshot rows read in an earlier batch: `cdc-sync verify` finds such rows)"
            ) from error

    def save(self, stored: StoredFloors) -> None:
        document = {
            "format": FORMAT,
            "batch": stored.batch_id,
            "before": _entries(stored.before),
            "after": _entries(stored.after),
        }
        write_atomically(self.path, json.dumps(document, indent=1) + "\n")


def _entries(floors: Mapping[tuple[str, int], int]) -> list[dict[str, object]]:
    return [
        {"topic": topic, "partition": partition, "version": version}
        for (topic, partition), version in sorted(floors.items())
    ]


def _floors(entries: list[dict[str, object]]) -> Floors:
    return {
        (str(entry["topic"]), int(str(entry["partition"]))): int(str(entry["version"]))
        for entry in entries
    }


def raised(floors: Mapping[tuple[str, int], int], seen: Mapping[tuple[str, int], int]) -> Floors:
    """`floors` with each partition raised to the highest point `seen` in it."""
    merged = dict(floors)
    for where, version in seen.items():
        merged[where] = max(merged.get(where, version), version)
    return merged
