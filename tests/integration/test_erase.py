"""`cdc-sync erase` on real services: a key leaves search, Redis, the Delta table and its history,
with `--purge` every Delta file that held it, and a replay of its changes does not bring it back."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from cdc_sync.core.errors import ConfigError
from cdc_sync.job.decode.fold import fold_key
from cdc_sync.mapping import DeltaRoute, TableRoute
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.verify.compare import source_keys
from cdc_sync.verify.erase import erase
from cdc_sync.verify.extra_rows import RepairSinks
from tests.changes import change, products_route
from tests.envelopes import product
from tests.integration.test_repair import held, open_repair_sinks
from tests.pg import private_database

pytestmark = pytest.mark.integration


@pytest.fixture
def sinks(search_url: str, redis_url: str, tmp_path: Path) -> Iterator[RepairSinks]:
    sinks = open_repair_sinks(search_url, redis_url, tmp_path / "warehouse")
    yield sinks
    sinks.close()


@pytest.fixture
def source(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """Postgres after the erasure request's delete: it holds key 2, no longer key 1."""
    with private_database(pg_url, "erase") as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA shop; CREATE TABLE shop.products (id int PRIMARY KEY)")
        conn.execute("INSERT INTO shop.products VALUES (2)")
        yield conn


def history_route() -> TableRoute:
    delta = DeltaRoute("shop", f"p_{uuid.uuid4().hex[:8]}", history=True, track=("price",))
    return dataclasses.replace(products_route(), delta=delta)


def apply_everywhere(sinks: RepairSinks, route: TableRoute, batches: list[list[Any]]) -> None:
    for batch in batches:
        folded = [fold_key(group, keep_earlier=True) for group in batch]
        for name in ("search", "cache", "delta"):
            sink = sinks.sink(name)
            sink.ensure_target(route, folded[0].schema)
            sink.apply(route, folded)


def parquet_ids(path: Path) -> set[int]:
    """The ids in every data file left in a Delta table's folder, whatever version reads it."""
    files = path.rglob("*.parquet")
    return {i for f in files for i in pq.read_table(f, columns=["id"])["id"].to_pylist()}


def test_erase_with_purge_removes_a_key_everywhere_and_a_replay_keeps_it_out(
    sinks: RepairSinks, source: psycopg.Connection[Any]
) -> None:
    route = history_route()
    assert route.delta is not None
    one = [
        change(route, "c", 100, 1, product(1, price="10.00")),
        change(route, "u", 200, 1, product(1, price="20.00")),
    ]
    two = [change(route, "c", 100, 2, product(2, price="5.00"))]
    apply_everywhere(sinks, route, [[one[:1], two], [one[1:]]])
    # The erasure request's delete in Postgres; the warehouse applied it, search and the cache
    # lag behind and still hold the row.
    deleted = change(route, "d", 300, 1)
    sinks.sink("delta").apply(route, [fold_key([deleted], keep_earlier=True)])
    warehouse = Path(sinks.connections.require("warehouse"))
    table_dir = warehouse / route.delta.relative_path()
    history_dir = warehouse / route.delta.history_relative_path()
    assert 1 in parquet_ids(table_dir) and 1 in parquet_ids(history_dir)

    def present() -> set[str]:
        return set(source_keys(source, route.table)) & {"1", "2"}

    with pytest.raises(ConfigError, match="still holds"):
        erase(sinks, route, ["id"], ["2"], present)
    outcome = erase(sinks, route, ["id"], ["1"], present, purge=True)

    assert not outcome.failed
    text = "\n".join(outcome.lines)
    assert "search" in text and "cache" in text and "history" in text and "purge" in text
    for name in ("search", "cache", "delta"):
        assert set(held(sinks, name, route)) == {"2"}, name
    history = delta_readback.history_rows(warehouse, route.delta)
    assert {r["_cdc_id"] for r in history} == {"2"}
    # Purged: no file of any table version holds the key any more.
    assert parquet_ids(table_dir) == {2} and parquet_ids(history_dir) == {2}

    # A replay of the topic: the key's changes again, up to its delete.
    apply_everywhere(sinks, route, [[one], [[deleted]]])
    for name in ("search", "cache", "delta"):
        assert set(held(sinks, name, route)) == {"2"}, name  # the delete is the newest change
    history = delta_readback.history_rows(warehouse, route.delta)
    assert {r["_cdc_id"] for r in history} == {"2"}  # the erased-keys record keeps it out
    # A new row under the same key later (a higher version) is new data: it is written.
    apply_everywhere(sinks, route, [[[change(route, "c", 400, 1, product(1, price="1.00"))]]])
    history = delta_readback.history_rows(warehouse, route.delta)
    assert sorted(r["_cdc_version_from"] for r in history if r["_cdc_id"] == "1") == [400]
