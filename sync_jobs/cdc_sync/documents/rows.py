"""Rows as documents hold them: JSON values keyed by doc id, and where a renderer reads them.

A row is kept as the JSON the flat search index would hold for it (`sinks.documents`), so a
nested field equals its flat twin. How rows join and sort is Postgres's rule for the columns'
types (`comparisons`), not their JSON's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cdc_sync.core.model import TableId

if TYPE_CHECKING:
    from cdc_sync.documents.comparisons import Comparisons


@dataclass(frozen=True)
class Row:
    id: str  # the doc id of the row's primary key (core.model.document_id)
    key: tuple[Any, ...]  # its primary-key values (JSON), in key order
    doc: Mapping[str, Any]  # every column, JSON values


class RowSource(Protocol):
    """Where a renderer reads rows (the job's state), and how its join index encodes them."""

    @property
    def comparisons(self) -> Comparisons:
        """The join pairs and array orders the source's join index was built for."""
        ...

    def rows(self, table: TableId, ids: Sequence[str]) -> list[Row]:
        """The rows of `table` with these doc ids (absent ones left out)."""
        ...

    def joined(self, table: TableId, key: str, values: Iterable[str]) -> list[Row]:
        """The rows of `table` with one of these join values under `key` (a join side's
        `comparisons.Side.key`: its column and rule)."""
        ...


def json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    assert isinstance(value, dict)
    return value


def dumps(value: Mapping[str, Any] | Sequence[Any]) -> str:
    return json.dumps(value, separators=(",", ":"))
