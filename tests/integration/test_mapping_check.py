"""`cdc-sync mappings validate` against a real Postgres catalog."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cdc_sync.cli import main
from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.debezium.connector import load_connector
from cdc_sync.debezium.database import SourceDatabase
from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.job.settle.shape_check import check_shapes
from cdc_sync.mapping import load_mapping
from cdc_sync.schema.catalog import ConverterModes
from cdc_sync.verify.mapping_check import validate_mapping
from tests.pg import private_database

pytestmark = pytest.mark.integration
SHOP = Path("mappings/shop.yaml")
BAD_MAPPING = """
version: 1
source: {topic_prefix: cdc}
tables:
  shop.customers:
    columns: [id, email, nickname]
    rename: {missing_column: x}
    search:
      index: c
      mapping: {properties: {email: {type: long}, id: {type: long}, ghost: {type: keyword}}}
  shop.products: {}
  shop.orders: {}
  shop.nowhere: {}
  shop.no_pk: {}
ignore: [shop.order_lines, shop.cdc_sync_signal, shop.cdc_sync_heartbeat]
"""


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    with private_database(pg_url, "check") as url:
        create_demo_schema(url, seed_rows=False)
        yield url


def test_the_demo_mapping_passes(database: str) -> None:
    mapping = load_mapping(SHOP)
    with psycopg.connect(database) as conn:
        assert validate_mapping(mapping, conn, load_connector(Path("connectors/shop.json"))) == []


def test_problems_name_the_file_and_field_path(database: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_MAPPING)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("CREATE TABLE shop.no_pk (a int)")
        conn.execute("CREATE TABLE shop.unrouted (id int PRIMARY KEY, g point)")
        connector = load_connector(Path("connectors/shop.json"))
        connector = type(connector)(
            connector.path, connector.name, dict(connector.config) | {"table.include.list": ""}
        )
        findings = [str(f) for f in validate_mapping(load_mapping(bad), conn, connector)]
    expected = [
        "tables: captured table shop.unrouted is neither routed nor ignored",
        "tables.shop.customers.columns: no column 'nickname'",
        "tables.shop.customers.rename.missing_column: no column 'missing_column'",
        "tables.shop.customers.search.mapping.properties.email: type 'long' cannot hold a string",
        "tables.shop.customers.search.mapping.properties.ghost: no such routed column",
        "tables.shop.nowhere: table shop.nowhere does not exist",
        "tables.shop.no_pk: shop.no_pk has no primary key",
    ]
    for text in expected:
        assert any(f.startswith(str(bad)) and text in f for f in findings), (text, findings)
    assert len(findings) == len(expected), findings


def test_cli_exit_code(database: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CDC_SYNC_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("CDC_SYNC_PG_URL", database)
    monkeypatch.delenv("CDC_SYNC_SEARCH_URL", raising=False)
    assert main(["mappings", "validate", "--mapping", str(SHOP)]) == 0
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("ALTER TABLE shop.products ADD COLUMN location point")
    assert main(["mappings", "validate", "--mapping", str(SHOP)]) == 1


SHAPED_MAPPING = """
version: 1
source: {topic_prefix: cdc}
tables:
  shop.customers:
    search:
      computed: {full_name2: "upper(full_nam)"}
    cache:
      computed: {twice: "id + email"}
  shop.products:
    search: {filter: "price"}
    cache: {hash: {fields: [colour], secret_env: X}}
  shop.orders:
    search: {mask: {id: "0"}}
    delta: {hash: {fields: [id], secret_env: X}}
ignore: [shop.order_lines, shop.cdc_sync_signal, shop.cdc_sync_heartbeat]
"""


def test_bad_expressions_and_fields_name_the_file_and_field_path(
    database: str, tmp_path: Path
) -> None:
    bad = tmp_path / "shaped.yaml"
    bad.write_text(SHAPED_MAPPING)
    with psycopg.connect(database) as conn:
        findings = [
            str(f)
            for f in validate_mapping(
                load_mapping(bad), conn, load_connector(Path("connectors/shop.json"))
            )
        ]
    expected = [
        "tables.shop.customers.search.computed.full_name2: Binder Error: Referenced column "
        '"full_nam" not found',
        "tables.shop.customers.cache.computed.twice: Binder Error: No function matches",
        "tables.shop.products.search.filter: a filter is a boolean expression, this is decimal",
        "tables.shop.products.cache.hash.fields: no field 'colour'",
        "tables.shop.orders.search.mask: key column 'id' cannot be masked",
        "tables.shop.orders.delta.hash.fields: key column 'id' cannot be hashed",
    ]
    for text in expected:
        assert any(f.startswith(f"{bad}: {text}") for f in findings), (text, findings)
    assert len(findings) == len(expected), findings


def test_the_job_start_check_names_the_field_and_binds_the_hash_secret(
    database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "start.yaml"
    text = (
        "version: 1\nsource: {topic_prefix: cdc}\ntables:\n  shop.customers:\n"
        "    search: {hash: {fields: [email], secret_env: CDC_SYNC_T_KEY}}\n"
        "    cache: {computed: {n: '%s'}}\n"
    )
    source, modes = SourceDatabase(database, "test"), ConverterModes()
    path.write_text(text % "length(full_name)")
    monkeypatch.delenv("CDC_SYNC_T_KEY", raising=False)
    with pytest.raises(ConfigError) as missing:
        check_shapes(load_mapping(path), source, modes)
    assert str(missing.value).startswith(f"{path}: tables.shop.customers.search.hash.secret_env")
    monkeypatch.setenv("CDC_SYNC_T_KEY", "very-secret")
    bound = check_shapes(load_mapping(path), source, modes)
    shape = bound.tables[TableId("shop", "customers")].shapes["search"]
    assert shape.hash is not None and shape.hash.key == b"very-secret"
    assert "very-secret" not in repr(bound)  # the secret is never printed
    path.write_text(text % "length(fullname)")
    with pytest.raises(ConfigError) as unknown:
        check_shapes(load_mapping(path), source, modes)
    assert unknown.value.path == "tables.shop.customers.cache.computed.n"
    assert "fullname" in unknown.value.message
    path.write_text(
        "version: 1\nsource: {topic_prefix: cdc}\ntables:\n  shop.customers:\n"
        "    cache: {mask: {id: '0'}}\n"
    )
    with pytest.raises(ConfigError) as masked_key:  # the job does not start
        check_shapes(load_mapping(path), source, modes)
    assert masked_key.value.path == "tables.shop.customers.cache.mask"
    assert "key column 'id' cannot be masked" in masked_key.value.message


BAD_DOCUMENTS = """
version: 1
source: {topic_prefix: cdc}
tables: {}
documents:
  orders:
    root: shop.orders
    columns: [id, colour]
    filter: "no_such_column > 1"
    relations:
      status: {table: shop.customers, kind: one, join: {customer_id: id}}
      customer: {table: shop.customers, kind: one, join: {customer_id: email}}
      lines:
        table: shop.order_lines
        join: {id: order_no}
        order_by: [position]
        relations:
          product: {table: shop.products, kind: one, join: {product_id: id}, columns: [sku, gone]}
ignore: [shop.cdc_sync_signal, shop.cdc_sync_heartbeat]
"""


def test_document_specs_are_checked_against_the_catalog(database: str, tmp_path: Path) -> None:
    bad = tmp_path / "documents.yaml"
    bad.write_text(BAD_DOCUMENTS)
    with psycopg.connect(database) as conn:
        findings = [str(f) for f in validate_mapping(load_mapping(bad), conn, None)]
    expected = [
        "documents.orders.columns: no column 'colour' in shop.orders",
        "documents.orders.filter: ",
        "documents.orders.relations.customer.join: shop.orders.customer_id (int8) and "
        "shop.customers.email (text) do not join: Postgres has no = for them",
        "documents.orders.relations.lines.join: no column 'order_no' in shop.order_lines",
        "documents.orders.relations.lines.order_by: no column 'position' in shop.order_lines",
        "documents.orders.relations.lines.relations.product.columns: no column 'gone'",
    ]
    for text in expected:
        assert any(f.startswith(str(bad)) and text in f for f in findings), (text, findings)
    assert len(findings) == len(expected), findings


JOINS = """
version: 1
source: {topic_prefix: cdc}
tables: {}
documents:
  lines:
    root: shop.order_lines
    filter: "quantity::text ~ '^[0-9]+$'"  # Postgres SQL the job's engine reads too
    relations:
      # int4 to numeric(10,2): Postgres compares them by value.
      priced: {table: shop.products, kind: one, join: {quantity: price}}
      tagged:
        table: shop.labels
        join: {order_id: id}  # bigint to int4
        relations:
          named: {table: shop.customers, kind: one, join: {label: email}}  # citext to text
      slotted:
        table: shop.slots
        join: {line_no: n}
        order_by: [at, tags]  # a time sorts as Postgres sorts it; an array does not
        relations:
          # time to timetz: Postgres compares them, cdc-sync does not join them.
          same: {table: shop.slots, join: {at: zoned}}
      # timestamptz to text: Postgres has no `=` for them.
      dated: {table: shop.customers, kind: one, join: {unit_price: created_at}}
  orders:
    root: shop.orders
    filter: "len(status) > 1"  # the job's engine reads it, Postgres (verify) does not
ignore: [shop.cdc_sync_signal, shop.cdc_sync_heartbeat]
"""


def test_document_joins_are_the_pairs_postgres_compares(database: str, tmp_path: Path) -> None:
    """Every pair Postgres compares with `=` is accepted (an int4 foreign key to a numeric key
    too); a pair it refuses, or one cdc-sync does not join, is refused naming the field."""
    path = tmp_path / "joins.yaml"
    path.write_text(JOINS)
    with psycopg.connect(database) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS citext")
        conn.execute("CREATE TABLE shop.labels (id int PRIMARY KEY, label citext)")
        conn.execute(
            "CREATE TABLE shop.slots (n int PRIMARY KEY, at time, zoned timetz, tags text[])"
        )
        findings = [str(f) for f in validate_mapping(load_mapping(path), conn, None)]
    expected = [
        "documents.lines.relations.slotted.order_by: shop.slots.tags (_text): arrays sort by ",
        "documents.lines.relations.slotted.relations.same.join: shop.slots.at (time) and "
        "shop.slots.zoned (timetz): Postgres compares them, but cdc-sync does not join them",
        "documents.lines.relations.dated.join: shop.order_lines.unit_price (numeric) and "
        "shop.customers.created_at (timestamptz) do not join: Postgres has no = for them",
        "documents.orders.filter: Postgres cannot evaluate it (verify does): function len(",
    ]
    for text in expected:
        assert any(f.startswith(str(path)) and text in f for f in findings), (text, findings)
    assert len(findings) == len(expected), findings
