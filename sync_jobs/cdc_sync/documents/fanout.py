"""Which documents a batch's changes touch: the roots above every changed row, in bulk.

A changed row (before and after the change: a foreign-key move touches the old parent and the
new one) reaches its roots by climbing its relations, one lookup per relation for all the
batch's rows of that level (`RowSource.joined`), never one per row. Rows whose join values did
not change climb through the state as it is now; rows whose join values changed are themselves
in the batch, with their old values. Matching on a relation's first join column may select a
few roots too many (composite joins): re-rendering a document that did not change is harmless.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cdc_sync.core.model import TableId
from cdc_sync.documents.comparisons import Pair
from cdc_sync.documents.rows import Row, RowSource
from cdc_sync.documents.state import Changed
from cdc_sync.relations import DocumentSpec, Level, Relation


def affected_roots(
    spec: DocumentSpec, changed: Mapping[TableId, Changed], source: RowSource
) -> set[str]:
    """The doc ids of `spec`'s roots whose documents the changes may have changed."""
    up: dict[int, tuple[Relation, Level]] = {}
    roots: set[str] = set()
    for level, via, parent in spec.walk():
        if via is not None and parent is not None:
            up[id(level)] = (via, parent)
        found = changed.get(level.table)
        if found is not None:
            if level is spec:
                roots |= found.ids
            else:
                roots |= _climb(level, found.rows(), up, source)
        if via is not None and parent is not None and via.through is not None:
            joins = changed.get(via.through.table)
            if joins is not None:
                parents = _through_parents(via, parent.table, joins.rows(), source)
                roots |= _climb(parent, parents, up, source)
    return roots


def _climb(
    level: Level, rows: Sequence[Row], up: Mapping[int, tuple[Relation, Level]], source: RowSource
) -> set[str]:
    while rows and id(level) in up:
        via, parent = up[id(level)]
        rows = _parents(via, parent.table, rows, source)
        level = parent
    return {row.id for row in rows}


def _parents(
    via: Relation, parent: TableId, children: Sequence[Row], source: RowSource
) -> list[Row]:
    """The rows of `parent` that `children` are nested in through `via`."""
    upper = parent if via.through is None else via.through.table
    found = _up(source.comparisons.pairs(upper, via.table, via.on), children, source)
    return found if via.through is None else _through_parents(via, parent, found, source)


def _through_parents(
    via: Relation, parent: TableId, joins: Sequence[Row], source: RowSource
) -> list[Row]:
    assert via.through is not None
    return _up(source.comparisons.pairs(parent, via.through.table, via.through.on), joins, source)


def _up(pairs: Sequence[Pair], children: Sequence[Row], source: RowSource) -> list[Row]:
    """The parent rows joining any of `children` on the first of `pairs`."""
    first = pairs[0]
    values = {v for v in (first.child.value(row) for row in children) if v is not None}
    return source.joined(first.parent.table, first.parent.key, values) if values else []
