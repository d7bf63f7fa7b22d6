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

Kept like all per-partition state a batch hands to the next (job.decode.batch_state): saved after
every sink acknowledged a batch and before Spark commits its offsets, with the batch id and the
floors the batch started from, which a re-run of that batch (after a crash in between) starts
from again. Starting it from floors that include its own records would lift its first
transaction after a snapshot to the point of a later snapshot in the same batch, above a
transaction in between (a delete, say), which could then lose to the older change of a key
both touched.

Format 1 held the highest version of any record (before streamed copies of the first
transaction could be told apart); it is dropped on load, with a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdc_sync.job.decode.batch_state import PerBatch, PerBatchFile

FILE_NAME = "cdc_sync_versions.json"
FORMAT = 2
DROPPED_FORMATS = {  # highest versions, not snapshot points: unusable as floors
    1: "version floors of an earlier release (format 1) dropped; a snapshot whose rows were "
    "applied before this start does not lift a transaction streamed after it (`cdc-sync verify` "
    "finds such a row)",
}

Floors = dict[tuple[str, int], int]  # (topic, partition) -> highest snapshot point seen
StoredFloors = PerBatch[int]  # the floors after a batch, and the ones it started from


class VersionFloorsCorrupt(RuntimeError):
    """A stored floors file that cannot be read; the message names the file."""


class FileVersionFloors(PerBatchFile[int]):
    def __init__(self, path: Path) -> None:
        super().__init__(
            path,
            FORMAT,
            lambda version: {"version": version},
            _version,
            VersionFloorsCorrupt,
            "version floors are unreadable ({error}); restore the file, or delete it (the first "
            "transaction after a snapshot may then be fenced by snapshot rows read in an earlier "
            "batch: `cdc-sync verify` finds such rows)",
            DROPPED_FORMATS,
        )

    @classmethod
    def beside_checkpoint(cls, checkpoint_dir: Path) -> FileVersionFloors:
        return cls(checkpoint_dir / FILE_NAME)


def _version(entry: Mapping[str, Any]) -> int:
    return int(str(entry["version"]))


def raised(floors: Mapping[tuple[str, int], int], seen: Mapping[tuple[str, int], int]) -> Floors:
    """`floors` with each partition raised to the highest point `seen` in it."""
    merged = dict(floors)
    for where, version in seen.items():
        merged[where] = max(merged.get(where, version), version)
    return merged
