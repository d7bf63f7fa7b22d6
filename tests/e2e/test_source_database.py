"""The job reads the database its connector captures, never CDC_SYNC_PG_URL's (issue 17, item 2).

The issue's run: the connector captured one database while CDC_SYNC_PG_URL named another of
the same server; the job started, and its first TOAST-only update was filled from the URL's
database (it died there on `schema "shop" does not exist`; had that database held a table of
the same name, it would have written that table's values). Here the URL's database does hold
the same table, with other values: the job must refuse to start, naming both; with the URL
unset it fills the unchanged TOASTed description from the captured database.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from cdc_sync.debezium.connector import pg_env_from_url
from cdc_sync.debezium.database import SourceMismatch
from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.job.runner import SyncJob
from tests.e2e.conftest import EmbeddedCapture, Services
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.e2e.sinks_state import clean_sinks
from tests.pg import private_database

pytestmark = pytest.mark.e2e
REDIS_DB = 10  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9
PRODUCT = 9400
# Hex text compresses poorly: Postgres keeps it out of line, and an update of another column
# sends Debezium's unavailable-value placeholder for it.
TOASTED = "(SELECT string_agg(md5(g::text || %s), '' ORDER BY g) FROM generate_series(1, 400) g)"


def insert_product(url: str, salt: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO shop.products (id, sku, name, description, price) "
            f"VALUES (%s, 'TOAST-DB', 'Toasted', {TOASTED}, 1.00) RETURNING description",
            (PRODUCT, salt),
        ).fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture(scope="module")
def databases(services: Services) -> Iterator[tuple[str, str]]:
    """(the URL's database A, the captured database B): both with the shop schema."""
    with ExitStack() as stack:
        url_db = stack.enter_context(private_database(services.pg_url, "url_db"))
        captured = stack.enter_context(private_database(services.pg_url, "captured"))
        create_demo_schema(url_db)
        create_demo_schema(captured)
        yield url_db, captured


def test_the_job_refuses_a_url_on_another_database_and_fills_toast_from_the_captured_one(
    services: Services, databases: tuple[str, str], tmp_path: Path
) -> None:
    url_db, captured = databases
    mapping = e2e_mapping(f"db{uuid.uuid4().hex[:6]}")
    capture = services.connections(captured, REDIS_DB, tmp_path)  # the connector: B
    # The connector's placeholders resolve to B (explicit CDC_SYNC_PG_* win over the URL's
    # parts, as on a Connect worker), while CDC_SYNC_PG_URL names A.
    parts = pg_env_from_url(captured)
    misdirected = dataclasses.replace(capture, pg_url=url_db, environment=parts)
    options = SyncHarness(services.spark, mapping, misdirected, tmp_path).options("refused")
    with pytest.raises(SourceMismatch) as refused:
        SyncJob(services.spark, mapping, misdirected, options)
    message = str(refused.value)
    for name in ("CDC_SYNC_PG_URL", "connectors/shop.json", _name(url_db), _name(captured)):
        assert name in message, message

    # A holds the same row with another description: a fill from A would be silently wrong.
    wrong = insert_product(url_db, "from the URL's database")
    clean_sinks(mapping, capture)
    prefix = mapping.topic_prefix
    overrides = {"topic.prefix": prefix, "slot.name": f"{prefix}_slot"}
    overrides["publication.name"] = f"{prefix}_pub"
    # Without the URL the job reads through the connector's own settings: B.
    job = SyncHarness(
        services.spark,
        mapping,
        dataclasses.replace(capture, pg_url=None, environment=parts),
        tmp_path,
    )
    with EmbeddedCapture(capture, tmp_path, overrides).running():
        job.start()
        try:
            right = insert_product(captured, "from the captured database")
            assert right != wrong
            job.wait_converged()  # the row is in every sink: the update lands in a later batch
            with psycopg.connect(captured, autocommit=True) as conn:
                conn.execute("UPDATE shop.products SET price = 2.00 WHERE id = %s", (PRODUCT,))
            report = job.wait_converged()  # against B: the description is B's, in every sink
        finally:
            job.stop()
    products = next(t for t in report.tables if str(t.table) == "shop.products")
    # The shop mapping keeps products' history too (delta.history): verify compares it as well.
    compared = {s.sink for s in products.sinks}
    assert products.matches and compared == {"search", "cache", "delta", "history"}


def _name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")
