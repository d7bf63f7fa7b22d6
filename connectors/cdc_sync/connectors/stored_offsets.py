"""The embedded capture's stored offsets against the database it captures, checked before the
engine starts.

Offsets that no longer belong to the database are stale: its replication slot is gone (the
database was re-created, or the slot dropped), the slot has moved past them (the WAL they need
was released), or they lie ahead of the server's WAL (a new server). Debezium answers the first
two with a 40-line trace and exits (under `snapshot.mode=initial`), and the third with silence:
it skips every change up to the stored position. So they are named in one line with the command
that starts over; a snapshot mode that starts over by itself is left to Debezium.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_sync.core.lsn import format_lsn
from cdc_sync.debezium.slots import SlotPosition

# Debezium starts over by itself in these modes when its offsets are unusable.
SELF_RESETTING_MODES = frozenset({"when_needed", "always"})


@dataclass(frozen=True)
class StoredOffset:
    """Debezium's Postgres source offset: where streaming resumes."""

    lsn: int  # the last change processed
    commit_lsn: int  # the last transaction committed (resumes after it)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StoredOffset:
        lsn = int(value["lsn"])
        return cls(lsn, int(value.get("lsn_commit", lsn)))


class StaleOffsets(RuntimeError):
    """The stored offsets do not belong to the database: `reason` says why."""

    def __init__(self, offsets_file: Path, database: str, reason: str) -> None:
        super().__init__(
            f"the capture's stored offsets ({offsets_file}) do not belong to database "
            f"{database}: {reason}"
        )
        self.offsets_file = offsets_file

    def with_way_out(self, command: str) -> str:
        """The one line to print: what is stale, and `command`, which starts over."""
        return f"{self}. Start over with a new snapshot: {command}"


def connector_offset(
    entries: Mapping[bytes, bytes], connector: str, topic_prefix: str
) -> StoredOffset | None:
    """The connector's offset among a file store's entries (key: JSON `[engine name,
    {"server": topic prefix}]`, value: JSON offset); None when it has none."""
    for key, value in entries.items():
        try:
            name, partition = json.loads(key)
            offset = json.loads(value)
        except (ValueError, TypeError):
            continue  # not an offset of this connector's form
        if name == connector and partition == {"server": topic_prefix} and "lsn" in offset:
            return StoredOffset.from_json(offset)
    return None


def stale_reason(stored: StoredOffset, slot: SlotPosition, slot_name: str) -> str | None:
    """Why `stored` does not belong to the database whose slot is `slot`; None when it does."""
    at = format_lsn(stored.lsn)
    if not slot.exists:
        return (
            f"replication slot {slot_name} does not exist (the database was re-created, or the "
            "slot dropped)"
        )
    if stored.lsn > slot.current_lsn:
        return (
            f"they lie at {at}, ahead of the server's WAL ({format_lsn(slot.current_lsn)}): "
            "a new database server"
        )
    if slot.restart_lsn is not None and stored.commit_lsn < slot.restart_lsn:
        return (
            f"they lie at {format_lsn(stored.commit_lsn)}, behind what slot {slot_name} still "
            f"keeps ({format_lsn(slot.restart_lsn)}): the WAL in between is gone"
        )
    return None


def read_file_store(path: Path) -> dict[bytes, bytes]:
    """The entries of Kafka's `FileOffsetBackingStore` file; `CutShort` when it ends early."""
    entries = parse_file_store(path.read_bytes())
    if entries is None:
        raise CutShort(path)
    return entries


class CutShort(RuntimeError):
    """The offsets file ends before its map does: Kafka's store rewrites it in place (no
    temporary file, no rename), so a capture killed during a save leaves it so."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"the capture's offsets file {path} is cut short")


def parse_file_store(data: bytes) -> dict[bytes, bytes] | None:
    """The entries of a `FileOffsetBackingStore` file's bytes, a Java-serialized
    `HashMap<byte[], byte[]>` read by the JVM the engine runs in (it must be started) with
    Kafka's own `SafeObjectInputStream` (it refuses the classes deserialization attacks use);
    None when they end early or hold anything else (a save cut short)."""
    import jpype

    stream_type = jpype.JClass("org.apache.kafka.connect.util.SafeObjectInputStream")
    source = jpype.JClass("java.io.ByteArrayInputStream")(jpype.JArray(jpype.JByte)(data))
    try:
        stored = stream_type(source).readObject()
    except jpype.JClass("java.lang.Exception"):  # EOF, a corrupt stream, a class it refuses
        return None
    if not isinstance(stored, jpype.JClass("java.util.Map")):
        return None
    return {bytes(entry.getKey()): bytes(entry.getValue()) for entry in stored.entrySet()}
