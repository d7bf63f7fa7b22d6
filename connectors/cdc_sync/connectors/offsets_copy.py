"""A last complete copy of the embedded capture's offsets file, kept beside it.

Kafka's `FileOffsetBackingStore` rewrites its file in place, so a capture killed with SIGKILL
during a save leaves it cut short. Kafka then reads no offsets at all (a new snapshot of every
table); Debezium's own check reads the same file. The copy lets the next start resume instead:
it is at most a few batches behind, and Postgres resumes a slot from its confirmed position
whatever older position is asked for, so nothing published is lost and what is sent again is
dropped by the sinks' ordering (newest change per key wins).
"""

from __future__ import annotations

import logging
from pathlib import Path

from cdc_sync.connectors.stored_offsets import parse_file_store
from cdc_sync.core.files import write_atomically

log = logging.getLogger(__name__)

COPY_SUFFIX = ".last-complete"


class OffsetsCopy:
    """`keep()` after the engine saved; `recover()` before it starts; `forget()` on a reset."""

    def __init__(self, offsets_file: Path) -> None:
        self.offsets_file = offsets_file
        self.copy_file = offsets_file.with_name(offsets_file.name + COPY_SUFFIX)
        self._kept: bytes | None = None

    def keep(self) -> None:
        """Copy the offsets file when it changed and is complete (a save in progress is not);
        the copy is replaced by a rename, so it is never cut short itself."""
        try:
            data = self.offsets_file.read_bytes()
        except FileNotFoundError:
            return
        if data == self._kept or parse_file_store(data) is None:
            return
        # Not synced: a kill leaves the page cache, and this runs between every two batches.
        write_atomically(self.copy_file, data, durable=False)
        self._kept = data

    def recover(self) -> None:
        """An offsets file cut short is replaced by the copy, or, without a complete copy,
        removed: the engine then takes a new snapshot, as Kafka's store would for it."""
        try:
            data = self.offsets_file.read_bytes()
        except FileNotFoundError:
            return
        if parse_file_store(data) is not None:
            return
        copy = self.copy_file.read_bytes() if self.copy_file.exists() else b""
        if parse_file_store(copy) is None:
            self.offsets_file.unlink()
            log.warning(
                "capture offsets %s are cut short (the capture was killed while saving them) "
                "and there is no complete copy: a new snapshot follows",
                self.offsets_file,
            )
            return
        write_atomically(self.offsets_file, copy)
        self._kept = copy
        log.warning(
            "capture offsets %s were cut short (the capture was killed while saving them): "
            "resuming from their last complete copy; changes since then are sent again and "
            "the sinks drop what they already have",
            self.offsets_file,
        )

    def forget(self) -> None:
        self.copy_file.unlink(missing_ok=True)
        self._kept = None
