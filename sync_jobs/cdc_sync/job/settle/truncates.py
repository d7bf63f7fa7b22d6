"""TRUNCATE on the driver: each sink removes the table's older rows, and the table's fence rises.

The end of a table's full snapshot (`Truncate.snapshot_end`, from the snapshot's last row of the
table) is applied the same way at the snapshot's version, unless the table's `on_snapshot_end`
is `keep`: a snapshot taken again after capture lost its offsets does not hold the rows deleted
in between whose deletes were never published, and nothing else would remove them (a
soft-delete sink marks them: `sinks.truncates`).

A truncate event (`core.model.Truncate`) carries no key: it is a side row of the decode, applied
by the driver after the batch's policies and schemas are settled and before any row write
(`BatchApplier.begin`). Every sink removes the rows it holds for the table whose version is older
than the truncate's (a row written by a later change survives, whenever it was applied), and the
table's `TruncateFence` rises to it. The writes drop every change the fence covers
(`job.write.table_writes`): changes of the same batch before the truncate, and stale changes
arriving later (a replay, a transaction Debezium sends again, a partition read behind another).

The fences are job state kept beside the Spark checkpoint (`<checkpoint>/cdc_sync_truncates.json`)
like the version floors: a new checkpoint replays the topics and meets the truncates again. They
only rise, so saving them before Spark commits the batch is safe: a batch that re-runs holds its
truncates and raises the fences to the same points.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from cdc_sync.core.files import write_atomically
from cdc_sync.core.model import TableId, Truncate, TruncateFence
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.base import Sink

log = logging.getLogger(__name__)

FILE_NAME = "cdc_sync_truncates.json"
FORMAT = 1


class TruncateFencesCorrupt(RuntimeError):
    """A stored fences file that cannot be read; the message names the file."""


class FileTruncateFences:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def beside_checkpoint(cls, checkpoint_dir: Path) -> FileTruncateFences:
        return cls(checkpoint_dir / FILE_NAME)

    def load(self) -> dict[TableId, TruncateFence]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            document = json.loads(text)
            if document.get("format") != FORMAT:
                raise ValueError(f"expected format {FORMAT}")
            return {
                TableId.parse(str(entry["table"])): TruncateFence(
                    int(entry["version"]), int(entry["position"])
                )
                for entry in document["tables"]
            }
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise TruncateFencesCorrupt(
                f"{self.path}: truncate fences are unreadable ({error}); restore the file, or "
                "delete it (a stale change older than a TRUNCATE could then bring a truncated "
                "row back: `cdc-sync verify` finds such rows)"
            ) from error

    def save(self, fences: Mapping[TableId, TruncateFence]) -> None:
        document = {
            "format": FORMAT,
            "tables": [
                {"table": str(table), "version": fence.version, "position": fence.position}
                for table, fence in sorted(fences.items())
            ],
        }
        write_atomically(self.path, json.dumps(document, indent=1) + "\n")


def newest_per_table(truncates: Iterable[Truncate]) -> dict[TableId, Truncate]:
    """The newest truncate of each table: it removes everything an older one would."""
    newest: dict[TableId, Truncate] = {}
    for truncate in truncates:
        known = newest.get(truncate.table)
        if known is None or truncate.fence > known.fence:
            newest[truncate.table] = truncate
    return newest


def _applied(mapping: MappingFile, truncates: Sequence[Truncate]) -> list[Truncate]:
    """Without the snapshot ends of tables whose `on_snapshot_end` is `keep`."""
    return [t for t in truncates if mapping.policies_for(t.table).applies(t)]


class TruncateFences:
    """The tables' fences, applied to the sinks and kept (in the file, when there is one)."""

    def __init__(self, store: FileTruncateFences | None = None) -> None:
        self.store = store
        self.fences: dict[TableId, TruncateFence] = store.load() if store is not None else {}

    def apply(
        self, mapping: MappingFile, sinks: Sequence[Sink], truncates: Sequence[Truncate]
    ) -> dict[str, int]:
        """Each routed table's newest truncate, applied by every sink (rows removed per sink);
        then the fences rise and are saved."""
        removed: dict[str, int] = {}
        raised = False
        for table, truncate in sorted(newest_per_table(_applied(mapping, truncates)).items()):
            route = mapping.route_for(table)
            if route is None:
                continue  # not routed (the heartbeat table, an ignored table)
            for sink in sinks:
                count = sink.truncate(route, truncate)
                removed[sink.name] = removed.get(sink.name, 0) + count
                log.info(
                    "%s: %s %s at version %d: %s removed (or marked) %d rows",
                    truncate.coordinates,
                    "snapshot end of" if truncate.snapshot_end else "TRUNCATE",
                    table,
                    truncate.version,
                    sink.name,
                    count,
                )
            known = self.fences.get(table)
            if known is None or truncate.fence > known:
                self.fences[table] = truncate.fence
                raised = True
        if raised and self.store is not None:
            self.store.save(self.fences)
        return removed
