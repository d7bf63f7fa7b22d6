"""Delta table handles kept between micro-batches.

Opening a `DeltaTable` reads its log from the last checkpoint on (tens of milliseconds once a
table has a few dozen commits), and a batch used to open each table it touched up to four times
(tombstones: check, record, read; data: merge), nearly half its Delta time. A kept handle is
brought up to date instead (`update_incremental`: only the commits since), so commits by other
writers (`cdc-sync maintain`, a second job) are seen as before.
"""

from __future__ import annotations

import logging
from pathlib import Path

from deltalake import DeltaTable

from cdc_sync.sinks.delta.target import open_table

log = logging.getLogger(__name__)


class TableHandles:
    """One handle per table path; each table is used by one thread at a time (the driver
    commits tables in parallel, never one table twice at once)."""

    def __init__(self) -> None:
        self._tables: dict[str, DeltaTable] = {}
        # Per path: the newest commit a handle was seen at, and its file's stamp.
        self._seen: dict[str, tuple[int, Stamp]] = {}

    def get(self, path: Path) -> DeltaTable | None:
        """The table at `path`, current; None when there is none."""
        key = str(path)
        table = self._tables.pop(key, None)
        stamp = self._brought_up_to_date(table, path) if table is not None else None
        if stamp is None:  # none kept, or the kept one is unusable: open afresh
            table = open_table(path)
            stamp = _stamp(path, table.version()) if table is not None else None
        if table is not None:
            self._tables[key] = table
            self._seen[key] = (table.version(), stamp)
        return table

    def _brought_up_to_date(self, table: DeltaTable, path: Path) -> Stamp:
        """Brings `table` up to date and returns its newest commit file's stamp; None when the
        table it read was deleted or replaced, or cannot be read: then it is opened afresh. A
        handle does not notice a table removed under it by itself, and committing from it would
        write into a gap of the new table's log. Replaced is told by the commit file the handle
        was last seen at: gone, or another file (a table deleted and written again up to that
        version number: the handle then read no new commit and served the old table's files)."""
        seen = self._seen.get(str(path))
        if seen is None or seen[1] is None or _stamp(path, seen[0]) != seen[1]:
            return None
        if not _commit_file(path, table.version() + 1).exists():
            # No commit since the handle's own (versions are contiguous: another writer's would
            # be the next file). `update_incremental` lists the whole log directory to find
            # out: 1-2 ms a thousand commits kept, each table each batch, growing all along.
            return _stamp(path, table.version())
        try:
            table.update_incremental()
        except Exception as exc:
            log.debug("delta table %s: kept handle unusable (%s), reopening", path, exc)
            return None
        return _stamp(path, table.version())


# A commit file's inode, modification time (ns) and size: another file under the same name
# differs in one of them.
Stamp = tuple[int, int, int] | None


def _stamp(path: Path, version: int) -> Stamp:
    try:
        stat = _commit_file(path, version).stat()
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def _commit_file(path: Path, version: int) -> Path:
    return path / "_delta_log" / f"{version:020d}.json"
