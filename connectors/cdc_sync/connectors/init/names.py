"""The search index and the Delta table `cdc-sync init` gives each table: valid, and distinct.

An index is `<name>_<schema>_<table>`, lower-cased and made valid (`names.index_for`); a Delta
table keeps the table's own name unless that is no directory name. Tables that would still
share one (`Users` and `users` in one index; in one Delta table for catalogs that ignore case)
each get a suffix from their exact name, except the one whose name was already the plain form:
the mapping init writes never maps two tables to one place (mapping load refuses that).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cdc_sync.core.model import TableId
from cdc_sync.names import delta_problem, index_for


@dataclass(frozen=True)
class TableNames:
    indices: dict[TableId, str]
    deltas: dict[TableId, TableId]

    @classmethod
    def of(cls, name: str, tables: Sequence[TableId]) -> TableNames:
        def index(t: TableId) -> str:
            return index_for(name, t.schema, t.table)

        def delta(t: TableId) -> str:
            return f"{_directory(t.schema)}/{_directory(t.table)}"

        index_suffixed = _shared(tables, index, lambda t: f"{name}_{t.schema}_{t.table}")
        delta_suffixed = _shared(tables, lambda t: delta(t).casefold(), delta)
        return cls(
            {t: index(t) + (_suffix(t) if index_suffixed[t] else "") for t in tables},
            {
                t: TableId(
                    _directory(t.schema),
                    _directory(t.table) + (_suffix(t) if delta_suffixed[t] else ""),
                )
                for t in tables
            },
        )

    def index(self, table: TableId) -> str:
        return self.indices[table]

    def delta(self, table: TableId) -> TableId:
        return self.deltas[table]

    def renamed(self, name: str) -> list[str]:
        """Lines saying which tables did not get the plain name, for init's output."""
        lines = []
        for table in sorted(self.indices):
            index, delta = self.indices[table], self.deltas[table]
            if index != index_for(name, table.schema, table.table):
                lines.append(f"{table}: search index {index} (another's would be the same)")
            if delta != table:
                lines.append(
                    f"{table}: Delta table {delta} (its name is no directory name, or another "
                    "table's differs by case alone)"
                )
        return lines


def _suffix(table: TableId) -> str:
    """Six hex digits of the table's exact name: stable across runs of init."""
    return "_t" + hashlib.sha1(str(table).encode()).hexdigest()[:6]


def _shared(
    tables: Sequence[TableId], name: Callable[[TableId], str], plain: Callable[[TableId], str]
) -> dict[TableId, bool]:
    """Per table, whether it needs a suffix: it shares `name` with another table and is not
    the first (in name order) whose name is its `plain` form."""
    groups: dict[str, list[TableId]] = defaultdict(list)
    for table in sorted(tables):
        groups[name(table)].append(table)
    suffixed = {}
    for derived, group in groups.items():
        keeper = (
            next((t for t in group if plain(t) == derived), None) if len(group) > 1 else group[0]
        )
        for table in group:
            suffixed[table] = table != keeper
    return suffixed


def _directory(part: str) -> str:
    """`part` as a directory name (`names.delta_problem`): path separators and control
    characters replaced with `_`."""
    if delta_problem(part) is None:
        return part
    cleaned = "".join("_" if c in "/\\" or ord(c) < 0x20 else c for c in part)
    return "_" * len(part) if cleaned in (".", "..") else cleaned
