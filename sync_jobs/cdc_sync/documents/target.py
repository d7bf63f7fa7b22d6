"""A document index's search mapping: each level's fields typed from its table's schema, each
relation an `object` or `nested` field, the spec's own `mapping` over both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdc_sync.core.model import TableId
from cdc_sync.mapping import Policies, SearchRoute, TableRoute
from cdc_sync.relations import DocumentSpec, Level, Relation
from cdc_sync.schema import RowSchema, search_field_mapping


def document_route(
    spec: DocumentSpec, schemas: Mapping[TableId, RowSchema], policies: Policies
) -> TableRoute:
    """The route the search sink writes a document index through (its alias, its mapping)."""
    mapping = _merged({"properties": _properties(spec, schemas)}, spec.mapping)
    search = SearchRoute(index=spec.index, mapping=mapping, settings=spec.settings)
    return TableRoute(spec.table, None, {}, search, None, None, policies)


def _properties(level: Level, schemas: Mapping[TableId, RowSchema]) -> dict[str, Any]:
    schema = schemas.get(level.table)
    properties: dict[str, Any] = {}
    for column in schema.columns if schema is not None else ():
        if level.columns is None or column.name in level.columns:
            field = search_field_mapping(column.type)
            if field:
                properties[level.rename.get(column.name, column.name)] = field
    for relation in level.relations:
        properties[relation.name] = _relation_field(relation, schemas)
    return properties


def _relation_field(relation: Relation, schemas: Mapping[TableId, RowSchema]) -> dict[str, Any]:
    return {"type": relation.nested_type.value, "properties": _properties(relation, schemas)}


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` wins, key by key, into nested mappings."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out
