"""Erasure, proven on the local stack (real Postgres, embedded Debezium, the broker stand-in,
Spark, Delta files, the search server and Redis): `cdc-sync erase` waits for the job, and after
`erase --purge` no file of the pipeline (the warehouse: current tables, history, every older
version, the Delta log and checkpoints; the job's checkpoints, document state included), no
search document (flat and document indices, every generation) and no Redis key or value holds
the erased values; a replay of every topic on a fresh checkpoint and an incremental re-snapshot
do not bring them back. What Kafka itself keeps is documented (docs/erasure.md)."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from cdc_sync.cli import main
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.model import TableId
from cdc_sync.debezium.connector import load_connector
from cdc_sync.debezium.notifications import SnapshotOutcome
from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.search.backends import open_backend
from cdc_sync.verify.resnapshot import SnapshotChannel, SnapshotSignal, run_signals
from tests.e2e.conftest import CONNECTOR, Services, running_pipeline
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.e2e.test_history import cli_files
from tests.erasure_audit import files_holding
from tests.pg import private_database

pytestmark = pytest.mark.e2e
REDIS_DB = 14  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9-13
PRODUCTS = TableId("shop", "products")
DOCUMENT = "shop_order_documents"


@pytest.fixture(scope="module")
def pipeline(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncHarness]:
    root = tmp_path_factory.mktemp("e2e-erasure")
    with private_database(services.pg_url, "erasure_e2e") as database:
        connections = services.connections(database, REDIS_DB, root)
        create_demo_schema(database)
        mapping = e2e_mapping(f"er{uuid.uuid4().hex[:6]}")
        with running_pipeline(services.spark, mapping, connections, root, {}) as harness:
            harness.wait_converged()
            yield harness


def erase_command(pipeline: SyncHarness, root: Path, table: str) -> list[str]:
    mapping, env_file = cli_files(pipeline, root)
    checkpoint = str(pipeline.options("main").checkpoint_dir)
    return [
        *("--env-file", str(env_file), "erase", "--mapping", str(mapping)),
        *("--table", table, "--checkpoint", checkpoint),
    ]


def history_of(pipeline: SyncHarness, product_id: int) -> list[dict[str, Any]]:
    delta = pipeline.mapping.tables[PRODUCTS].delta
    assert delta is not None
    rows = delta_readback.history_rows(Path(pipeline.connections.require("warehouse")), delta)
    return [r for r in rows if r["_cdc_id"] == str(product_id)]


def test_erase_waits_for_a_stopped_job_and_erases_what_it_applied_since(
    pipeline: SyncHarness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27's case on the real pipeline: the job stopped with the product's updates and its
    delete in Kafka. Erase refuses (nothing erased) until the job ran again; then the history
    keeps none of the versions the job applied meanwhile, the closing row included."""
    insert = "INSERT INTO shop.products (id, sku, name, price) VALUES (9701, 'E-9701', 'e', 1.00)"
    pipeline.run_sql([insert])
    pipeline.wait_converged()
    pipeline.stop()
    pipeline.run_sql(
        [
            "UPDATE shop.products SET price = 2.00 WHERE id = 9701",
            "UPDATE shop.products SET price = 3.00 WHERE id = 9701",
            "DELETE FROM shop.products WHERE id = 9701",
        ]
    )
    erase_args = [*erase_command(pipeline, tmp_path, "shop.products"), "--key", "9701"]
    assert main([*erase_args, "--wait-seconds", "5"]) == 2
    refusal = capsys.readouterr().err
    assert "has not applied everything committed before erase started" in refusal, refusal
    assert "nothing erased" in refusal and refusal.count("\n") == 1
    assert [r["_cdc_op"] for r in history_of(pipeline, 9701)] == ["c"]  # untouched

    pipeline.start()
    assert main(erase_args) == 0, capsys.readouterr()
    assert history_of(pipeline, 9701) == []
    pipeline.wait_converged()
    assert history_of(pipeline, 9701) == []


PERSON = "INSERT INTO shop.customers (id, email, full_name) VALUES ({id}, '{email}', '{name}')"
ORDER = (
    "INSERT INTO shop.orders (id, customer_id, status, total, internal_note) "
    "VALUES ({id}, {customer}, 'new', 10, '{note}')"
)
PRODUCT = (
    "INSERT INTO shop.products (id, sku, name, description, price) "
    "VALUES ({id}, 'E-{id}', '{name}', '{description}', 5.00)"
)
LINE = (
    "INSERT INTO shop.order_lines (order_id, line_no, product_id, quantity, unit_price) "
    "VALUES ({order}, 1, {product}, 1, 5.00)"
)


def test_after_erase_purge_nothing_holds_the_erased_values(
    pipeline: SyncHarness, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:10]
    name, renamed = f"Zq Erase {tag}", f"Zq Erased {tag}"
    email = f"zq-{tag}@erase-{tag}.example"  # the search index also computes its domain
    note = f"leave at the back door {tag}"  # only the document state sees internal_note
    product_name, description = f"Zq engraving {tag}", f"engraved with {tag} " + "x" * 3000
    secrets = [name, renamed, email, f"erase-{tag}.example", note, product_name, tag]
    person, order, product, kept_order = 9801, 9802, 9803, 9804
    pipeline.run_sql(
        [
            PERSON.format(id=person, email=email, name=name),
            ORDER.format(id=order, customer=person, note=note),
            PRODUCT.format(id=product, name=product_name, description=description),
            LINE.format(order=order, product=product),
            "INSERT INTO shop.customers (id, email, full_name) VALUES (9805, 'k@x.org', 'K')",
            ORDER.format(id=kept_order, customer=9805, note="kept"),
            LINE.format(order=kept_order, product=product),
            f"UPDATE shop.customers SET full_name = '{renamed}' WHERE id = {person}",
            f"UPDATE shop.products SET price = 6.00 WHERE id = {product}",
        ]
    )
    pipeline.wait_converged()
    before = " ".join(holding(pipeline, secrets))
    document_index = pipeline.mapping.documents[DOCUMENT].index
    for place in ("file warehouse/shop/customers/", "file warehouse/shop/products__history/"):
        assert place in before, before  # the audit looks where the values are
    for place in ("documents/state.sqlite", "search shop_customers", "redis cache:shop.customers"):
        assert place in before, before
    assert f"search {document_index}" in before, before

    # The privacy request: the person (their order and its line go with them, ON DELETE
    # CASCADE), and the product, once the other order's line no longer references it.
    pipeline.run_sql(
        [
            f"DELETE FROM shop.customers WHERE id = {person}",
            f"DELETE FROM shop.order_lines WHERE order_id = {kept_order}",
            f"DELETE FROM shop.products WHERE id = {product}",
        ]
    )
    erasures = {
        "shop.customers": [str(person)],
        "shop.orders": [str(order)],
        "shop.order_lines": [f"{order}|1", f"{kept_order}|1"],
        "shop.products": [str(product)],
    }
    for table, keys in erasures.items():
        keyed = [arg for key in keys for arg in ("--key", key)]
        assert main([*erase_command(pipeline, tmp_path, table), *keyed, "--purge"]) == 0, table
    assert holding(pipeline, secrets) == {}
    pipeline.wait_converged()  # the other order's document kept, without the line

    pipeline.stop()  # a replay of every topic on a fresh checkpoint (a new document state too)
    pipeline.drain_fresh("replay-after-erasure")
    pipeline.start()
    pipeline.wait_converged()
    assert holding(pipeline, secrets) == {}

    resnapshot(pipeline, ["shop.customers", "shop.orders", "shop.order_lines", "shop.products"])
    pipeline.wait_converged()
    assert holding(pipeline, secrets) == {}


def holding(pipeline: SyncHarness, values: Sequence[str]) -> dict[str, list[str]]:
    """Every place of the pipeline holding one of `values`: files under its root (warehouse,
    checkpoints with the document state, capture offsets), search documents of every index,
    Redis keys and values."""
    found = {f"file {path}": held for path, held in files_holding(pipeline.root, values).items()}
    found |= {f"search {i}": held for i, held in search_holding(pipeline, values).items()}
    found |= {f"redis {k}": held for k, held in redis_holding(pipeline, values).items()}
    return found


def search_holding(pipeline: SyncHarness, values: Sequence[str]) -> dict[str, list[str]]:
    """Index name / doc id -> values found in its `_id` or `_source`, over every index of the
    pipeline's aliases (older generations included)."""
    url = pipeline.connections.require("search_url")
    with urllib.request.urlopen(f"{url}/_cat/indices?format=json", timeout=30) as answer:
        names = [entry["index"] for entry in json.load(answer)]
    aliases = [r.search.index for r in pipeline.mapping.tables.values() if r.search]
    aliases += [spec.index for spec in pipeline.mapping.documents.values()]
    ours = [n for n in names if any(n == a or n.startswith(f"{a}_") for a in aliases)]
    backend = open_backend(pipeline.connections.search_client, url)
    found: dict[str, list[str]] = {}
    try:
        for index in ours:
            backend.refresh(index)
            for hits in backend.scan(index, 1000):
                for hit in hits:
                    text = json.dumps([hit["_id"], hit["_source"]])
                    held = [v for v in values if v in text]
                    if held:
                        found[f"{index}/{hit['_id']}"] = held
    finally:
        backend.close()
    return found


def redis_holding(pipeline: SyncHarness, values: Sequence[str]) -> dict[str, list[str]]:
    client = redis.Redis.from_url(pipeline.connections.require("redis_url"), decode_responses=True)
    found: dict[str, list[str]] = {}
    try:
        for key in client.scan_iter(count=1000):
            kind = client.type(key)
            if kind == "hash":
                content = repr(client.hgetall(key))
            elif kind == "string":
                content = repr(client.get(key))
            else:
                content = str(kind)
            held = [v for v in values if v in f"{key} {content}"]
            if held:
                found[key] = held
    finally:
        client.close()
    return found


def resnapshot(pipeline: SyncHarness, tables: list[str]) -> None:
    """An incremental snapshot of `tables` through Debezium's signal table, to its end (the
    way `cdc-sync repair` asks for one)."""
    connections = pipeline.connections
    kafka = consumer_config(
        connections.require("kafka_bootstrap"),
        connections.kafka_flavor,
        group_id=f"t-{uuid.uuid4()}",
    )
    channel = SnapshotChannel(
        load_connector(CONNECTOR).config, connections.require("pg_url"), kafka, 120
    )
    ((_, outcome),) = run_signals(channel, [SnapshotSignal(tuple(tables))])
    assert outcome is SnapshotOutcome.COMPLETED, outcome
