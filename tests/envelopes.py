"""Debezium JsonConverter records (schemas.enable=true) for unit tests, in Debezium's own shape."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from typing import Any

from cdc_sync.core.model import Coordinates

UNAVAILABLE = "__debezium_unavailable_value"


def field(
    name: str, type_: str, optional: bool = True, logical: str | None = None, **parameters: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": type_, "optional": optional, "field": name}
    if logical:
        spec["name"] = logical
        spec["version"] = 1
    if parameters:
        spec["parameters"] = parameters
    return spec


def decimal_field(name: str, scale: int, precision: int) -> dict[str, Any]:
    return field(
        name,
        "bytes",
        True,
        "org.apache.kafka.connect.data.Decimal",
        scale=str(scale),
        **{"connect.decimal.precision": str(precision)},
    )


def encode_decimal(value: Decimal, scale: int) -> str:
    unscaled = int(value.scaleb(scale))
    length = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


PRODUCT_FIELDS = [
    field("id", "int32", optional=False),
    field("sku", "string", optional=False),
    field("name", "string", optional=False),
    field("description", "string"),
    decimal_field("price", 2, 10),
    field("in_stock", "boolean", optional=False),
]
KEY_FIELDS = {
    "products": [field("id", "int32", optional=False)],
    "order_lines": [
        field("order_id", "int64", optional=False),
        field("line_no", "int32", optional=False),
    ],
}


def key_bytes(table: str, values: dict[str, Any]) -> bytes:
    schema = {
        "type": "struct",
        "optional": False,
        "name": f"cdc.shop.{table}.Key",
        "fields": KEY_FIELDS[table],
    }
    return json.dumps({"schema": schema, "payload": values}).encode()


def envelope_bytes(
    table: str,
    op: str,
    lsn: int,
    after: dict[str, Any] | None,
    before: dict[str, Any] | None = None,
    fields: list[dict[str, Any]] | None = None,
    ts_ms: int = 1_700_000_000_000,
) -> bytes:
    row_fields = fields or PRODUCT_FIELDS
    row_schema = {
        "type": "struct",
        "optional": True,
        "name": f"cdc.shop.{table}.Value",
        "fields": row_fields,
    }
    source_schema = {
        "type": "struct",
        "optional": False,
        "name": "io.debezium.connector.postgresql.Source",
        "field": "source",
        "fields": [
            field("lsn", "int64"),
            field("schema", "string"),
            field("table", "string"),
            field("ts_ms", "int64"),
        ],
    }
    schema = {
        "type": "struct",
        "optional": False,
        "name": f"cdc.shop.{table}.Envelope",
        "version": 2,
        "fields": [
            dict(row_schema, field="before"),
            dict(row_schema, field="after"),
            source_schema,
            field("op", "string", optional=False),
            field("ts_ms", "int64"),
        ],
    }
    payload = {
        "before": before,
        "after": after,
        "op": op,
        "ts_ms": ts_ms + 5,
        "source": {
            "version": "3.6.3.Final",
            "connector": "postgresql",
            "name": "cdc",
            "ts_ms": ts_ms,
            "snapshot": "false",
            "db": "shop",
            "schema": "shop",
            "table": table,
            "txId": 1,
            "lsn": lsn,
            "xmin": None,
        },
    }
    return json.dumps({"schema": schema, "payload": payload}).encode()


def product(
    id_: int, name: str = "Keyboard", description: str | None = "long text", price: str = "89.90"
) -> dict[str, Any]:
    return {
        "id": id_,
        "sku": f"SKU-{id_}",
        "name": name,
        "description": description,
        "price": encode_decimal(Decimal(price), 2),
        "in_stock": True,
    }


def coords(offset: int, topic: str = "cdc.shop.products", partition: int = 0) -> Coordinates:
    return Coordinates(topic, partition, offset)


def truncate_bytes(table: str, last_commit: int | None, lsn: int) -> bytes:
    """A truncate event as Debezium writes it (tests/integration/test_debezium_truncate.py): op
    `t`, no before/after, `source.sequence` [last commit, lsn]; it goes without a key."""
    document = json.loads(envelope_bytes(table, "t", lsn, None))
    commit = None if last_commit is None else str(last_commit)
    document["payload"]["source"]["sequence"] = json.dumps([commit, str(lsn)])
    return json.dumps(document).encode()
