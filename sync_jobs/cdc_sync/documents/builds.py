"""When a document index is built anew behind its alias, and when the alias moves to it.

A document index is an alias over one concrete index. Readers must never see a document older
than one they saw, nor one deleted since, so a new concrete index is filled first and the alias
moved to it in one request (`SearchSink.promote`):

- `BUILD_NOW`: the state is current but the index is not what it would write (its spec or
  mapping changed, or the index is gone): every root rendered from the state, then the alias
  moved.
- `BUILD_BEHIND`: the state is not current yet (a new state beside an index it did not write: a
  new checkpoint replaying the topics; or a build of that kind the spec changed under): the new
  index is filled by the replay's renders while readers keep the old one, and the alias moves
  once the state has caught up (`caught_up`).
- `RESUME`: such a build that a stop interrupted goes on into the same index.
- `IN_PLACE`: the index is the state's: made if absent, settings brought up to date.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from enum import Enum

from cdc_sync.core.model import Change, Op, TableId, Truncate
from cdc_sync.mapping import TableRoute
from cdc_sync.relations import DocumentSpec


class Build(Enum):
    IN_PLACE = "in place"
    BUILD_NOW = "build now"
    BUILD_BEHIND = "build behind the alias"
    RESUME = "resume the build"


def planned(
    fingerprint: str,
    known: str | None,
    building: str | None,
    building_exists: bool,
    alias_exists: bool,
    has_roots: bool,
) -> Build:
    """What `ensure_targets` does with one document index. `known`: the fingerprint the state
    last wrote the index with (None: a new state); `building`: the index a build behind the
    alias fills (None: none)."""
    if building is not None:
        resumable = known == fingerprint and building_exists
        return Build.RESUME if resumable else Build.BUILD_BEHIND
    if known is None and alias_exists:
        return Build.BUILD_BEHIND
    if known not in (None, fingerprint) or (not alias_exists and has_roots):
        return Build.BUILD_NOW
    return Build.IN_PLACE


def snapshot_rows_only(
    truncates: Sequence[Truncate], changes: Mapping[TableId, Sequence[Change]]
) -> bool:
    """The batch holds snapshot rows that end no table's snapshot, and nothing else: the
    snapshot goes on behind it."""
    found = [c for batch in changes.values() for c in batch]
    in_progress = all(c.op is Op.READ and not c.ends_snapshot for c in found)
    return not truncates and bool(found) and in_progress


def snapshot_goes_on(
    truncates: Sequence[Truncate], changes: Mapping[TableId, Sequence[Change]]
) -> bool:
    """The batch holds rows of a full snapshot that goes on behind it, and besides them at most
    the ends of some tables' snapshots: a root rendered now could miss children (or a parent)
    the snapshot has yet to read, a document Postgres never held, so nothing renders until the
    snapshot's last row (or anything after it) arrives. An initial build renders each root once."""
    found = [c for batch in changes.values() for c in batch]
    table_ends = all(t.snapshot_end for t in truncates)
    return table_ends and bool(found) and all(c.snapshot_continues for c in found)


def snapshot_version(changes: Mapping[TableId, Sequence[Change]]) -> int | None:
    """The version the batch's rows of a full snapshot share: every row of one snapshot carries
    the snapshot's consistent point (observed: tests/integration/test_debezium_snapshot_end.py).
    None when the batch holds none, or rows of two snapshots."""
    found = {
        c.version
        for batch in changes.values()
        for c in batch
        if c.op is Op.READ and (c.snapshot_continues or c.ends_snapshot)
    }
    return found.pop() if len(found) == 1 else None


def renders_during_snapshot(
    spec: DocumentSpec, snapshot_ends: Mapping[TableId, int], snapshot: int
) -> bool:
    """Whether a document's roots read in the full snapshot at version `snapshot` can render
    while that snapshot goes on: every table it reads besides its roots has ended this
    snapshot (`snapshot_ends`: the version of the last full snapshot each table ended), so a
    root read in it renders whole, as Postgres held it at the snapshot's point. Debezium reads
    the tables in `table.include.list` order: a root table listed after the tables its
    documents read renders while it is read."""
    return all(snapshot_ends.get(t) == snapshot for t in spec.read_besides_roots())


def caught_up(full: bool, snapshot_rows: bool) -> bool:
    """A batch ends the backlog: it is not full (the source had no more to give it) and is not
    made only of the rows of a snapshot in progress (the connector is still reading)."""
    return not full and not snapshot_rows


def fingerprint(spec: DocumentSpec, route: TableRoute) -> str:
    """What a document index's contents depend on: its spec and its index mapping."""
    mapping = route.search.mapping if route.search is not None else {}
    text = json.dumps([repr(spec), mapping], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint_key(name: str) -> str:
    """The state's meta key of the fingerprint document `name`'s index was last written with."""
    return f"fingerprint:{name}"


def building_key(name: str) -> str:
    """The state's meta key of the concrete index a build of document `name` fills behind its
    alias (absent: none)."""
    return f"building:{name}"
