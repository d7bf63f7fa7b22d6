"""The log's consumers: one per sink and one per document index (invariant 8).

Each consumer is its own streaming query in the one Spark application: it reads the topics of
the tables it applies (and the heartbeat table's), decodes and folds them with the shared code,
writes its one target, and commits its own offsets in its own checkpoint. Everything the job
keeps beside a checkpoint (snapshot floors, open transactions, truncate fences, accepted
schemas, the dead-letter ledger, the status file, a document index's state) is kept per
consumer too: consumers share code, not state, so a slow or stalled sink holds only itself.

A consumer sees the mapping narrowed to what it applies (`Consumer.mapping`): the search
consumer the routes' search sections, the cache consumer their cache sections, the warehouse
consumer their Delta sections, a document consumer its document's tables and spec. The rest of
the job is written against a mapping, so it runs unchanged per consumer.

Checkpoint layout, under the job's checkpoint root: `search/`, `redis/`, `delta/`,
`documents/<name>/`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.mapping import MappingFile, TableRoute

# Consumer name -> the route section it applies (the sinks' names, `Sink.name`).
SINK_SECTIONS = {"search": "search", "redis": "cache", "delta": "delta"}
DOCUMENTS_PREFIX = "documents:"


@dataclass(frozen=True)
class Consumer:
    """One consumer of the log: its name, the mapping narrowed to it, its checkpoint."""

    name: str  # search | redis | delta | documents:<document name>
    mapping: MappingFile
    checkpoint_dir: Path

    @property
    def document(self) -> str | None:
        """The document index it keeps, for a document consumer."""
        return self.name.removeprefix(DOCUMENTS_PREFIX) if self.is_document else None

    @property
    def is_document(self) -> bool:
        return self.name.startswith(DOCUMENTS_PREFIX)

    def tables(self) -> list[TableId]:
        return sorted(self.mapping.tables)


def consumer_names(mapping: MappingFile) -> list[str]:
    """Every consumer the mapping needs: each routed sink, then each document index."""
    sinks = [
        name
        for name, section in SINK_SECTIONS.items()
        if any(getattr(route, section) is not None for route in mapping.tables.values())
    ]
    return sinks + [f"{DOCUMENTS_PREFIX}{name}" for name in sorted(mapping.documents)]


def consumer_checkpoint(root: Path, name: str) -> Path:
    if name.startswith(DOCUMENTS_PREFIX):
        return root / "documents" / name.removeprefix(DOCUMENTS_PREFIX)
    return root / name


def plan_consumers(
    mapping: MappingFile,
    root: Path,
    only: Collection[str] | None = None,
    check_layout: bool = True,
) -> list[Consumer]:
    """The consumers to run (`only`: a subset by name, e.g. to run the documents in another
    application), each on its checkpoint under `root`. Refuses a checkpoint of the earlier
    layout (one query for every sink), which no consumer could resume (unless not
    `check_layout`: readers that report it themselves)."""
    if check_layout:
        refuse_single_query_checkpoint(root)
    names = consumer_names(mapping)
    if only is not None:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ConfigError(
                "command line",
                "--consumers",
                f"{unknown} are not consumers of {mapping.path} (its consumers: "
                f"{', '.join(names)})",
            )
        names = [name for name in names if name in only]
    return [
        Consumer(name, narrowed(mapping, name), consumer_checkpoint(root, name)) for name in names
    ]


def narrowed(mapping: MappingFile, name: str) -> MappingFile:
    """`mapping` as consumer `name` applies it: only its tables, only its section of each."""
    if name.startswith(DOCUMENTS_PREFIX):
        document = name.removeprefix(DOCUMENTS_PREFIX)
        spec = mapping.documents[document]
        tables = {
            table: _only(mapping.tables[table], None, documents=True)
            for table in sorted(spec.tables())
        }
        return dataclasses.replace(mapping, tables=tables, documents={document: spec})
    section = SINK_SECTIONS[name]
    tables = {
        table: _only(route, section, documents=False)
        for table, route in mapping.tables.items()
        if getattr(route, section) is not None
    }
    return dataclasses.replace(mapping, tables=tables, documents={})


def _only(route: TableRoute, section: str | None, documents: bool) -> TableRoute:
    """The route with only `section` (none: a document consumer keeps whole rows)."""
    return dataclasses.replace(
        route,
        search=route.search if section == "search" else None,
        cache=route.cache if section == "cache" else None,
        delta=route.delta if section == "delta" else None,
        shapes={s: shape for s, shape in route.shapes.items() if s == section},
        documents=documents,
    )


class SingleQueryCheckpoint(ConfigError):
    """A checkpoint written by a release that ran one query for every sink."""


def refuse_single_query_checkpoint(root: Path) -> None:
    if (root / "offsets").is_dir() or (root / "commits").is_dir():
        raise SingleQueryCheckpoint(
            str(root),
            "checkpoint",
            "was written by an earlier release, which ran one streaming query for every sink; "
            "each sink now has its own checkpoint below the root. Start over on a new "
            f"checkpoint (`cdc-sync run --checkpoint NEW_DIR`, or `rm -r {root}`): the job "
            "replays the topics, and every sink's writes are fenced, so a replay is harmless",
        )
