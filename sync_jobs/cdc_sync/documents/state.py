"""The documents' state: every row of every document table, kept by the job from the log.

A SQLite file beside the checkpoint (`<checkpoint>/documents/state.sqlite`): one row per key of
each document table (its JSON, version), the deleted keys (a SHA-256 of the key and the delete's
version, so a stale change cannot bring the row back, and the key itself is not kept), the join
values of the columns relations join on, each encoded by its pair's rule (`equality`: equal text
where Postgres's `=` holds; indexed: finding a parent's children or a child's parents is one
indexed lookup per relation), the roots a batch still has to
render (`pending`, written in the batch's transaction, cleared once the search server holds
them: a crash in between renders them again) and the version documents are written at.

A deleted row is forgotten (erasure, docs/erasure.md): its JSON, key and join values are deleted
with `secure_delete` on, so freed pages are zeroed, and `forget_freed` truncates the WAL file,
whose older frames still held them.

It is as big as the document tables' rows in JSON plus one index entry per join column and row.
It belongs to its streaming query's checkpoint, and records in each batch's transaction the
batch id and the checkpoint's query id (`applied`): a state that does not belong to its
checkpoint is found at start (`documents.checkpoint`) and replaced by a new one, which a new
checkpoint fills by reading the topics from the start.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_sync.core.model import TableId, id_digest
from cdc_sync.documents.comparisons import Comparisons, Side, TableTypes
from cdc_sync.documents.rows import Row, dumps, json_object
from cdc_sync.relations import DocumentSpec

# Bumped when join values encode otherwise (`equality.link_text`): the stored rows' join values
# are indexed again. 3: each pair's join values compared as Postgres's `=` compares its types.
LINK_ENCODING = "link-encoding-3"
# Values per IN (...) list: under SQLite's variable limit, and a bounded statement.
_CHUNK = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rows (
    tbl TEXT NOT NULL, id TEXT NOT NULL, version INTEGER NOT NULL,
    key TEXT NOT NULL, doc TEXT,  -- doc NULL: deleted at `version` (older states; see `deleted`)
    PRIMARY KEY (tbl, id)) WITHOUT ROWID;
-- Deleted keys, by the SHA-256 of their id (`core.model.id_digest`), with the delete's version.
CREATE TABLE IF NOT EXISTS deleted (
    tbl TEXT NOT NULL, digest TEXT NOT NULL, version INTEGER NOT NULL,
    PRIMARY KEY (tbl, digest)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS links (
    tbl TEXT NOT NULL, col TEXT NOT NULL, val TEXT NOT NULL, id TEXT NOT NULL,
    PRIMARY KEY (tbl, col, val, id)) WITHOUT ROWID;
-- A row's own join values, replaced on every change of the row: without it, each change's
-- delete scans the table's every link (seen: a 20,000-row batch's merge slowing as rows grew).
CREATE INDEX IF NOT EXISTS links_of_row ON links (tbl, id);
CREATE TABLE IF NOT EXISTS matching (doc TEXT NOT NULL, id TEXT NOT NULL,
    PRIMARY KEY (doc, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pending (doc TEXT NOT NULL, id TEXT NOT NULL,
    PRIMARY KEY (doc, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
-- Per document and root: a digest of the document the index holds (written by this state), so
-- a render whose document did not change is not written again (`written`).
CREATE TABLE IF NOT EXISTS written (doc TEXT NOT NULL, id TEXT NOT NULL, digest BLOB NOT NULL,
    PRIMARY KEY (doc, id)) WITHOUT ROWID;
"""


# Meta keys: the last batch the state applied, and the query id of the checkpoint it ran under.
BATCH, CHECKPOINT = "batch", "checkpoint"
_SNAPSHOT_END = "snapshot-end:"  # + table: the version of the last full snapshot it ended
# Pending roots (of a document, `?` 2) whose own row (table `?` 1) is at a version (`?` 3).
_PENDING_READ_AT = (
    "SELECT p.id FROM pending p JOIN rows r ON r.tbl = ? AND r.id = p.id "
    "WHERE p.doc = ? AND r.version = ? AND r.doc IS NOT NULL"
)


@dataclass(frozen=True)
class Applied:
    """What a state file records having applied (`applied`)."""

    batch: int | None  # the last batch id; None before the first (or from an older release)
    checkpoint: str | None  # the query id of the checkpoint that batch ran under
    rows: bool  # whether it holds any row


def applied(path: Path) -> Applied:
    """What the state at `path` records, read without creating or changing it."""
    if not path.exists():
        return Applied(None, None, False)
    conn = sqlite3.connect(path)
    try:
        meta = dict(
            conn.execute("SELECT name, value FROM meta WHERE name IN (?, ?)", [BATCH, CHECKPOINT])
        )
        rows = conn.execute("SELECT 1 FROM rows LIMIT 1").fetchone() is not None
    except sqlite3.OperationalError:  # no tables: a file the state never initialised
        return Applied(None, None, False)
    finally:
        conn.close()
    batch = meta.get(BATCH)
    return Applied(None if batch is None else int(batch), meta.get(CHECKPOINT), rows)


def remove_state(path: Path) -> None:
    """Delete the state at `path` (its file and SQLite's WAL beside it); none is fine. Only
    while no `DocumentState` has it open."""
    for part in (path, path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")):
        part.unlink(missing_ok=True)


@dataclass(frozen=True)
class Entry:
    """One key's change, as the state takes it: `doc` None for a delete; `unavailable`: columns
    the change lacks (unchanged TOAST values the fill could not read), kept from the state."""

    id: str
    key: tuple[object, ...]
    version: int
    doc: Mapping[str, object] | None
    unavailable: frozenset[str] = frozenset()
    unversioned: bool = False  # a delete known only from a tombstone: removes any version


@dataclass
class Changed:
    """What a merge changed in one table: the rows before and after, and every key it applied."""

    before: list[Row] = field(default_factory=list)
    after: list[Row] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)

    def rows(self) -> list[Row]:
        return [*self.before, *self.after]

    def add(self, other: Changed) -> None:
        self.before += other.before
        self.after += other.after
        self.ids |= other.ids


class DocumentState:
    def __init__(self, path: Path, specs: Iterable[DocumentSpec]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA secure_delete=ON")  # deleted rows' bytes are zeroed
        self.conn.executescript(_SCHEMA)
        specs = list(specs)
        self.comparisons = Comparisons(specs)
        self._sides: dict[TableId, list[Side]] | None = None  # indexed join sides, once checked
        # Table name -> the documents rooted at it (their `matching` roots go with a delete).
        self.rooted: dict[str, list[str]] = {}
        for spec in specs:
            self.rooted.setdefault(str(spec.table), []).append(spec.name)
        with self.transaction():
            self._digest_deleted_keys()
        self.forget_freed()

    def use_types(self, types: Mapping[TableId, TableTypes]) -> None:
        """Join and sort by these column types (the catalog's, at start): join values encoded
        otherwise than the state holds them are indexed again."""
        self.comparisons = Comparisons(self.comparisons.specs, types)
        self._sides = None
        self._links()

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # -- reads (RowSource) --------------------------------------------------------------------

    def rows(self, table: TableId, ids: Sequence[str]) -> list[Row]:
        query = "SELECT id, key, doc FROM rows WHERE tbl = ? AND doc IS NOT NULL AND id IN ({})"
        return [_row(*found) for found in self._select_in(query, [str(table)], ids)]

    def joined(self, table: TableId, key: str, values: Iterable[str]) -> list[Row]:
        # CROSS JOIN fixes the loop order: the links' index first, then each row by its key
        # (left to itself the planner walked every row of the table instead).
        query = (
            "SELECT DISTINCT r.id, r.key, r.doc FROM links l CROSS JOIN rows r "
            "ON r.tbl = l.tbl AND r.id = l.id "
            "WHERE l.tbl = ? AND l.col = ? AND l.val IN ({}) AND r.doc IS NOT NULL"
        )
        self._links()
        return [_row(*found) for found in self._select_in(query, [str(table), key], values)]

    def climbed(
        self, table: TableId, key: str, values: Iterable[str], then: str | None
    ) -> set[str]:
        """Of `table`'s rows with one of `values` under join side `key`: their doc ids (`then`
        None), else their join values under side `then` (the next relation up). Read from the
        join index alone: a fan-out to a million roots climbs without reading a row."""
        self._links()
        if then is None:
            query = "SELECT id FROM links WHERE tbl = ? AND col = ? AND val IN ({})"
            params = [str(table), key]
        else:
            # CROSS JOIN fixes the loop order, as in `joined`: each found row's own link next.
            query = (
                "SELECT n.val FROM links l CROSS JOIN links n "
                "ON n.tbl = l.tbl AND n.id = l.id AND n.col = ? "
                "WHERE l.tbl = ? AND l.col = ? AND l.val IN ({})"
            )
            params = [then, str(table), key]
        return {found for (found,) in self._select_in(query, params, values)}

    def present_ids(self, table: TableId, limit: int) -> Iterator[list[str]]:
        """The doc ids of the table's present rows, in chunks of `limit`, in id order (a
        rebuild's roots)."""
        query = (
            "SELECT id FROM rows WHERE tbl = ? AND doc IS NOT NULL AND id > ? ORDER BY id LIMIT ?"
        )
        return self._pages(query, [str(table)], limit)

    def _rows(self, query: str, params: Sequence[object]) -> list[Row]:
        return [_row(*found) for found in self.conn.execute(query, params)]

    # -- writes (inside `transaction`) ----------------------------------------------------------

    def merge(self, table: TableId, entries: Sequence[Entry]) -> Changed:
        """Apply each entry unless the state holds a newer version of its key (fenced: equal
        versions apply, so a re-run batch is harmless): what changed, before and after."""
        name = str(table)
        stored = self._stored(name, [e.id for e in entries])
        changed = Changed()
        written: list[tuple[str, str, int, str, str]] = []
        deleted: list[tuple[str, str, int]] = []
        revived: list[str] = []
        for entry in entries:
            held = stored.get(entry.id)
            if held is not None and not entry.unversioned and held[0] > entry.version:
                continue  # the state is newer: this change is stale
            changed.ids.add(entry.id)
            old = held[1] if held is not None else None
            if old is not None:
                changed.before.append(old)
            doc = entry.doc
            if doc is not None and entry.unavailable:
                # Never a placeholder as a value: the state's own value, else no value.
                kept = {c: v for c, v in doc.items() if c not in entry.unavailable}
                held_values = old.doc if old is not None else {}
                doc = {**kept, **{c: held_values[c] for c in entry.unavailable if c in held_values}}
            version = entry.version if not entry.unversioned else (held[0] if held else -1)
            if doc is None:
                deleted.append((name, entry.id, version))
                continue
            if held is not None and old is None:
                revived.append(entry.id)  # deleted before: its digest goes
            written.append((name, entry.id, version, dumps(list(entry.key)), dumps(doc)))
            changed.after.append(Row(entry.id, entry.key, doc))
        # In bulk: one statement each for the rows, the deleted keys, the join values.
        self._write(name, written, deleted, revived)
        self._link(table, changed.after)
        return changed

    def truncate(self, table: TableId, version: int) -> Changed:
        """Every row of `table` older than a TRUNCATE at `version` is gone (deleted at the
        version just below it, as the sinks do: sinks.truncates)."""
        name = str(table)
        removed = self._rows(
            "SELECT id, key, doc FROM rows WHERE tbl = ? AND doc IS NOT NULL AND version < ?",
            [name, version],
        )
        self._write(name, [], [(name, row.id, version - 1) for row in removed], [])
        return Changed(removed, [], {row.id for row in removed})

    def forget_freed(self) -> None:
        """Truncate the WAL file once its frames are in the database: they still hold the
        rows as they were before their deletes (the database's own freed space is zeroed,
        `secure_delete`). Called after a batch that deleted rows; outside a transaction."""
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def set_matching(self, doc: str, matching: Iterable[str], not_matching: Iterable[str]) -> None:
        """A filtered document's roots: which match its filter now."""
        self.conn.executemany(
            "DELETE FROM matching WHERE doc = ? AND id = ?", _pairs(doc, not_matching)
        )
        self.conn.executemany("INSERT OR IGNORE INTO matching VALUES (?, ?)", _pairs(doc, matching))

    def matching(self, doc: str, ids: Sequence[str]) -> set[str]:
        query = "SELECT id FROM matching WHERE doc = ? AND id IN ({})"
        return {ident for (ident,) in self._select_in(query, [doc], ids)}

    def add_pending(self, doc: str, ids: Iterable[str]) -> None:
        self.conn.executemany("INSERT OR IGNORE INTO pending VALUES (?, ?)", _pairs(doc, ids))

    def pending(self, doc: str, limit: int) -> Iterator[list[str]]:
        """The roots still to render, in chunks of `limit`, in id order."""
        query = "SELECT id FROM pending WHERE doc = ? AND id > ? ORDER BY id LIMIT ?"
        return self._pages(query, [doc], limit)

    def rendered(self, doc: str) -> None:
        """Every pending root of `doc` is in the search server now."""
        with self.transaction():
            self.conn.execute("DELETE FROM pending WHERE doc = ?", [doc])

    def pending_read_at(
        self, doc: str, table: TableId, version: int, limit: int
    ) -> Iterator[list[str]]:
        """The pending roots whose own row (of the root `table`) the state holds at `version`,
        in chunks of `limit`, in id order."""
        return self._pages(
            _PENDING_READ_AT + " AND p.id > ? ORDER BY p.id LIMIT ?",
            [str(table), doc, version],
            limit,
        )

    def rendered_read_at(self, doc: str, table: TableId, version: int) -> None:
        """The pending roots `pending_read_at` gives are in the search server now."""
        with self.transaction():
            self.conn.execute(
                f"DELETE FROM pending WHERE doc = ? AND id IN ({_PENDING_READ_AT})",
                [doc, str(table), doc, version],
            )

    def record_snapshot_end(self, table: TableId, version: int) -> None:
        """`table`'s rows of the full snapshot at `version` are all in the state."""
        self.set_meta(_SNAPSHOT_END + str(table), str(version))

    def snapshot_ends(self, tables: Iterable[TableId]) -> dict[TableId, int]:
        """The version of the last full snapshot each of `tables` ended (absent: none)."""
        found = ((table, self.meta(_SNAPSHOT_END + str(table))) for table in tables)
        return {table: int(version) for table, version in found if version is not None}

    def written(self, doc: str, ids: Sequence[str]) -> dict[str, bytes]:
        """The digests of the documents of these roots the index holds (as this state wrote
        them)."""
        query = "SELECT id, digest FROM written WHERE doc = ? AND id IN ({})"
        return {ident: bytes(digest) for ident, digest in self._select_in(query, [doc], ids)}

    def record_written(
        self, doc: str, digests: Mapping[str, bytes], deleted: Iterable[str] = ()
    ) -> None:
        """The index now holds these documents (by digest), and not those of `deleted`."""
        with self.transaction():
            self.conn.executemany(
                "INSERT OR REPLACE INTO written VALUES (?, ?, ?)",
                [(doc, ident, digest) for ident, digest in digests.items()],
            )
            self.conn.executemany(
                "DELETE FROM written WHERE doc = ? AND id = ?", _pairs(doc, deleted)
            )

    def forget_written(self, doc: str) -> None:
        """A new index is built for `doc`: nothing in it yet."""
        with self.transaction():
            self.conn.execute("DELETE FROM written WHERE doc = ?", [doc])

    def record_batch(self, batch_id: int, checkpoint: str | None) -> None:
        """The batch this transaction applies, and the query id of its checkpoint."""
        self.set_meta(BATCH, str(batch_id))
        if checkpoint is not None:
            self.set_meta(CHECKPOINT, checkpoint)

    def version(self) -> int:
        """The version documents are written at: the highest applied so far (never lower)."""
        found = self.meta("version")
        return int(found) if found else 0

    def raise_version(self, version: int) -> int:
        current = max(self.version(), version)
        self.set_meta("version", str(current))
        return current

    def meta(self, name: str) -> str | None:
        found = self.conn.execute("SELECT value FROM meta WHERE name = ?", [name]).fetchone()
        return str(found[0]) if found else None

    def set_meta(self, name: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [name, value])

    def clear_meta(self, name: str) -> None:
        self.conn.execute("DELETE FROM meta WHERE name = ?", [name])

    def count(self, table: TableId) -> int:
        """The table's present rows."""
        query = "SELECT count(*) FROM rows WHERE tbl = ? AND doc IS NOT NULL"
        found = self.conn.execute(query, [str(table)]).fetchone()
        return int(found[0]) if found else 0

    # -- internals --------------------------------------------------------------------------

    def _stored(self, name: str, ids: Sequence[str]) -> dict[str, tuple[int, Row | None]]:
        """id -> (version, row; None when deleted) of those of `ids` the state knows."""
        digests = {id_digest(ident): ident for ident in ids}
        query = "SELECT digest, version FROM deleted WHERE tbl = ? AND digest IN ({})"
        found: dict[str, tuple[int, Row | None]] = {
            digests[digest]: (version, None)
            for digest, version in self._select_in(query, [name], digests)
        }
        query = "SELECT id, version, key, doc FROM rows WHERE tbl = ? AND id IN ({})"
        for ident, version, key, doc in self._select_in(query, [name], ids):
            if ident not in found or version > found[ident][0]:
                found[ident] = (version, _row(ident, key, doc) if doc else None)
        return found

    def _write(
        self,
        name: str,
        rows: Sequence[tuple[str, str, int, str, str]],
        deleted: Sequence[tuple[str, str, int]],
        revived: Sequence[str],
    ) -> None:
        """Present rows (tbl, id, version, key, doc), deleted keys (tbl, id, version) and the
        ids of `rows` that were deleted keys: each key kept in one of the two tables, its old
        join values dropped."""
        self.conn.executemany("INSERT OR REPLACE INTO rows VALUES (?, ?, ?, ?, ?)", rows)
        self.conn.executemany(
            "DELETE FROM deleted WHERE tbl = ? AND digest = ?",
            [(name, id_digest(ident)) for ident in revived],
        )
        self.conn.executemany(
            "INSERT OR REPLACE INTO deleted VALUES (?, ?, ?)",
            [(name, id_digest(ident), version) for _, ident, version in deleted],
        )
        gone = [(name, ident) for _, ident, _ in deleted]
        self.conn.executemany("DELETE FROM rows WHERE tbl = ? AND id = ?", gone)
        self.conn.executemany(
            "DELETE FROM matching WHERE doc = ? AND id = ?",
            [(doc, ident) for doc in self.rooted.get(name, ()) for _, ident in gone],
        )
        self.conn.executemany(
            "DELETE FROM links WHERE tbl = ? AND id = ?",
            [(name, row[1]) for row in rows] + gone,
        )

    def _digest_deleted_keys(self) -> None:
        """Deleted keys of a state written before `deleted` existed: kept by digest only."""
        held = self.conn.execute("SELECT tbl, id, version FROM rows WHERE doc IS NULL").fetchall()
        self.conn.executemany(
            "INSERT OR REPLACE INTO deleted VALUES (?, ?, ?)",
            [(tbl, id_digest(ident), version) for tbl, ident, version in held],
        )
        self.conn.executemany(
            "DELETE FROM rows WHERE tbl = ? AND id = ?", [(tbl, ident) for tbl, ident, _ in held]
        )

    def _select_in(
        self, query: str, params: Sequence[object], values: Iterable[str]
    ) -> Iterator[tuple[Any, ...]]:
        """`query`'s rows, its `IN ({})` filled with `values` a bounded chunk at a time."""
        ordered = sorted(set(values))
        for start in range(0, len(ordered), _CHUNK):
            part = ordered[start : start + _CHUNK]
            marks = ",".join("?" * len(part))
            yield from self.conn.execute(query.format(marks), [*params, *part])

    def _pages(self, query: str, params: Sequence[object], limit: int) -> Iterator[list[str]]:
        """Ids `query` selects after the last one seen (`id > ?`), `limit` at a time: a page is
        read fresh each time, so the caller may write between pages."""
        last = ""
        while True:
            page = [ident for (ident,) in self.conn.execute(query, [*params, last, limit])]
            if not page:
                return
            yield page
            last = page[-1]

    def _link(self, table: TableId, rows: Sequence[Row]) -> None:
        """Index the rows' join values: per join side of the table (a column and its pair's
        rule), the value's text under that rule (`links.col` holds the side's key)."""
        name, sides = str(table), self._links().get(table, [])
        found = ((side.key, side.value(row), row.id) for row in rows for side in sides)
        self.conn.executemany(
            "INSERT OR IGNORE INTO links VALUES (?, ?, ?, ?)",
            [(name, key, value, ident) for key, value, ident in found if value is not None],
        )

    def _links(self) -> dict[TableId, list[Side]]:
        """The join sides indexed, checked against what the state was indexed for once: a
        mapping that joins other columns, or a type or rule that encodes them otherwise, has
        its tables' join values indexed again."""
        if self._sides is not None:
            return self._sides
        self._sides = sides = self.comparisons.sides()
        if self.conn.in_transaction:
            self._reindex(sides)
        else:
            with self.transaction():
                self._reindex(sides)
        return sides

    def _reindex(self, sides: Mapping[TableId, Sequence[Side]]) -> None:
        # With the encoding's version: a new encoding indexes every table again.
        wanted = {
            str(t): [LINK_ENCODING, *(f"{s.key}:{s.type}" for s in found)]
            for t, found in sides.items()
        }
        indexed = json.loads(self.meta("links") or "{}")
        for table in sides:
            if indexed.get(str(table)) == wanted[str(table)]:
                continue
            self.conn.execute("DELETE FROM links WHERE tbl = ?", [str(table)])
            query = "SELECT id, key, doc FROM rows WHERE tbl = ? AND doc IS NOT NULL"
            self._link(table, self._rows(query, [str(table)]))
        self.set_meta("links", json.dumps(wanted))


def _row(ident: str, key: str, doc: str) -> Row:
    return Row(ident, tuple(json.loads(key)), json_object(doc))


def _pairs(doc: str, ids: Iterable[str]) -> list[tuple[str, str]]:
    return [(doc, ident) for ident in ids]
