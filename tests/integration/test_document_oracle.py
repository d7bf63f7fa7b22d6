"""Verify's document oracle and repair's document rewrite on real Postgres and the search server.

The oracle (`verify.documents`: one SQL query per spec, Postgres joins, nests, orders and
filters) gives, for a three-level document with a many-to-many, the documents written out by
hand here; `document_comparison` reports exactly the missing, different and extra documents of
an index; repair's fence version lies between the commit end of every transaction before it
and that of its own signal's, as Postgres's logical decoding reports them; documents rewritten
at it replace older ones and keep a newer one.
"""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_sync.core.lsn import parse_lsn
from cdc_sync.core.model import Coordinates
from cdc_sync.documents.sync import document_action
from cdc_sync.documents.target import document_route
from cdc_sync.mapping import MappingFile, load_mapping
from cdc_sync.schema.catalog import ConverterModes, row_schema_from_catalog
from cdc_sync.sinks.search import SearchSink
from cdc_sync.sinks.search import readback as search_readback
from cdc_sync.verify.compare import document_comparison, register_loaders
from cdc_sync.verify.document_repair import fence_version, rewrite_documents
from cdc_sync.verify.documents import DocumentOracle
from tests.pg import private_database

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE EXTENSION IF NOT EXISTS citext;
CREATE SCHEMA o;
CREATE TABLE o.customers (id int PRIMARY KEY, name text, tier char(4));
CREATE TABLE o.orders (id bigint PRIMARY KEY, customer_id int, status text,
                       total numeric(10, 2), placed timestamptz, rush boolean);
CREATE TABLE o.lines (order_id bigint, n int, product text, qty int, price numeric(8, 2),
                      PRIMARY KEY (order_id, n));
CREATE TABLE o.products (sku text PRIMARY KEY, label text);
CREATE TABLE o.tags (id int PRIMARY KEY, label citext);
CREATE TABLE o.product_tags (sku text, tag_id int, PRIMARY KEY (sku, tag_id));
CREATE TABLE o.cdc_sync_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL,
                                data varchar(2048));
INSERT INTO o.customers VALUES (1, 'Ada', 'vip'), (2, 'Bob', NULL);
INSERT INTO o.products VALUES ('p1', 'Pen'), ('p2', 'Pad');
INSERT INTO o.tags VALUES (1, 'Blue'), (2, 'azure'), (3, 'Cyan');
INSERT INTO o.product_tags VALUES ('p1', 1), ('p1', 2), ('p1', 3), ('p2', 3);
INSERT INTO o.orders VALUES (10, 1, 'new', 12.50, '2024-01-02 03:04:05+00', true),
    (11, 2, 'paid', NULL, NULL, false), (12, 99, 'new', 1, NULL, NULL),
    (13, 1, 'void', 3, NULL, true);
INSERT INTO o.lines VALUES (10, 1, 'p1', 2, 5.00), (10, 2, 'p2', 1, -1.25),
    (10, 3, 'p9', 1, NULL), (11, 1, 'p2', 4, 2.00);
"""
MAPPING = """
version: 1
source: {topic_prefix: t}
documents:
  orders:
    index: {index}
    root: o.orders
    filter: "status <> 'void'"
    columns: [id, status, total, placed, rush]
    rename: {total: amount}
    relations:
      customer: {table: o.customers, kind: one, join: {customer_id: id}, columns: [name, tier]}
      lines:
        table: o.lines
        join: {id: order_id}
        order_by: [price]
        columns: [n, qty, price]
        relations:
          product:
            table: o.products
            kind: one
            join: {product: sku}
            relations:
              tags:
                table: o.tags
                through: {table: o.product_tags, join: {sku: sku}}
                join: {tag_id: id}
                order_by: [label]
"""
PAD = {"sku": "p2", "label": "Pad", "tags": [{"id": 3, "label": "Cyan"}]}
TAGS = [{"id": 2, "label": "azure"}, {"id": 1, "label": "Blue"}, {"id": 3, "label": "Cyan"}]
EXPECTED: dict[str, dict[str, Any]] = {
    "10": {
        "id": 10,
        "status": "new",
        "amount": "12.50",
        "placed": "2024-01-02T03:04:05+00:00",
        "rush": True,
        "customer": {"name": "Ada", "tier": "vip "},  # char(4), as Postgres outputs it
        "lines": [  # by price, nulls last; a line whose product is missing has null
            {"n": 2, "qty": 1, "price": "-1.25", "product": PAD},
            {
                "n": 1,
                "qty": 2,
                "price": "5.00",
                "product": {"sku": "p1", "label": "Pen", "tags": TAGS},
            },
            {"n": 3, "qty": 1, "price": None, "product": None},
        ],
    },
    "11": {
        "id": 11,
        "status": "paid",
        "amount": None,
        "placed": None,
        "rush": False,
        "customer": {"name": "Bob", "tier": None},
        "lines": [{"n": 1, "qty": 4, "price": "2.00", "product": PAD}],
    },
    "12": {
        "id": 12,
        "status": "new",
        "amount": "1.00",
        "placed": None,
        "rush": None,
        "customer": None,
        "lines": [],
    },
}  # 13 is void: the filter leaves it out
SIGNALS = {"signal.data.collection": "o.cdc_sync_signal"}


@dataclass
class Setup:
    conn: psycopg.Connection[Any]
    mapping: MappingFile
    search: SearchSink


@pytest.fixture
def setup(pg_url: str, search_url: str, tmp_path: Path) -> Iterator[Setup]:
    path = tmp_path / "documents.yaml"
    # An index of its own: the search server serves the whole session.
    path.write_text(textwrap.dedent(MAPPING).replace("{index}", f"oracle_{uuid.uuid4().hex[:8]}"))
    mapping = load_mapping(path)
    spec = mapping.documents["orders"]
    search = SearchSink("opensearch", search_url, 3600)
    with private_database(pg_url, "oracle") as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA.encode())
        register_loaders(conn)
        schemas = {t: row_schema_from_catalog(conn, t) for t in spec.tables()}
        search.ensure_target(document_route(spec, schemas, mapping.policies_for(spec.table)), None)
        try:
            yield Setup(conn, mapping, search)
        finally:
            search.close()


def write(setup: Setup, documents: dict[str, dict[str, Any] | None], version: int) -> None:
    spec = setup.mapping.documents["orders"]
    where = Coordinates("test", 0, 0)
    actions = [document_action(spec.table, where, i, version, d) for i, d in documents.items()]
    assert not setup.search.write_documents(spec.index, actions).failures


def test_postgres_computes_every_document_of_the_spec(setup: Setup) -> None:
    oracle = DocumentOracle(setup.conn, setup.mapping.documents["orders"], ConverterModes())
    assert dict(oracle.documents(chunk=2)) == EXPECTED
    assert sorted(oracle.ids()) == ["10", "11", "12"]


def test_the_comparison_names_missing_different_and_extra_documents(setup: Setup) -> None:
    lines = EXPECTED["10"]["lines"]
    assert isinstance(lines, list)
    wrong = {**EXPECTED["10"], "lines": lines[::-1]}  # another order
    write(setup, {"10": wrong, "12": EXPECTED["12"], "13": {"id": 13}}, 5)
    comparison = document_comparison(
        setup.conn, setup.mapping, "orders", setup.search.backend, ConverterModes(), chunk=2
    )
    (found,) = comparison.sinks
    assert (found.missing, found.different, found.extra) == (["11"], ["10"], ["13"])
    assert (comparison.source_count, found.count) == (3, 3)
    write(setup, {"10": EXPECTED["10"], "11": EXPECTED["11"], "13": None}, 6)
    again = document_comparison(
        setup.conn, setup.mapping, "orders", setup.search.backend, ConverterModes()
    )
    assert again.matches


def test_the_fence_lies_between_earlier_commits_and_its_own_signal(setup: Setup) -> None:
    """Logical decoding (test_decoding) reports each transaction's commit end, which is the
    version Debezium gives the transaction streamed after it."""
    conn = setup.conn
    conn.execute("SELECT pg_create_logical_replication_slot('oracle_fence', 'test_decoding')")
    conn.execute("UPDATE o.orders SET status = 'paid' WHERE id = 12")  # before the fence
    fence = fence_version(conn, SIGNALS)
    conn.execute("UPDATE o.orders SET status = 'new' WHERE id = 12")  # after it
    changes = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_get_changes('oracle_fence', NULL, NULL)"
    ).fetchall()
    commits = [parse_lsn(lsn) for lsn, data in changes if data.startswith("COMMIT")]
    assert len(commits) == 3  # the update before, the signal, the update after
    before, signal, _ = commits
    assert before <= fence < signal
    assert any("cdc_sync_signal" in data and "'log'" in data for _, data in changes)


def test_rewritten_documents_replace_older_ones_and_keep_newer_ones(setup: Setup) -> None:
    write(setup, {"10": {"id": 10, "status": "stale"}}, 5)
    newer = {**EXPECTED["12"], "status": "rendered later"}
    write(setup, {"12": newer}, 2**62)  # a render from a state newer than the fence
    spec = setup.mapping.documents["orders"]
    done = rewrite_documents(
        setup.search, setup.mapping, "orders", setup.conn, SIGNALS, ["10", "11", "12", "404"]
    )
    assert (done.written, done.kept, done.gone, done.failures) == (2, 1, 1, [])
    held = search_readback.documents(setup.search.backend, spec.index)
    assert {i: d for i, (_, d) in held.items()} == {**EXPECTED, "12": newer}
    assert held["10"][0] == held["11"][0] == done.fence
    write(setup, {"10": {"id": 10, "status": "older render"}}, done.fence - 1)  # fenced
    assert search_readback.documents(setup.search.backend, spec.index)["10"][1] == EXPECTED["10"]
