"""`cdc-sync erase`: remove keys deleted in Postgres from every sink of their table, its Delta
history and the document indices, and with `--purge` from every file the warehouse keeps of
them (docs/erasure.md).

1. **Refused while Postgres holds a key**: the stream would bring it back.
2. **Refused until the pipeline caught up** (`caught_up`, `wait_until_applied`): every consumer
   of the log that applies the table must have applied every change committed before erase
   started (the WAL position Postgres reports after step 1): each sink by `cdc-sync wait`'s
   applied watermarks, each document index by its checkpoint's processed offsets against the
   topics' end offsets once a watermark said those changes are in Kafka. So the key's delete,
   and every change before it, is applied everywhere before erase writes: erase never works
   from a stale version while the rest of the key's changes wait in Kafka.
3. **The erased version** of a key is one above the newest version the sinks hold or remember
   for it (rows, soft-deleted rows, delete tombstones, the history). A change's version is the
   end of the commit record of the transaction streamed before its own (docs/internals.md), the
   same for a whole transaction and rising from one to the next. Once the delete is applied, that
   newest version d is the delete's: every change of the key committed before erase (and so
   every change a replay, or a transaction Debezium sends again, can still deliver) carries d or
   less. The only later change of the key is a re-insert, in a transaction committed after the
   delete's: its version is at least the end of the delete's own commit record, beyond d + 1.
   A delete at d + 1 therefore fences every old change out, the delete's own transaction's
   included (a soft-delete mark at d too), and loses to a re-insert. The WAL position read in
   step 2 would not do: a transaction streamed after it is versioned by the commit before it,
   which can lie below that position, so a re-insert would be fenced out.
4. Search, cache and the Delta table delete the key at that version where they still hold it (a
   soft-deleted row, a row a filter or a failure kept), through the fenced delete repair uses
   (`extra_rows.delete_extra_rows`); a document index rooted at the table deletes the key's
   document at the version it stores (a newer render wins). Documents that nested a deleted
   child row were rendered again without it when the job applied the delete (step 2). The
   history's rows of the key are deleted and the key recorded with the erased version
   (`history_writer.record_erased`): a replay writes none of its versions up to it again.
5. `--purge`: every Delta file and log entry older table versions keep (`maintenance.purge`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.lsn import format_lsn, parse_lsn
from cdc_sync.core.model import TableId
from cdc_sync.core.settings import Connections
from cdc_sync.job.consumers import DOCUMENTS_PREFIX, consumer_checkpoint
from cdc_sync.job.observe.checkpoint import processed_offsets
from cdc_sync.mapping import MappingFile, TableRoute
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.delta.history import ID, VERSION_LAST
from cdc_sync.sinks.delta.history_writer import erased_versions, record_erased
from cdc_sync.sinks.delta.maintenance import purge as purge_table
from cdc_sync.sinks.delta.merge_plan import datafusion_quote, datafusion_string
from cdc_sync.sinks.delta.target import history_path, open_table, table_path
from cdc_sync.sinks.delta.tombstones import TombstoneStore
from cdc_sync.sinks.redis import RedisSink
from cdc_sync.sinks.redis import readback as cache_readback
from cdc_sync.source.end_offsets import EndOffsets
from cdc_sync.source.offsets import PartitionOffsets
from cdc_sync.verify.extra_rows import (
    ID_COLUMN,
    RepairSinks,
    delete_extra_rows,
    document_route,
    read_retried,
)
from cdc_sync.verify.wait import POLL_SECONDS, SINK_NAMES, wait_for_lsn


class ErasureRefused(RuntimeError):
    """Erase did nothing: the one-line reason says why and what to do."""


@dataclass
class Erasure:
    """What erase did, one line per place."""

    lines: list[str] = field(default_factory=list)
    failed: bool = False

    def add(self, place: str, what: str) -> None:
        self.lines.append(f"{place}: {what}")


def erase(
    sinks: RepairSinks,
    route: TableRoute,
    key_columns: Sequence[str],
    ids: Sequence[str],
    source_ids: Callable[[], Collection[str]],
    caught_up: Callable[[], str | None],
    purge: bool = False,
) -> Erasure:
    """Remove `ids` (document ids) of `route`'s table from every sink and document index it
    goes to. `source_ids`: those of `ids` Postgres holds now (refused when any); `caught_up`:
    waits until the pipeline applied every change committed before it was called, None when it
    did, else the reason it did not (refused: nothing erased)."""
    present = sorted(set(source_ids()) & set(ids))
    if present:
        raise ConfigError(
            "command line",
            "--key",
            f"{route.table} still holds {present} in Postgres: delete the rows there first "
            "(the stream would bring them back), then erase",
        )
    behind = caught_up()
    if behind is not None:
        raise ErasureRefused(behind)
    outcome = Erasure()
    names = [name for name in SINK_NAMES if _section(route, name) is not None]
    warehouse = Path(sinks.connections.require("warehouse")) if route.delta else None
    newest = _newest_versions(sinks, route, key_columns, ids, names, warehouse)
    erased = {doc_id: version + 1 for doc_id, version in newest.items()}
    for name in names:
        removed = delete_extra_rows(sinks, name, route, key_columns, ids, source_ids, erased)
        outcome.add(f"{name} {_place(route, name)}", removed.describe())
        outcome.failed |= bool(removed.failures or removed.fenced)
    for name in _documents_rooted_at(sinks.mapping, route.table):
        document = document_route(sinks.mapping, name)
        removed = delete_extra_rows(sinks, "search", document, [ID_COLUMN], ids, source_ids)
        outcome.add(f"documents {name}", removed.describe())
        outcome.failed |= bool(removed.failures or removed.fenced)
    for name in _documents_nesting(sinks.mapping, route.table):
        outcome.add(
            f"documents {name}",
            "rendered again without the rows by the job when it applied their deletes",
        )
    if warehouse is not None and route.delta is not None and route.delta.history:
        outcome.add(
            f"history {route.delta.history_name()}",
            f"{_delete_history(warehouse, route, ids)} rows deleted",
        )
        record_erased(warehouse, route.delta, erased)
        unknown = sorted(set(ids) - erased.keys())
        outcome.add(
            "history erased-keys record",
            f"{len(erased)} keys recorded"
            + (f" ({len(unknown)} without a known version: {unknown[:5]})" if unknown else ""),
        )
    if purge and warehouse is not None and route.delta is not None:
        for path, label in _purged_tables(warehouse, route):
            if open_table(path) is None:
                continue
            purged = purge_table(path, sinks.retry)
            outcome.add(
                f"purge {label}",
                f"{purged.files} files and {purged.log_files} log entries no current row needs "
                "deleted",
            )
    return outcome


def wait_until_applied(
    conn: psycopg.Connection[Any],
    connections: Connections,
    mapping: MappingFile,
    table: TableId,
    timeout_seconds: float,
    checkpoint: Path,
) -> str | None:
    """Wait until every consumer of the log that applies `table` (its sinks, the document
    indices that hold it) applied every change committed before now; None once they did, else
    a one-line reason (`erase`'s `caught_up`). `checkpoint`: the job's checkpoint root, where
    the document consumers' checkpoints are."""
    found = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert found is not None
    target = parse_lsn(str(found[0]))
    started = time.monotonic()
    names = waited_sinks(mapping, table)
    if not names:
        return (
            f"{mapping.path} routes no table to a sink with an applied watermark, so erase "
            f"cannot tell the job applied what was committed before it: nothing erased"
        )
    result = wait_for_lsn(
        target, connections, sinks=names, mapping=mapping, timeout_seconds=timeout_seconds
    )
    if not result.reached:
        progress = "; ".join(sink.describe(target) for sink in result.sinks)
        return (
            f"the sync job has not applied everything committed before erase started "
            f"({format_lsn(target)}) within {timeout_seconds:g} s ({progress}): nothing erased; "
            "run the job (`cdc-sync run`) until it catches up, then erase again"
        )
    documents = documents_holding(mapping, table)
    if not documents:
        return None
    remaining = max(timeout_seconds - (time.monotonic() - started), 0.0)
    return _documents_caught_up(mapping, connections, documents, checkpoint, remaining)


def waited_sinks(mapping: MappingFile, table: TableId) -> list[str]:
    """The sinks whose applied watermarks tell that what was committed before erase is in
    Kafka and applied: those `table` is routed to, else (a table only document indices hold)
    every sink the mapping routes to."""
    route = mapping.tables[table]
    names = [name for name in SINK_NAMES if _section(route, name) is not None]
    if names:
        return names
    return [n for n in SINK_NAMES if any(_section(r, n) for r in mapping.tables.values())]


def _section(route: TableRoute, sink: str) -> object | None:
    return {"search": route.search, "cache": route.cache, "delta": route.delta}[sink]


def _documents_caught_up(
    mapping: MappingFile,
    connections: Connections,
    documents: Sequence[str],
    checkpoint: Path,
    timeout_seconds: float,
) -> str | None:
    """Document consumers record no applied watermark: once a sink's watermark reached the
    position, every change committed before it is in Kafka (the watermark's rule,
    job.observe.watermark_rule), so each document consumer has applied them once its checkpoint's
    processed offsets reach the end offsets read now, in every partition of its tables."""
    deadline = time.monotonic() + timeout_seconds
    ends_reader = EndOffsets(connections.require("kafka_bootstrap"), connections.kafka_flavor)
    try:
        topics = {
            name: [f"{mapping.topic_prefix}.{t}" for t in sorted(mapping.documents[name].tables())]
            for name in documents
        }
        ends = {name: ends_reader.of(found) for name, found in topics.items()}
    finally:
        ends_reader.close()
    while True:
        behind = {name: document_behind(checkpoint, name, wanted) for name, wanted in ends.items()}
        behind = {name: why for name, why in behind.items() if why is not None}
        if not behind:
            return None
        if time.monotonic() >= deadline:
            details = "; ".join(f"documents {name}: {why}" for name, why in sorted(behind.items()))
            return (
                f"the document indices have not applied everything committed before erase "
                f"started within the wait ({details}): nothing erased; run the job until they "
                "catch up (or name their checkpoint with --checkpoint), then erase again"
            )
        time.sleep(POLL_SECONDS)


def document_behind(checkpoint: Path, name: str, wanted: PartitionOffsets) -> str | None:
    """Why document index `name`'s consumer (under the job's `checkpoint` root) has not
    processed every partition up to `wanted` yet; None once it has."""
    folder = consumer_checkpoint(checkpoint, f"{DOCUMENTS_PREFIX}{name}")
    processed = processed_offsets(folder)
    if processed is None:
        return f"no batch committed in {folder}"
    late = sorted(
        f"{topic}[{part}] {processed.offsets.get((topic, part), 0)}/{end}"
        for (topic, part), end in wanted.items()
        if processed.offsets.get((topic, part), 0) < end
    )
    return f"behind at {', '.join(late)}" if late else None


def documents_holding(mapping: MappingFile, table: TableId) -> list[str]:
    """The document indices whose documents hold `table`'s rows (as root or nested)."""
    return sorted(name for name, spec in mapping.documents.items() if table in spec.tables())


def _documents_rooted_at(mapping: MappingFile, table: TableId) -> list[str]:
    return sorted(name for name, spec in mapping.documents.items() if spec.table == table)


def _documents_nesting(mapping: MappingFile, table: TableId) -> list[str]:
    return [n for n in documents_holding(mapping, table) if mapping.documents[n].table != table]


def _place(route: TableRoute, name: str) -> str:
    if name == "search" and route.search is not None:
        return route.search.index
    if name == "cache" and route.cache is not None:
        return f"{route.cache.prefix}:{route.table}"
    assert route.delta is not None
    return f"{route.delta.schema}.{route.delta.table}"


def _newest_versions(
    sinks: RepairSinks,
    route: TableRoute,
    key_columns: Sequence[str],
    ids: Sequence[str],
    names: Sequence[str],
    warehouse: Path | None,
) -> dict[str, int]:
    """doc id -> the newest version any sink holds or remembers for it: stored rows, delete
    tombstones (cache, Delta), the history and an earlier erasure. Keys none knows are left out.
    (The search server's delete tombstones cannot be read back; the other two remember the
    same delete for the same retention.)"""
    newest: dict[str, int] = {}

    def raise_all(found: Mapping[str, int]) -> None:
        for doc_id, version in found.items():
            newest[doc_id] = max(version, newest.get(doc_id, version))

    for name in names:
        read = partial(sinks.stored, name, route, key_columns, ids)
        stored = read_retried(read, f"erase {name} {route.table}", sinks.retry)
        raise_all({doc_id: version for doc_id, (version, _) in stored.items()})
    cache = sinks.sink("cache") if route.cache is not None else None
    if isinstance(cache, RedisSink) and route.cache is not None:
        raise_all(cache_readback.tombstone_versions(cache.client, route.cache, route.table, ids))
    if warehouse is not None and route.delta is not None:
        delta = route.delta
        raise_all(erased_versions(warehouse, delta, list(ids)))
        stones = TombstoneStore(warehouse, sinks.mapping.tombstone_retention_seconds)
        raise_all(stones.recorded_deletes(delta, list(ids)))
        wanted = set(ids)
        raise_all(
            {
                str(row[ID]): int(row[VERSION_LAST])
                for row in delta_readback.history_rows(warehouse, delta)
                if row[ID] in wanted
            }
        )
    return newest


def _delete_history(warehouse: Path, route: TableRoute, ids: Sequence[str]) -> int:
    assert route.delta is not None
    table = open_table(history_path(warehouse, route.delta))
    if table is None:
        return 0
    data = table.to_pyarrow_table(columns=[ID])
    held = pc.is_in(data[ID].cast(pa.string()), pa.array(list(ids), type=pa.string()))
    if not pc.any(held).as_py():
        return 0
    quoted = ", ".join(datafusion_string(i) for i in ids)
    metrics = table.delete(f"{datafusion_quote(ID)} IN ({quoted})")
    return int(metrics.get("num_deleted_rows", 0))


def _purged_tables(warehouse: Path, route: TableRoute) -> list[tuple[Path, str]]:
    assert route.delta is not None
    delta = route.delta
    tables = [(table_path(warehouse, delta), f"{delta.schema}.{delta.table}")]
    if delta.history:
        tables.append((history_path(warehouse, delta), delta.history_name()))
    return tables
