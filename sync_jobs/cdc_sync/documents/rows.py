"""Rows as documents hold them: JSON values keyed by doc id, and how rows join and sort.

A row is kept as the JSON the flat search index would hold for it (`sinks.documents`), so a
nested field equals its flat twin. Rows join on their columns' JSON values (`link_value`): a
foreign key and the key it names encode alike when their types agree, as Postgres requires.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cdc_sync.core.model import TableId


@dataclass(frozen=True)
class Row:
    id: str  # the doc id of the row's primary key (core.model.document_id)
    key: tuple[Any, ...]  # its primary-key values (JSON), in key order: arrays sort by it
    doc: Mapping[str, Any]  # every column, JSON values


class RowSource(Protocol):
    """Where a renderer reads rows: the job's state, or Postgres for verify."""

    def rows(self, table: TableId, ids: Sequence[str]) -> list[Row]:
        """The rows of `table` with these doc ids (absent ones left out)."""
        ...

    def joined(self, table: TableId, column: str, values: Iterable[str]) -> list[Row]:
        """The rows of `table` whose `column` has one of these `link_value`s."""
        ...


def link_value(value: Any) -> str | None:
    """A column's JSON value as the text rows join on; None (SQL NULL) joins nothing. Tagged by
    kind, so 1 and "1" differ as they do in JSON; integers and strings (nearly every key) skip
    the JSON encoder, which a fan-out calls for every join value of every row."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "b:1" if value else "b:0"
    if isinstance(value, int):
        return f"i:{value}"
    if isinstance(value, str):
        return f"s:{value}"
    return "j:" + json.dumps(value, sort_keys=True, separators=(",", ":"))


def row_links(row: Row, columns: Iterable[str]) -> list[tuple[str, str]]:
    """(column, link value) of the row's join columns that are not null."""
    out = []
    for column in columns:
        value = link_value(row.doc.get(column))
        if value is not None:
            out.append((column, value))
    return out


def sort_key(values: Iterable[Any]) -> tuple[tuple[int, Any], ...]:
    """A total order over JSON values (arrays' order; alike wherever documents render)."""
    ranked: list[tuple[int, Any]] = []
    for value in values:
        if value is None:
            ranked.append((0, 0))
        elif isinstance(value, bool):
            ranked.append((1, int(value)))
        elif isinstance(value, int | float):
            ranked.append((2, value))
        elif isinstance(value, str):
            ranked.append((3, value))
        else:
            ranked.append((4, link_value(value)))
    return tuple(ranked)


def values_of(rows: Iterable[Row], column: str) -> set[str]:
    found = (link_value(row.doc.get(column)) for row in rows)
    return {value for value in found if value is not None}


def json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    assert isinstance(value, dict)
    return value


def dumps(value: Mapping[str, Any] | Sequence[Any]) -> str:
    return json.dumps(value, separators=(",", ":"))
