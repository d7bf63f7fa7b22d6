"""Which documents a batch's changes touch: the roots above every changed row, in bulk.

A changed row (before and after the change: a foreign-key move touches the old parent and the
new one) reaches its roots by climbing its relations, one lookup per relation for all the
batch's rows of that level, never one per row. Rows whose join values did not change climb
through the state as it is now; rows whose join values changed are themselves in the batch,
with their old values. Above the batch's own rows the climb reads the state's join index only
(`climbed`: join values and doc ids, never a row): a product renamed under a million orders
holds their ids, not their rows (reading the rows, it held every line and order parsed:
2.4 GB). Matching on a relation's first join column may select a few roots too many
(composite joins): re-rendering a document that did not change is harmless.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from cdc_sync.core.model import TableId
from cdc_sync.documents.comparisons import Comparisons, Pair, Side
from cdc_sync.documents.rows import Row
from cdc_sync.documents.state import Changed
from cdc_sync.relations import DocumentSpec, Level, Relation


class JoinIndex(Protocol):
    """The state's join index, as a fan-out climbs it (`DocumentState`)."""

    @property
    def comparisons(self) -> Comparisons: ...

    def climbed(
        self, table: TableId, key: str, values: Iterable[str], then: str | None
    ) -> set[str]: ...


@dataclass(frozen=True)
class Hop:
    """One join up: from rows joining on `child` to the rows joining on `parent`."""

    child: Side
    parent: Side


def affected_roots(
    spec: DocumentSpec, changed: Mapping[TableId, Changed], index: JoinIndex
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
                roots |= _climb(_hops(level, up, index), found.rows(), index)
        if via is not None and parent is not None and via.through is not None:
            joins = changed.get(via.through.table)
            if joins is not None:
                hops = [_through_hop(via, parent.table, index), *_hops(parent, up, index)]
                roots |= _climb(hops, joins.rows(), index)
    return roots


def _hops(level: Level, up: Mapping[int, tuple[Relation, Level]], index: JoinIndex) -> list[Hop]:
    """The joins from `level`'s rows up to the root's (through a join table: two)."""
    hops = []
    while id(level) in up:
        via, parent = up[id(level)]
        upper = parent.table if via.through is None else via.through.table
        hops.append(_first(index.comparisons.pairs(upper, via.table, via.on)))
        if via.through is not None:
            hops.append(_through_hop(via, parent.table, index))
        level = parent
    return hops


def _through_hop(via: Relation, parent: TableId, index: JoinIndex) -> Hop:
    """From a join table's rows to the parents they join."""
    assert via.through is not None
    return _first(index.comparisons.pairs(parent, via.through.table, via.through.on))


def _first(pairs: Sequence[Pair]) -> Hop:
    return Hop(pairs[0].child, pairs[0].parent)


def _climb(hops: Sequence[Hop], rows: Sequence[Row], index: JoinIndex) -> set[str]:
    """The root ids above `rows` (the batch's, in memory) up `hops`: the first hop's values
    from the rows themselves, every other from the join index."""
    if not hops:
        return {row.id for row in rows}
    values = {v for v in (hops[0].child.value(row) for row in rows) if v is not None}
    for hop, above in zip(hops, [*hops[1:], None], strict=True):
        if not values:
            return set()
        then = None if above is None else above.child.key
        values = index.climbed(hop.parent.table, hop.parent.key, values, then)
    return values
