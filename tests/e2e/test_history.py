"""SCD type 2 history on the local stack: the demo mapping keeps products' price history
(`delta: {history: true, track: [price]}`). Inserts, tracked and untracked updates, several
versions in one transaction and in one micro-batch, delete and re-insert, a job restart and a
replay of every topic on a fresh checkpoint: the history holds the expected versions, chained,
and `verify` (current rows against Postgres, intervals) passes. Then `erase` removes a deleted
product from every sink and its history, and a replay does not bring it back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from cdc_sync.cli import main
from cdc_sync.core.model import TableId
from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.delta.history import interval_problems
from cdc_sync.verify.compare import source_keys
from cdc_sync.verify.erase import erase, wait_until_applied
from cdc_sync.verify.extra_rows import RepairSinks
from tests.e2e.conftest import Services, running_pipeline
from tests.e2e.harness import MAPPING, SyncHarness, e2e_mapping
from tests.pg import private_database

pytestmark = pytest.mark.e2e
REDIS_DB = 12  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9-11
PRODUCTS = TableId("shop", "products")


@pytest.fixture(scope="module")
def history_pipeline(
    services: Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SyncHarness]:
    root = tmp_path_factory.mktemp("e2e-history")
    with private_database(services.pg_url, "history_e2e") as database:
        connections = services.connections(database, REDIS_DB, root)
        create_demo_schema(database)
        mapping = e2e_mapping(f"hi{uuid.uuid4().hex[:6]}")
        with running_pipeline(services.spark, mapping, connections, root, {}) as harness:
            yield harness


def history_of(pipeline: SyncHarness, product_id: int) -> list[dict[str, Any]]:
    delta = pipeline.mapping.tables[PRODUCTS].delta
    assert delta is not None and delta.history
    warehouse = Path(pipeline.connections.require("warehouse"))
    rows = delta_readback.history_rows(warehouse, delta)
    return sorted(
        (r for r in rows if r["_cdc_id"] == str(product_id)), key=lambda r: r["_cdc_version_from"]
    )


def summary(rows: list[dict[str, Any]]) -> list[tuple[str, Decimal, str, bool]]:
    return [(r["_cdc_op"], r["price"], r["name"], r["_is_current"]) for r in rows]


EXPECTED = [
    ("c", Decimal("1.00"), "A", False),
    ("u", Decimal("2.00"), "B", False),  # the name change (untracked) updated this row
    ("u", Decimal("4.00"), "B", False),  # one transaction set 3.00 then 4.00: its last change
    ("u", Decimal("5.00"), "B", False),
    ("u", Decimal("6.00"), "B", False),
    ("d", Decimal("6.00"), "B", False),  # the delete repeats the values it closes
    ("c", Decimal("7.00"), "C", True),
]


def test_history_holds_every_version_through_restart_and_replay(
    history_pipeline: SyncHarness,
) -> None:
    pipeline = history_pipeline
    insert = "INSERT INTO shop.products (id, sku, name, price) VALUES (9700, 'H-9700', '{}', {})"
    pipeline.run_sql([insert.format("A", "1.00")])
    pipeline.wait_converged()
    pipeline.run_sql(["UPDATE shop.products SET price = 2.00 WHERE id = 9700"])
    pipeline.wait_converged()
    pipeline.run_sql(["UPDATE shop.products SET name = 'B' WHERE id = 9700"])
    pipeline.wait_converged()
    pipeline.stop()  # the next changes wait in the topic: one micro-batch after the restart
    with psycopg.connect(pipeline.connections.require("pg_url")) as conn:  # one transaction
        conn.execute("UPDATE shop.products SET price = 3.00 WHERE id = 9700")
        conn.execute("UPDATE shop.products SET price = 4.00 WHERE id = 9700")
    pipeline.run_sql(
        [
            "UPDATE shop.products SET price = 5.00 WHERE id = 9700",
            "UPDATE shop.products SET price = 6.00 WHERE id = 9700",
            "DELETE FROM shop.products WHERE id = 9700",
            insert.format("C", "7.00"),
        ]
    )
    pipeline.start()
    pipeline.wait_converged()
    rows = history_of(pipeline, 9700)
    assert summary(rows) == EXPECTED
    assert interval_problems(rows) == []

    pipeline.stop()
    pipeline.drain_fresh("replay")  # every topic again from offset 0, older versions included
    pipeline.start()
    assert history_of(pipeline, 9700) == rows
    report = pipeline.wait_converged()
    assert any(s.sink == "history" for t in report.tables for s in t.sinks)


def test_erase_removes_a_deleted_product_from_every_sink_and_a_replay_keeps_it_out(
    history_pipeline: SyncHarness,
) -> None:
    pipeline = history_pipeline
    insert = "INSERT INTO shop.products (id, sku, name, price) VALUES (9800, 'H-9800', 'x', 1.00)"
    pipeline.run_sql([insert, "UPDATE shop.products SET price = 2.00 WHERE id = 9800"])
    pipeline.wait_converged()
    pipeline.run_sql(["DELETE FROM shop.products WHERE id = 9800"])  # the source row first
    pipeline.wait_converged()
    assert history_of(pipeline, 9800)
    route = pipeline.mapping.tables[PRODUCTS]
    sinks = RepairSinks(pipeline.mapping, pipeline.connections)
    url = pipeline.connections.require("pg_url")
    try:
        with psycopg.connect(url) as conn:
            outcome = erase(
                sinks,
                route,
                ["id"],
                ["9800"],
                lambda: set(source_keys(conn, PRODUCTS)) & {"9800"},
                lambda: wait_until_applied(
                    conn,
                    pipeline.connections,
                    pipeline.mapping,
                    PRODUCTS,
                    60,
                    pipeline.options("main").checkpoint_dir,
                ),
                purge=True,
            )
    finally:
        sinks.close()
    assert not outcome.failed, outcome.lines
    assert history_of(pipeline, 9800) == []
    pipeline.stop()
    pipeline.drain_fresh("replay-after-erase")
    pipeline.start()
    pipeline.wait_converged()
    assert history_of(pipeline, 9800) == []


def cli_files(pipeline: SyncHarness, root: Path) -> tuple[Path, Path]:
    """The pipeline's mapping (its topic prefix; the source read from CDC_SYNC_PG_URL) and an
    env file with its connections, as an operator's shell would have them."""
    data = yaml.safe_load(MAPPING.read_text())
    data["source"] = {"topic_prefix": pipeline.mapping.topic_prefix}
    mapping = root / "mapping.yaml"
    mapping.write_text(yaml.safe_dump(data))
    c = pipeline.connections
    env = {
        "CDC_SYNC_PG_URL": c.require("pg_url"),
        "CDC_SYNC_SEARCH_URL": c.require("search_url"),
        "CDC_SYNC_SEARCH_CLIENT": c.search_client,
        "CDC_SYNC_REDIS_URL": c.require("redis_url"),
        "CDC_SYNC_WAREHOUSE": c.require("warehouse"),
        # erase reads the document indices' progress against the topics' end offsets
        "CDC_SYNC_KAFKA_BOOTSTRAP": c.require("kafka_bootstrap"),
        "CDC_SYNC_KAFKA_FLAVOR": c.kafka_flavor,
    }
    env_file = root / "stack.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return mapping, env_file


def test_the_erase_command_refuses_live_keys_and_prints_what_it_removed(
    history_pipeline: SyncHarness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = history_pipeline
    pipeline.run_sql(
        [
            "INSERT INTO shop.products (id, sku, name, price) VALUES (9900, 'H-9900', 'x', 1.00)",
            "INSERT INTO shop.products (id, sku, name, price) VALUES (9901, 'H-9901', 'y', 1.00)",
            "DELETE FROM shop.products WHERE id = 9900",
        ]
    )
    pipeline.wait_converged()
    mapping, env_file = cli_files(pipeline, tmp_path)
    erase_args = ["--env-file", str(env_file), "erase", "--mapping", str(mapping)]
    erase_args += ["--table", "shop.products"]
    erase_args += ["--checkpoint", str(pipeline.options("main").checkpoint_dir)]
    assert main([*erase_args, "--key", "9901"]) == 2  # Postgres still holds it
    assert "still holds ['9901']" in capsys.readouterr().err
    assert main([*erase_args, "--key", "9900", "--purge"]) == 0
    printed = capsys.readouterr().out
    for place in ("search shop_products", "cache cache:shop.products", "delta shop.products"):
        assert place in printed
    assert "history shop.products__history: " in printed and "purge shop.products" in printed
    assert history_of(pipeline, 9900) == []
    assert history_of(pipeline, 9901)
    pipeline.wait_converged()
