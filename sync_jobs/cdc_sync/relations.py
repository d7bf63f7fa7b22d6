"""Document specs (mapping key `documents`): one root table and its related rows, nested.

A document index holds one document per row of its root table, with related rows nested in it:
a many-to-one relation as an object (`order.customer`), a one-to-many as an array
(`order.lines`), a many-to-many through a join table (`product.tags` via `product_tags`), to any
depth. Each relation joins on `join: {parent column: child column}` (through a join table:
`through.join` joins the parent to the join table, `join` the join table to the child; not
`on`, which YAML reads as `true`). Every level
projects its row with the same `columns` / `rename` as a table route. Parsed here, once;
`cdc_sync.documents` keeps them current from the log, `cdc_sync.verify` checks them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cdc_sync.core.errors import FieldReader
from cdc_sync.core.model import TableId


class Kind(StrEnum):
    ONE = "one"  # an object (or null): the parent's foreign key names one child row
    MANY = "many"  # an array: the child rows that point at the parent


class NestedType(StrEnum):
    OBJECT = "object"  # fields flattened into the parent (Elasticsearch's default)
    NESTED = "nested"  # each element its own hidden document: queries match within one element


@dataclass(frozen=True)
class Through:
    """A many-to-many's join table: `join` pairs the parent's columns with the join table's."""

    table: TableId
    on: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Level:
    """What one level of a document keeps of its row (the root, or a relation's rows)."""

    table: TableId
    columns: tuple[str, ...] | None = None  # None: every column
    rename: Mapping[str, str] = field(default_factory=dict)
    relations: tuple[Relation, ...] = ()

    def project(self, row: Mapping[str, Any]) -> dict[str, Any]:
        kept = row if self.columns is None else {c: row[c] for c in self.columns if c in row}
        return {self.rename.get(name, name): value for name, value in kept.items()}


@dataclass(frozen=True)
class Relation(Level):
    name: str = ""  # the field the related rows are nested under
    kind: Kind = Kind.ONE
    # (parent column, child column), or with `through`: (join-table column, child column)
    on: tuple[tuple[str, str], ...] = ()
    through: Through | None = None
    order_by: tuple[str, ...] = ()  # an array's order (child columns); default its key
    nested_type: NestedType = NestedType.OBJECT


@dataclass(frozen=True)
class DocumentSpec(Level):
    name: str = ""
    index: str = ""  # the alias applications query
    filter: str | None = None  # SQL over the root row: a root that stops matching leaves
    mapping: Mapping[str, Any] = field(default_factory=dict)  # search mapping (overrides)
    settings: Mapping[str, Any] = field(default_factory=dict)

    def walk(self) -> Iterator[tuple[Level, Relation | None, Level | None]]:
        """Every level with the relation that reaches it and its parent level (root: None)."""
        pending: list[tuple[Level, Relation | None, Level | None]] = [(self, None, None)]
        while pending:
            level, via, parent = pending.pop(0)
            yield level, via, parent
            pending += [(child, child, level) for child in level.relations]

    def tables(self) -> frozenset[TableId]:
        """Every table whose rows a document holds or joins through."""
        return self.read_besides_roots() | {self.table}

    def read_besides_roots(self) -> frozenset[TableId]:
        """The tables a document reads besides its root rows: each nested level's and each
        join table (the root's own table too where a level nests it again)."""
        found = set()
        for level, via, _ in self.walk():
            if via is not None:
                found.add(level.table)
                if via.through is not None:
                    found.add(via.through.table)
        return frozenset(found)


_DOCUMENT_KEYS = (
    "index",
    "root",
    "columns",
    "rename",
    "filter",
    "relations",
    "mapping",
    "settings",
)
_RELATION_KEYS = (
    "table",
    "kind",
    "join",
    "through",
    "columns",
    "rename",
    "relations",
    "order_by",
    "type",
)


def parse_documents(reader: FieldReader) -> dict[str, DocumentSpec]:
    """The `documents` section: name -> spec (the index defaults to the name)."""
    specs = {}
    for name in reader.data:
        section = reader.child(str(name))
        section.reject_unknown(_DOCUMENT_KEYS)
        mapping, settings = section.data.get("mapping", {}), section.data.get("settings", {})
        for key, value in (("mapping", mapping), ("settings", settings)):
            if not isinstance(value, Mapping):
                raise section.error(key, "expected a mapping")
        specs[str(name)] = DocumentSpec(
            table=_table(section, "root"),
            columns=section.str_list("columns"),
            rename=section.str_map("rename"),
            relations=_relations(section),
            name=str(name),
            index=section.str_("index", str(name)),
            filter=section.optional_str("filter"),
            mapping=mapping,
            settings=settings,
        )
        _check_fields(section, specs[str(name)])
    return specs


def _relations(reader: FieldReader) -> tuple[Relation, ...]:
    section = reader.child("relations")
    relations = []
    for name in section.data:
        child = section.child(str(name))
        child.reject_unknown(_RELATION_KEYS)
        through = _through(child)
        kind = Kind(child.choice("kind", [k.value for k in Kind], Kind.MANY.value))
        if through is not None and kind is not Kind.MANY:
            raise child.error("kind", "a relation through a join table is an array: kind many")
        relation = Relation(
            table=_table(child, "table"),
            columns=child.str_list("columns"),
            rename=child.str_map("rename"),
            relations=_relations(child),
            name=str(name),
            kind=kind,
            on=_pairs(child, "join"),
            through=through,
            order_by=child.str_list("order_by") or (),
            nested_type=NestedType(
                child.choice("type", [t.value for t in NestedType], NestedType.OBJECT.value)
            ),
        )
        _check_fields(child, relation)
        relations.append(relation)
    return tuple(relations)


def _through(reader: FieldReader) -> Through | None:
    if reader.data.get("through") is None:
        return None
    section = reader.child("through")
    section.reject_unknown(("table", "join"))
    return Through(_table(section, "table"), _pairs(section, "join"))


def _pairs(reader: FieldReader, name: str) -> tuple[tuple[str, str], ...]:
    pairs = tuple(reader.str_map(name).items())
    if not pairs:
        raise reader.error(name, "expected {parent column: child column, ...}: how the rows join")
    return pairs


def _table(reader: FieldReader, name: str) -> TableId:
    try:
        return TableId.parse(reader.str_(name))
    except ValueError as exc:
        raise reader.error(name, str(exc)) from exc


def _check_fields(reader: FieldReader, level: Level) -> None:
    """A relation's field must not collide with a projected column's name."""
    projected = {level.rename.get(c, c) for c in level.columns or ()}
    names = [r.name for r in level.relations]
    clash = sorted({n for n in names if n in projected or names.count(n) > 1})
    if clash:
        raise reader.error("relations", f"{clash}: a relation's field is also a column or twice")
