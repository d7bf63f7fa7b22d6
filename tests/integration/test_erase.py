"""`cdc-sync erase` on real services: it waits for the pipeline, removes a key from search,
Redis, the Delta table and its history at a version above every change the pipeline can still
deliver, with `--purge` from every Delta file and log entry, and a replay of its changes does not
bring it back. (The same against a running job and a document index: tests/e2e/test_erasure.py.)"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId, id_digest
from cdc_sync.job.decode.fold import fold_key
from cdc_sync.mapping import DeltaRoute, TableRoute, load_mapping
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.delta.history_writer import erased_versions
from cdc_sync.sinks.delta.target import erased_path
from cdc_sync.verify.compare import source_keys
from cdc_sync.verify.erase import ErasureRefused, erase
from cdc_sync.verify.extra_rows import RepairSinks
from tests.changes import change, products_route
from tests.envelopes import product
from tests.erasure_audit import files_holding
from tests.integration.test_repair import held, open_repair_sinks
from tests.pg import private_database

pytestmark = pytest.mark.integration

SINKS = ("search", "cache", "delta")
AGED_OUT = "delta.deletedFileRetentionDuration"


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
    """The job's writes: each batch's changes (grouped per key) folded and applied."""
    for batch in batches:
        folded = [fold_key(group, keep_earlier=True) for group in batch]
        for name in SINKS:
            sink = sinks.sink(name)
            sink.ensure_target(route, folded[0].schema)
            sink.apply(route, folded)


def ids_held(sinks: RepairSinks, name: str, route: TableRoute) -> set[str]:
    """The doc ids sink `name` holds a row for (a soft-delete mark without values included)."""
    return set(sinks.stored(name, route, ["id"], ["1", "2", "3"]))


def backdate_files(table: Path, hours: float) -> None:
    """Set the modification time of every data file of `table` `hours` back."""
    then = time.time() - hours * 3600
    for file in table.rglob("*.parquet"):
        if "_delta_log" not in file.parts:
            os.utime(file, (then, then))


def caught_up() -> str | None:
    return None  # every change the test wrote is applied


def history_ids(sinks: RepairSinks, route: TableRoute) -> list[tuple[str, int]]:
    assert route.delta is not None
    warehouse = Path(sinks.connections.require("warehouse"))
    rows = delta_readback.history_rows(warehouse, route.delta)
    return sorted((r["_cdc_id"], r["_cdc_version_from"]) for r in rows)


def test_erase_refuses_while_the_pipeline_is_behind_and_then_erases_above_its_versions(
    sinks: RepairSinks, source: psycopg.Connection[Any]
) -> None:
    """The issue's case: the sinks applied versions 100 and 200 of key 1; its updates at 300 and
    400 and its delete at 500 are committed but not applied yet (the job is stopped). Erasing
    then deleted at the stored version 200 and recorded 200, so the history got 300, 400 and the
    closing row back, for good. Now erase refuses until the pipeline caught up, and erases at a
    version above everything it can still deliver for the key."""
    route = history_route()
    assert route.delta is not None
    early = [
        change(route, "c", 100, 1, product(1, price="10.00")),
        change(route, "u", 200, 1, product(1, price="20.00")),
    ]
    late = [
        change(route, "u", 300, 1, product(1, price="30.00")),
        change(route, "u", 400, 1, product(1, price="40.00")),
        change(route, "d", 500, 1),
    ]
    two = [change(route, "c", 100, 2, product(2, price="5.00"))]
    apply_everywhere(sinks, route, [[early, two]])

    def present() -> set[str]:
        return set(source_keys(source, route.table)) & {"1", "2"}

    with pytest.raises(ConfigError, match="still holds"):
        erase(sinks, route, ["id"], ["2"], present, caught_up)
    with pytest.raises(ErasureRefused, match="job stopped"):
        erase(sinks, route, ["id"], ["1"], present, lambda: "the job stopped")
    for name in SINKS:  # refused: nothing erased
        assert set(held(sinks, name, route)) == {"1", "2"}, name
    assert history_ids(sinks, route) == [("1", 100), ("1", 200), ("2", 100)]

    apply_everywhere(sinks, route, [[late]])  # the job ran and caught up
    outcome = erase(sinks, route, ["id"], ["1"], present, caught_up)

    assert not outcome.failed, outcome.lines
    warehouse = Path(sinks.connections.require("warehouse"))
    assert erased_versions(warehouse, route.delta, ["1"]) == {"1": 501}
    record = DeltaTable(str(erased_path(warehouse, route.delta))).to_pyarrow_table()
    assert record["_cdc_id"].to_pylist() == [id_digest("1")]  # the key itself is not kept
    assert history_ids(sinks, route) == [("2", 100)]
    # A replay of the topic: every change of the key again, in one batch and one by one.
    apply_everywhere(sinks, route, [[early + late]])
    apply_everywhere(sinks, route, [[[c]] for c in early + late])
    for name in SINKS:
        assert set(held(sinks, name, route)) == {"2"}, name
    assert history_ids(sinks, route) == [("2", 100)]
    # A new row under the same key later (a higher version) is new data: it is written.
    apply_everywhere(sinks, route, [[[change(route, "c", 600, 1, product(1, price="1.00"))]]])
    assert history_ids(sinks, route) == [("1", 600), ("2", 100)]
    for name in SINKS:
        assert set(held(sinks, name, route)) == {"1", "2"}, name


def test_erase_purge_leaves_no_file_or_log_entry_holding_the_erased_values(
    sinks: RepairSinks, source: psycopg.Connection[Any]
) -> None:
    """The delete's remove actions aged out of the Delta checkpoints (Delta keeps them for
    `delta.deletedFileRetentionDuration`, a week; a second here): a default vacuum no longer
    knew the files that held the row and left them. And the commits' data-skipping statistics
    (a one-row file's min and max are its values) stayed in the log and the checkpoints."""
    route = history_route()
    assert route.delta is not None
    secret = f"Zq-erase-{uuid.uuid4().hex[:10]}"
    note = f"lives at {uuid.uuid4().hex[:10]} Erase Street"
    one = [
        change(route, "c", 100, 1, product(1, name=secret, description=note, price="10.00")),
        change(route, "u", 200, 1, product(1, name=secret, description=note, price="20.00")),
        change(route, "d", 300, 1),
    ]
    two = [change(route, "c", 100, 2, product(2, price="5.00"))]
    apply_everywhere(sinks, route, [[one[:1], two], [one[1:2]], [one[2:]]])
    warehouse = Path(sinks.connections.require("warehouse"))
    tables = [warehouse / route.delta.relative_path()]
    tables.append(warehouse / route.delta.history_relative_path())
    for path in tables:
        DeltaTable(str(path)).alter.set_table_properties({AGED_OUT: "interval 1 seconds"})
    time.sleep(1.5)
    for path in tables:
        DeltaTable(str(path)).create_checkpoint()  # as the job does every 100 commits
        backdate_files(path, hours=200)  # written as long ago as their removes aged out
    assert files_holding(warehouse, [secret, note])  # before: the history and older files

    def present() -> set[str]:
        return set(source_keys(source, route.table)) & {"1"}

    outcome = erase(sinks, route, ["id"], ["1"], present, caught_up, purge=True)

    assert not outcome.failed, outcome.lines
    assert "purge" in "\n".join(outcome.lines)
    assert files_holding(warehouse, [secret, note]) == {}
    # What stays is whole: the current rows, the other key's history, new writes.
    assert set(held(sinks, "delta", route)) == {"2"}
    assert history_ids(sinks, route) == [("2", 100)]
    apply_everywhere(sinks, route, [[[change(route, "c", 400, 3, product(3, price="2.00"))]]])
    assert set(held(sinks, "delta", route)) == {"2", "3"}
    assert history_ids(sinks, route) == [("2", 100), ("3", 400)]


def test_erase_removes_soft_deleted_rows_and_a_replay_does_not_mark_them_again(
    sinks: RepairSinks, source: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """`on_delete: soft` keeps a deleted row, marked, values and all: erase removes it at the
    erased version, above the mark's (the delete's own version), so a replay of the delete
    writes no mark again and a replay of older changes no row."""
    tag = uuid.uuid4().hex[:8]
    path = tmp_path / "soft.yaml"
    path.write_text(
        "version: 1\nsource: {topic_prefix: t}\ntables:\n  shop.products:\n"
        "    on_delete: soft\n"
        f"    search: {{index: soft_{tag}}}\n    cache: {{prefix: s{tag}}}\n"
        f"    delta: {{table: shop.soft_{tag}}}\n"
    )
    route = load_mapping(path).tables[TableId("shop", "products")]

    secret = f"Zq-soft-{tag}"
    created = change(route, "c", 100, 1, product(1, name=secret))
    deleted = change(route, "d", 300, 1)
    schema = created.schema  # the table's accepted schema (a delete carries none)
    assert schema is not None

    def apply_shaped(batch: list[Any]) -> None:
        folded = [fold_key(group) for group in batch]
        for name, changes in route.sink_changes(schema, folded).items():
            sink = sinks.sink(name)
            sink.ensure_target(route, route.sink_schema(name, schema))
            sink.apply(route, changes)

    apply_shaped([[created], [change(route, "c", 100, 2, product(2))]])
    apply_shaped([[deleted]])
    for name in SINKS:  # marked, and still holding the values
        assert held(sinks, name, route).get("1") == secret, name

    def present() -> set[str]:
        return set(source_keys(source, route.table)) & {"1"}

    outcome = erase(sinks, route, ["id"], ["1"], present, caught_up)

    assert not outcome.failed, outcome.lines
    for name in SINKS:
        assert ids_held(sinks, name, route) == {"2"}, name
    apply_shaped([[created, deleted]])  # a replay, in one batch
    apply_shaped([[created]])  # and one change at a time
    apply_shaped([[deleted]])
    for name in SINKS:
        assert ids_held(sinks, name, route) == {"2"}, name
