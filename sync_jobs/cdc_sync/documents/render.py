"""Documents from rows: one per root row, related rows nested, in bulk (no I/O of its own).

Each relation is fetched once for all the parents of a chunk (`RowSource.joined`: one lookup per
relation and chunk, never one per root), matched to its parents in memory, and rendered in turn.
The job renders from its state (`documents.state`), verify from Postgres (`verify.documents`):
the same function, so a difference is a difference in rows, never in rendering.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from cdc_sync.core.model import TableId
from cdc_sync.documents.rows import Row, RowSource, link_value, sort_key, values_of
from cdc_sync.relations import Kind, Level, Relation


def render(level: Level, rows: Sequence[Row], source: RowSource) -> dict[str, dict[str, Any]]:
    """doc id -> the document of each row of `level` (its projection, relations nested)."""
    documents = {row.id: level.project(row.doc) for row in rows}
    for relation in level.relations:
        children = related(relation, rows, source)
        unique = {row.id: row for found in children.values() for row in found}
        rendered = render(relation, list(unique.values()), source)
        for row in rows:
            nested = [rendered[child.id] for child in children.get(row.id, [])]
            if relation.kind is Kind.ONE:
                documents[row.id][relation.name] = nested[0] if nested else None
            else:
                documents[row.id][relation.name] = nested
    return documents


def related(relation: Relation, parents: Sequence[Row], source: RowSource) -> dict[str, list[Row]]:
    """Parent doc id -> its related rows, in the relation's order."""
    if not parents:
        return {}
    if relation.through is None:
        children = _index(_joined(source, relation.table, parents, relation.on), relation.on)
        found = {p.id: children.get(_link(p, relation.on, 0), []) for p in parents}
    else:
        through = relation.through
        joins = _joined(source, through.table, parents, through.on)
        by_link = _index(joins, through.on)
        children = _index(_joined(source, relation.table, joins, relation.on), relation.on)
        found = {
            p.id: [
                child
                for join in by_link.get(_link(p, through.on, 0), [])
                for child in children.get(_link(join, relation.on, 0), [])
            ]
            for p in parents
        }
    return {pid: _ordered(relation, rows) for pid, rows in found.items()}


def _joined(
    source: RowSource, table: TableId, parents: Sequence[Row], on: Sequence[tuple[str, str]]
) -> list[Row]:
    """The rows of `table` joining any of `parents` on the first pair (all pairs: `_index`)."""
    parent_column, child_column = on[0]
    values = values_of(parents, parent_column)
    return source.joined(table, child_column, values) if values else []


def _link(row: Row, on: Sequence[tuple[str, str]], side: int) -> tuple[str | None, ...] | None:
    """The row's join values (side 0: the parent's columns, 1: the child's); None if any is
    null (SQL: a null joins nothing)."""
    values = tuple(link_value(row.doc.get(pair[side])) for pair in on)
    return None if any(v is None for v in values) else values


def _index(rows: Sequence[Row], on: Sequence[tuple[str, str]]) -> dict[Any, list[Row]]:
    """Rows by their join values (child side), in a dict: matching is one lookup per parent."""
    grouped: dict[Any, list[Row]] = defaultdict(list)
    for row in rows:
        link = _link(row, on, 1)
        if link is not None:
            grouped[link].append(row)
    return grouped


def _ordered(relation: Relation, rows: list[Row]) -> list[Row]:
    def order(row: Row) -> tuple[Any, ...]:
        return (sort_key(row.doc.get(c) for c in relation.order_by), sort_key(row.key), row.id)

    return sorted(rows, key=order)
