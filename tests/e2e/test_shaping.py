"""Per-sink shapes on the local stack (mapping tests/e2e/shaping/shop_shaped.yaml): rows enter
and leave filtered sinks (one entering with its TOASTed description unchanged), computed and
hashed / masked / dropped fields per sink, soft deletes and a re-insert, soft deletes under
filters (a sink marks only the rows it holds), and a re-snapshot after lost offsets (rows
deleted meanwhile are marked, marked ones stay); `verify` (which shapes the Postgres rows by
the same rule, and checks marked rows against Postgres) reports no difference after each
step."""

from __future__ import annotations

import hashlib
import hmac
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from cdc_sync.core.model import TableId
from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.sinks.search.backends import open_backend
from cdc_sync.verify.compare import cache_rows, canonical, delta_rows, search_rows
from tests.e2e.cases import md5_series
from tests.e2e.conftest import Services, running_pipeline
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.pg import private_database

pytestmark = pytest.mark.e2e
REDIS_DB = 12  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9-11
MAPPING = Path(__file__).parent / "shaping" / "shop_shaped.yaml"
SECRET_ENV, SECRET = "CDC_SYNC_E2E_HASH_KEY", "e2e-hash-key"
CUSTOMERS, PRODUCTS = TableId("shop", "customers"), TableId("shop", "products")
TOASTED = "(SELECT string_agg(md5(g::text), '' ORDER BY g) FROM generate_series(1, 400) g)"


@pytest.fixture(scope="module")
def shaped(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncHarness]:
    root = tmp_path_factory.mktemp("e2e-shaping")
    previous = os.environ.get(SECRET_ENV)
    os.environ[SECRET_ENV] = SECRET  # read by the job at start, and by verify here
    try:
        with private_database(services.pg_url, "shaping_e2e") as database:
            connections = services.connections(database, REDIS_DB, root)
            create_demo_schema(database)
            mapping = e2e_mapping(f"sh{uuid.uuid4().hex[:6]}", MAPPING)
            with running_pipeline(services.spark, mapping, connections, root, {}) as harness:
                yield harness
    finally:
        if previous is None:
            os.environ.pop(SECRET_ENV, None)
        else:
            os.environ[SECRET_ENV] = previous


def held(pipeline: SyncHarness, table: TableId) -> dict[str, dict[str, dict[str, Any]]]:
    """sink -> doc id -> canonical row, as verify reads them."""
    connections = pipeline.connections
    route = pipeline.mapping.tables[table]
    cache = redis.Redis.from_url(connections.require("redis_url"))
    search = open_backend(connections.search_client, connections.require("search_url"))
    try:
        return {
            "search": search_rows(search, route),
            "cache": cache_rows(cache, route),
            "delta": delta_rows(
                Path(connections.require("warehouse")), route, pipeline.key_columns(table)
            ),
        }
    finally:
        cache.close()
        search.close()


def step(pipeline: SyncHarness, *sql: str) -> None:
    """Run `sql`, then wait until verify reports zero differences in every sink."""
    pipeline.run_sql(list(sql))
    report = pipeline.wait_converged()
    assert report.converged, report.table()


def test_rows_enter_and_leave_filters_and_arrive_whole(shaped: SyncHarness) -> None:
    step(
        shaped,
        "INSERT INTO shop.products (id, sku, name, description, price, in_stock) "
        f"VALUES (9700, 'SH-1', 'Entering', {TOASTED}, 12.34, false)",
        "INSERT INTO shop.products (id, sku, name, price) VALUES (9701, 'SH-2', 'Leaving', 50)",
    )
    rows = held(shaped, PRODUCTS)
    assert "9700" not in rows["search"] and "9701" in rows["search"]
    assert rows["cache"]["9700"]["price_cents"] == canonical(1234)
    assert "description" not in rows["cache"]["9700"]  # dropped from the cache
    # Enters the index on an update that leaves the TOASTed description unchanged (Debezium
    # sends a placeholder; the job fills it from Postgres before the filter): whole.
    step(
        shaped,
        "UPDATE shop.products SET in_stock = true WHERE id = 9700",
        "UPDATE shop.products SET in_stock = false WHERE id = 9701",
        "UPDATE shop.products SET price = 150 WHERE id = 9700",
    )
    rows = held(shaped, PRODUCTS)
    assert rows["search"]["9700"]["description"] == canonical(md5_series(400))
    assert rows["search"]["9700"]["price_cents"] == canonical(15000)
    assert "9701" not in rows["search"]  # left the in-stock index
    assert "9700" not in rows["cache"] and "9701" in rows["cache"]  # price < 100 only
    assert rows["delta"]["9700"]["description"] == canonical(md5_series(400))
    assert rows["delta"]["9701"]["price_cents"] == canonical(5000)


def test_computed_hashed_and_masked_fields_per_sink(shaped: SyncHarness) -> None:
    step(
        shaped,
        "INSERT INTO shop.customers (id, email, full_name, tier) "
        "VALUES (9800, 'ada.shaped@example.com', 'Ada Shaped', 'gold')",
    )
    rows = held(shaped, CUSTOMERS)
    digest = hmac.new(SECRET.encode(), b"ada.shaped@example.com", hashlib.sha256).hexdigest()
    assert rows["search"]["9800"]["email"] == digest
    assert rows["cache"]["9800"]["email"] == "***"
    assert rows["delta"]["9800"]["email"] == "ada.shaped@example.com"  # the warehouse keeps it
    for sink in ("search", "cache", "delta"):
        assert rows[sink]["9800"]["display"] == "ADA SHAPED <gold>", sink
    assert "created_at" not in rows["cache"]["9800"]  # not in the cache's column list


def test_soft_delete_keeps_the_row_marked_and_a_reinsert_clears_it(shaped: SyncHarness) -> None:
    step(
        shaped,
        "INSERT INTO shop.customers (id, email, full_name) VALUES (9801, 'b@example.com', 'Bo')",
        "INSERT INTO shop.customers (id, email, full_name) VALUES (9802, 'c@example.com', 'Cy')",
    )
    step(
        shaped,
        "DELETE FROM shop.customers WHERE id IN (9801, 9802)",
    )
    rows = held(shaped, CUSTOMERS)
    for sink, (deleted, at) in {
        "search": ("_deleted", "_deleted_at"),
        "cache": ("_deleted", "_deleted_at"),
        "delta": ("_cdc_is_deleted", "_cdc_deleted_at"),
    }.items():
        for ident in ("9801", "9802"):
            row = rows[sink][ident]
            assert row[deleted] is True and row[at] is not None, (sink, row)
            assert row["full_name"] in ("Bo", "Cy"), (sink, row)  # the stored fields stay
    step(
        shaped,
        "INSERT INTO shop.customers (id, email, full_name) VALUES (9801, 'b2@example.com', 'Bo 2')",
    )
    rows = held(shaped, CUSTOMERS)
    assert rows["search"]["9801"]["_deleted"] is False
    assert rows["cache"]["9801"]["full_name"] == "Bo 2"
    assert rows["delta"]["9801"]["_cdc_is_deleted"] is False
    assert rows["delta"]["9802"]["_cdc_is_deleted"] is True


MARKERS = {
    "search": ("_deleted", "_deleted_at"),
    "cache": ("_deleted", "_deleted_at"),
    "delta": ("_cdc_is_deleted", "_cdc_deleted_at"),
}


def marked(rows: dict[str, dict[str, dict[str, Any]]], sink: str, ident: str) -> bool:
    return rows[sink][ident][MARKERS[sink][0]] is True


def product(ident: int, in_stock: bool, price: int) -> str:
    return (
        "INSERT INTO shop.products (id, sku, name, price, in_stock) "
        f"VALUES ({ident}, 'SD-{ident}', 'Soft {ident}', {price}, {str(in_stock).lower()})"
    )


def test_soft_deletes_under_filters_mark_only_the_rows_a_sink_holds(shaped: SyncHarness) -> None:
    """Issue 27 point 5: a delete wrote `{id, _deleted: true}` into every soft-delete sink,
    the ones whose filter excluded the row too. The index holds in-stock products, the cache
    those under 100; Delta all of them."""
    step(shaped, product(9900, in_stock=False, price=50), product(9901, in_stock=True, price=150))
    step(shaped, "DELETE FROM shop.products WHERE id IN (9900, 9901)")
    rows = held(shaped, PRODUCTS)
    assert "9900" not in rows["search"] and marked(rows, "search", "9901")
    assert marked(rows, "cache", "9900") and "9901" not in rows["cache"]
    assert marked(rows, "delta", "9900") and marked(rows, "delta", "9901")
    assert rows["search"]["9901"]["name"] == "Soft 9901"  # the stored fields stay
    # Out of stock, then deleted, in one transaction (one batch: the delete alone is left):
    # the index held it in stock, but the row had left its filter when it was deleted.
    step(shaped, product(9902, in_stock=True, price=20))
    step(
        shaped,
        "BEGIN; UPDATE shop.products SET in_stock = false, name = 'Last' WHERE id = 9902; "
        "DELETE FROM shop.products WHERE id = 9902; COMMIT",
    )
    rows = held(shaped, PRODUCTS)
    assert "9902" not in rows["search"]
    assert marked(rows, "cache", "9902") and rows["cache"]["9902"]["name"] == "Last"
    assert marked(rows, "delta", "9902") and rows["delta"]["9902"]["name"] == "Last"


def test_a_resnapshot_marks_rows_deleted_while_capture_lost_its_offsets(
    shaped: SyncHarness,
) -> None:
    """Issue 27 point 6: capture restarted without its offsets takes a new initial snapshot,
    whose end removed every older row, soft-deleted ones included, and the rows deleted while
    capture was down instead of marking them. Last in the module (a second snapshot)."""
    step(
        shaped,
        product(9910, in_stock=True, price=20),
        product(9911, in_stock=True, price=30),
        "INSERT INTO shop.customers (id, email, full_name) VALUES (9812, 'd@example.com', 'Di')",
    )
    step(
        shaped,
        "DELETE FROM shop.products WHERE id = 9911",
        "DELETE FROM shop.customers WHERE id = 9812",
    )
    before = held(shaped, PRODUCTS)
    customers_before = held(shaped, CUSTOMERS)
    assert shaped.snapshot_again is not None
    shaped.snapshot_again(lambda: shaped.run_sql(["DELETE FROM shop.products WHERE id = 9910"]))
    # Converged only once the snapshot's end applied: 9910 is extra until then.
    report = shaped.wait_converged(timeout_seconds=300)
    assert report.converged, report.table()
    rows = held(shaped, PRODUCTS)
    for sink, (_, at) in MARKERS.items():
        assert marked(rows, sink, "9910"), (sink, rows[sink].get("9910"))
        assert rows[sink]["9910"][at] is not None and rows[sink]["9910"]["name"] == "Soft 9910"
        assert rows[sink]["9911"] == before[sink]["9911"], sink  # kept as it was marked
    customers = held(shaped, CUSTOMERS)  # soft deletes without a filter
    for sink in MARKERS:
        assert customers[sink]["9812"] == customers_before[sink]["9812"], sink
        assert marked(customers, sink, "9812"), sink
