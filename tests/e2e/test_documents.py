"""Nested documents on the local stack: the demo's `shop_order_documents` (orders with their
customer, lines and each line's product) kept from the log through real Debezium, Spark and the
search server, for every kind of change to every table of the document. After each step
`verify` has Postgres compute every document (SQL from the spec) and compares it with the index
(`wait_converged`); the document index is also read directly where a step's effect is the
point. A fan-out to 300 orders is served without one query to the orders or customers tables,
and a replay of every topic on a fresh checkpoint leaves the index exactly as it was, while
readers of the alias never see an older or deleted document. A changed or added filter rebuilds
the index with its own roots; a lost state beside a kept checkpoint starts that index over
behind its alias."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import opensearchpy
import psycopg
import pytest

from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.documents.checkpoint import state_fits_checkpoint
from cdc_sync.documents.state import remove_state
from cdc_sync.documents.sync import STATE_FILE
from cdc_sync.job.consumers import DOCUMENTS_PREFIX, consumer_checkpoint
from cdc_sync.mapping import MappingFile
from tests.e2e.conftest import Services, running_pipeline
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.pg import private_database

pytestmark = pytest.mark.e2e
REDIS_DB = 13  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9-12
DOCUMENT = "shop_order_documents"
FANOUT = 300
REPLAYED = 200  # orders whose history the replay test reads back


@pytest.fixture(scope="module")
def pipeline(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncHarness]:
    root = tmp_path_factory.mktemp("e2e-documents")
    with private_database(services.pg_url, "documents_e2e") as database:
        connections = services.connections(database, REDIS_DB, root)
        create_demo_schema(database)
        mapping = e2e_mapping(f"do{uuid.uuid4().hex[:6]}")
        assert DOCUMENT in mapping.documents
        with running_pipeline(services.spark, mapping, connections, root, {}) as harness:
            harness.wait_converged()  # the documents of the snapshot
            yield harness


def documents(pipeline: SyncHarness) -> dict[str, dict[str, Any]]:
    return pipeline.documents(DOCUMENT)


CUSTOMER = "INSERT INTO shop.customers (id, email, full_name) VALUES ({0}, 'c{0}@x.org', 'C {0}')"
PRODUCT = "INSERT INTO shop.products (id, sku, name, price) VALUES ({0}, 'D-{0}', 'P {0}', {1})"
ORDER = "INSERT INTO shop.orders (id, customer_id, status) VALUES ({0}, {1}, 'new')"
LINE = (
    "INSERT INTO shop.order_lines (order_id, line_no, product_id, quantity, unit_price) "
    "VALUES ({0}, {1}, {2}, {3}, 1.50)"
)


def test_every_change_to_every_table_of_a_document_re_renders_it(pipeline: SyncHarness) -> None:
    # One transaction across the document's four tables.
    pipeline.run_sql(
        [
            "BEGIN",
            CUSTOMER.format(9100),
            PRODUCT.format(9100, "2.00"),
            PRODUCT.format(9101, "3.00"),
            ORDER.format(9100, 9100),
            ORDER.format(9101, 9100),
            LINE.format(9100, 1, 9100, 1),
            LINE.format(9100, 2, 9101, 2),
            LINE.format(9101, 1, 9100, 5),
            "COMMIT",
        ]
    )
    pipeline.wait_converged()
    doc = documents(pipeline)["9100"]
    assert doc["customer"]["full_name"] == "C 9100"
    assert [(line["line_no"], line["product"]["sku"]) for line in doc["lines"]] == [
        (1, "D-9100"),
        (2, "D-9101"),
    ]
    steps = [
        # A parent (many-to-one) update reaches both orders; a nested product's too.
        ["UPDATE shop.customers SET full_name = 'Renamed' WHERE id = 9100"],
        ["UPDATE shop.products SET price = 9.99, name = 'Q' WHERE id = 9100"],
        # The description is TOASTed and not in the document: unchanged documents stay right.
        ["UPDATE shop.products SET description = repeat('d', 9000) WHERE id = 9101"],
        ["UPDATE shop.products SET price = 4.00 WHERE id = 9101"],
        # A child moves to another parent (a primary-key move): both orders re-render.
        [
            "UPDATE shop.order_lines SET order_id = 9101, line_no = 2 "
            "WHERE order_id = 9100 AND line_no = 2"
        ],
        ["UPDATE shop.order_lines SET quantity = 7 WHERE order_id = 9101 AND line_no = 1"],
        # A line's product changes (the foreign key of a nested row).
        ["UPDATE shop.order_lines SET product_id = 9101 WHERE order_id = 9100 AND line_no = 1"],
        # A child deleted, and re-inserted.
        ["DELETE FROM shop.order_lines WHERE order_id = 9100 AND line_no = 1"],
        [LINE.format(9100, 1, 9100, 3)],
        # The root filter: a cancelled order leaves the index, and comes back whole.
        ["UPDATE shop.orders SET status = 'cancelled' WHERE id = 9100"],
    ]
    for statements in steps:
        pipeline.run_sql(statements)
        pipeline.wait_converged()
    assert "9100" not in documents(pipeline)
    pipeline.run_sql(["UPDATE shop.orders SET status = 'paid' WHERE id = 9100"])
    pipeline.wait_converged()
    back = documents(pipeline)["9100"]
    assert back["status"] == "paid" and back["customer"]["full_name"] == "Renamed"
    assert [line["line_no"] for line in back["lines"]] == [1]
    # The order moves to another customer; then a parent delete cascades.
    pipeline.run_sql(
        [CUSTOMER.format(9101), "UPDATE shop.orders SET customer_id = 9101 WHERE id = 9101"]
    )
    pipeline.wait_converged()
    assert documents(pipeline)["9101"]["customer"]["id"] == 9101
    pipeline.run_sql(["DELETE FROM shop.orders WHERE id = 9100"])
    pipeline.wait_converged()
    pipeline.run_sql(["DELETE FROM shop.customers WHERE id = 9101"])  # cascades order 9101
    pipeline.wait_converged()
    held = documents(pipeline)
    assert "9100" not in held and "9101" not in held


def table_scans(pipeline: SyncHarness, tables: tuple[str, ...]) -> int:
    """Sequential and index scans Postgres served on `tables` so far (its statistics)."""
    with psycopg.connect(pipeline.connections.require("pg_url")) as conn:
        found = conn.execute(
            "SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0) "
            "FROM pg_stat_user_tables WHERE schemaname = 'shop' AND relname = ANY(%s)",
            [list(tables)],
        ).fetchone()
        assert found is not None
        return int(found[0])


def test_a_customer_update_fans_out_to_its_orders_without_querying_postgres(
    pipeline: SyncHarness,
) -> None:
    orders = [ORDER.format(9200 + n, 9200) for n in range(FANOUT)]
    lines = [LINE.format(9200 + n, 1, 9100, 1) for n in range(FANOUT)]
    pipeline.run_sql(["BEGIN", CUSTOMER.format(9200), *orders, *lines, "COMMIT"])
    pipeline.wait_converged()
    watched = ("orders", "customers", "order_lines")
    time.sleep(1.5)  # other sessions' statistics reach the shared view within a second
    before = table_scans(pipeline, watched)
    pipeline.run_sql(["UPDATE shop.customers SET full_name = 'Fanned' WHERE id = 9200"])
    deadline = time.monotonic() + 120
    while True:
        held = documents(pipeline)
        names = {held[str(9200 + n)]["customer"]["full_name"] for n in range(FANOUT)}
        if names == {"Fanned"}:
            break
        assert time.monotonic() < deadline, f"fan-out incomplete: {names}"
        time.sleep(0.5)
    time.sleep(1.5)
    # The update itself scanned customers once (its WHERE); the job served none.
    assert table_scans(pipeline, watched) - before <= 1
    pipeline.wait_converged()


def with_filter(mapping: MappingFile, sql: str | None) -> MappingFile:
    spec = dataclasses.replace(mapping.documents[DOCUMENT], filter=sql)
    return dataclasses.replace(mapping, documents={**mapping.documents, DOCUMENT: spec})


def test_a_changed_or_added_filter_rebuilds_the_index_with_its_own_roots(
    pipeline: SyncHarness,
) -> None:
    """A restart with another filter rebuilds the index behind its alias; verify (run by
    `wait_converged`) evaluates the new filter in Postgres and compares every document."""
    statuses = ["new", "paid", "cancelled"] * 3
    orders = [
        f"INSERT INTO shop.orders (id, customer_id, status) VALUES ({9600 + n}, 9600, '{status}')"
        for n, status in enumerate(statuses)
    ]
    pipeline.run_sql([CUSTOMER.format(9600), *orders])
    pipeline.wait_converged()
    original = pipeline.mapping
    kept = original.documents[DOCUMENT].filter

    def restart_with(sql: str | None) -> None:
        pipeline.stop()
        pipeline.mapping = with_filter(original, sql)
        pipeline.start()
        pipeline.wait_converged()

    try:
        restart_with(None)  # removed: every order
        restart_with("status = 'paid'")  # added to an unfiltered document
        held = documents(pipeline)
        assert held and {doc["status"] for doc in held.values()} == {"paid"}
    finally:
        restart_with(kept)  # changed back
    assert {doc["status"] for doc in documents(pipeline).values()} != {"paid"}


def test_a_lost_state_beside_a_kept_checkpoint_starts_the_documents_over(
    pipeline: SyncHarness,
) -> None:
    """The documents' state lost while Spark's checkpoint is kept: the job detects it before it
    starts (a real checkpoint here), renders nothing from the empty state, and starts that
    document index over on a new checkpoint: readers keep the documents until the replay
    behind the alias has caught up, then see the same documents."""
    pipeline.wait_converged()
    before = documents(pipeline)
    pipeline.stop()
    # The document index's own consumer of the log: its checkpoint, its state beside it.
    root = pipeline.options("main").checkpoint_dir
    checkpoint = consumer_checkpoint(root, f"{DOCUMENTS_PREFIX}{DOCUMENT}")
    state = checkpoint / STATE_FILE
    assert state_fits_checkpoint(checkpoint, state) is None  # the state the job wrote
    remove_state(state)
    reason = state_fits_checkpoint(checkpoint, state)
    assert reason is not None and "committed batches up to" in reason
    pipeline.start()
    assert documents(pipeline) == before  # the replay builds behind the alias
    pipeline.wait_converged()
    assert documents(pipeline) == before
    assert state_fits_checkpoint(checkpoint, state) is None


def test_a_replay_on_a_fresh_checkpoint_never_shows_an_older_or_deleted_document(
    pipeline: SyncHarness,
) -> None:
    """A fresh checkpoint replays every topic into a new state, in batches of 100 records: the
    alias, read throughout, always shows the documents as they were (the replay builds a new
    index behind it and moves the alias once it has caught up), and at the end the same ones.
    Versions may differ (a document's is the highest change version applied when it was last
    rendered, which depends on where batches fell); the documents may not."""
    # A history a replay passes through: orders that come before their lines, change after
    # them, and go (with their lines).
    ids = range(9700, 9700 + REPLAYED)
    created = [CUSTOMER.format(9700), PRODUCT.format(9700, "1.00")]
    pipeline.run_sql(["BEGIN", *created, *[ORDER.format(n, 9700) for n in ids], "COMMIT"])
    pipeline.run_sql(["BEGIN", *[LINE.format(n, 1, 9700, 2) for n in ids], "COMMIT"])
    pipeline.run_sql(["UPDATE shop.orders SET status = 'paid' WHERE id >= 9700"])
    pipeline.run_sql(["DELETE FROM shop.orders WHERE id >= 9700 AND id % 4 = 0"])
    pipeline.wait_converged()
    before = documents(pipeline)
    pipeline.stop()
    samples: list[dict[str, dict[str, Any]]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            # A read may meet the old index's deletion after the alias moved: read again.
            with contextlib.suppress(opensearchpy.NotFoundError):
                samples.append(documents(pipeline))
            time.sleep(0.2)

    reader = threading.Thread(target=sample, name="alias-reader")
    reader.start()
    try:
        pipeline.drain_fresh("replay-documents", max_offsets_per_trigger=100)
    finally:
        done.set()
        reader.join()
    assert len(samples) >= 5, "the replay ended before the alias was read during it"
    changed = [
        sorted(ident for ident in {*sample, *before} if sample.get(ident) != before.get(ident))
        for sample in samples
    ]
    wrong = [ids for ids in changed if ids]
    assert not wrong, (
        f"{len(wrong)} of {len(samples)} reads of the alias during the replay showed documents "
        f"other than before it, e.g. {len(wrong[0])} documents: {wrong[0][:10]}"
    )
    pipeline.start()
    pipeline.wait_converged()
    assert documents(pipeline) == before
