"""Documents from rows: one per root row, related rows nested, in bulk (no I/O of its own).

Each relation is fetched once for all the parents of a chunk (`RowSource.joined`: one lookup per
relation and chunk, never one per root), matched to its parents in memory on every join pair,
and rendered in turn. Rows join and arrays sort as Postgres compares the columns' types
(`comparisons`). The job renders from its state (`documents.state`); verify computes the same
documents in Postgres itself (`verify.documents`), so a rule the two shared could not hide.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from cdc_sync.core.model import TableId
from cdc_sync.documents.comparisons import Pair
from cdc_sync.documents.rows import Row, RowSource
from cdc_sync.relations import Kind, Level, Relation


def render(level: Level, rows: Sequence[Row], source: RowSource) -> dict[str, dict[str, Any]]:
    """doc id -> the document of each row of `level` (its projection, relations nested)."""
    documents = {row.id: level.project(row.doc) for row in rows}
    for relation in level.relations:
        children = related(level.table, relation, rows, source)
        unique = {row.id: row for found in children.values() for row in found}
        rendered = render(relation, list(unique.values()), source)
        for row in rows:
            nested = [rendered[child.id] for child in children.get(row.id, [])]
            if relation.kind is Kind.ONE:
                documents[row.id][relation.name] = nested[0] if nested else None
            else:
                documents[row.id][relation.name] = nested
    return documents


def related(
    parent: TableId, relation: Relation, parents: Sequence[Row], source: RowSource
) -> dict[str, list[Row]]:
    """Parent doc id -> its related rows, in the relation's order."""
    if not parents:
        return {}
    compare = source.comparisons
    if relation.through is None:
        pairs = compare.pairs(parent, relation.table, relation.on)
        children = _index(_joined(source, relation.table, parents, pairs), pairs)
        found = {p.id: children.get(_parent_link(p, pairs), []) for p in parents}
    else:
        through = relation.through
        hop = compare.pairs(parent, through.table, through.on)
        joins = _joined(source, through.table, parents, hop)
        by_link = _index(joins, hop)
        pairs = compare.pairs(through.table, relation.table, relation.on)
        children = _index(_joined(source, relation.table, joins, pairs), pairs)
        found = {
            p.id: [
                child
                for join in by_link.get(_parent_link(p, hop), [])
                for child in children.get(_parent_link(join, pairs), [])
            ]
            for p in parents
        }
    order = compare.order(relation.table, relation.order_by)
    return {pid: sorted(rows, key=order) for pid, rows in found.items()}


def _joined(
    source: RowSource, table: TableId, parents: Sequence[Row], pairs: Sequence[Pair]
) -> list[Row]:
    """The rows of `table` joining any of `parents` on the first pair (all pairs: `_index`)."""
    first = pairs[0]
    values = {v for v in (first.parent.value(p) for p in parents) if v is not None}
    return source.joined(table, first.child.key, values) if values else []


def _parent_link(row: Row, pairs: Sequence[Pair]) -> tuple[str | None, ...] | None:
    """The parent row's join values; None if any is null (SQL: a null joins nothing)."""
    values = tuple(pair.parent.value(row) for pair in pairs)
    return None if None in values else values


def _index(rows: Sequence[Row], pairs: Sequence[Pair]) -> dict[Any, list[Row]]:
    """Rows by their join values (child side), in a dict: matching is one lookup per parent."""
    grouped: dict[Any, list[Row]] = defaultdict(list)
    for row in rows:
        values = tuple(pair.child.value(row) for pair in pairs)
        if None not in values:
            grouped[values].append(row)
    return grouped
