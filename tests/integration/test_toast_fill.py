"""The unchanged-TOAST fill (job.write.unavailable) on real Postgres, when the table changed shape
after the change was written: a column dropped or renamed before the job read the change, and
changes of two schemas in one batch. The fill reads only columns the table has now; a column
it no longer has stays unfilled (the sinks keep what they hold, the schema-change policy
decides the column's fate), and nothing raises: a raise would fail the batch on every retry."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cdc_sync.core.model import Change, Op, TableId
from cdc_sync.debezium.decoder import parse_record
from cdc_sync.job.write.unavailable import SourceFiller
from cdc_sync.schema.catalog import ConverterModes
from tests.envelopes import PRODUCT_FIELDS, UNAVAILABLE, coords, envelope_bytes, field, key_bytes
from tests.envelopes import product as product_row
from tests.pg import private_database

pytestmark = pytest.mark.integration
TABLE = TableId("shop", "products")
NOTES_FIELDS = [*PRODUCT_FIELDS, field("notes", "string")]


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    with private_database(pg_url, "toast_fill") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA shop")
            conn.execute(
                "CREATE TABLE shop.products (id int PRIMARY KEY, sku text NOT NULL, "
                "name text NOT NULL, description text, price numeric(10,2), "
                "in_stock boolean NOT NULL, notes text)"
            )
            for id_ in (1, 2, 3):
                conn.execute(
                    "INSERT INTO shop.products VALUES (%s, %s, 'stored', %s, 1.50, true, %s)",
                    (id_, f"SKU-{id_}", f"long text {id_}", f"notes {id_}"),
                )
        yield url


def toast_only_update(
    id_: int, unavailable: tuple[str, ...], fields: list[dict[str, Any]] = PRODUCT_FIELDS
) -> Change:
    """A change whose `unavailable` columns arrived as Debezium's placeholder."""
    after = product_row(id_, name="changed") | {name: UNAVAILABLE for name in unavailable}
    if any(f["field"] == "notes" for f in fields) and "notes" not in unavailable:
        after["notes"] = "new notes"
    change = parse_record(
        key_bytes("products", {"id": id_}),
        envelope_bytes("products", "u", 100 + id_, after, fields=fields),
        coords(id_),
    )
    assert isinstance(change, Change) and change.unavailable_columns == frozenset(unavailable)
    return change


def fill(url: str, changes: list[Change]) -> tuple[list[Change], int]:
    filler = SourceFiller(url, ConverterModes())
    try:
        return filler.fill(TABLE, changes)
    finally:
        filler.close()


def alter(url: str, statement: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement.encode())


def test_a_column_dropped_after_a_toast_only_update_is_left_unfilled(database: str) -> None:
    change = toast_only_update(1, ("description", "notes"), NOTES_FIELDS)
    alter(database, "ALTER TABLE shop.products DROP COLUMN description")
    (filled,), gone = fill(database, [change])
    assert gone == 0
    assert filled.unavailable_columns == {"description"}  # no longer in Postgres: kept as is
    assert filled.row is not None
    assert filled.row["notes"] == "notes 1" and filled.row["name"] == "changed"


def test_a_column_renamed_after_a_toast_only_update_is_left_unfilled(database: str) -> None:
    change = toast_only_update(2, ("description",))
    alter(database, "ALTER TABLE shop.products RENAME COLUMN description TO details")
    (filled,), gone = fill(database, [change])
    assert gone == 0 and filled.unavailable_columns == {"description"}
    assert filled.row is not None and "details" not in filled.row


def test_every_unavailable_column_dropped_still_tells_a_deleted_key(database: str) -> None:
    present, deleted = (
        toast_only_update(1, ("description",)),
        toast_only_update(3, ("description",)),
    )
    alter(database, "ALTER TABLE shop.products DROP COLUMN description")
    alter(database, "DELETE FROM shop.products WHERE id = 3")
    filled, gone = fill(database, [present, deleted])
    assert [c.doc_id for c in filled] == ["1"] and gone == 1
    assert filled[0].unavailable_columns == {"description"}


def test_changes_of_two_schemas_in_one_batch_are_filled_each_by_its_own(database: str) -> None:
    """A column added between two changes of the batch: the older change's schema lacks it."""
    older = toast_only_update(1, ("description",))
    newer = toast_only_update(2, ("description", "notes"), NOTES_FIELDS)
    filled, gone = fill(database, [older, newer])
    assert gone == 0
    rows = {c.doc_id: c.row for c in filled}
    assert all(not c.unavailable_columns for c in filled)
    assert rows["1"] is not None and rows["1"]["description"] == "long text 1"
    assert "notes" not in rows["1"]  # not a column of its schema: not read for it
    assert rows["2"] is not None
    assert (rows["2"]["description"], rows["2"]["notes"]) == ("long text 2", "notes 2")


def test_a_swap_settled_from_postgres_skips_a_dropped_column(database: str) -> None:
    """A delete after a create of the key in one transaction is settled by reading the whole
    row: the columns the table no longer has are not read, and stay unfilled."""
    create = toast_only_update(1, ())
    delete = dataclasses.replace(create, op=Op.DELETE, row=None, resolve_from_source=True)
    alter(database, "ALTER TABLE shop.products DROP COLUMN price")
    (settled,), gone = fill(database, [delete])
    assert gone == 0 and settled.op is Op.UPDATE and settled.row is not None
    assert settled.row["description"] == "long text 1" and "price" not in settled.row
    assert settled.unavailable_columns == {"price"}
    assert set(settled.row) == {"id", "sku", "name", "description", "in_stock"}


def test_a_delete_settled_across_a_batch_boundary_is_read_with_the_tables_schema(
    database: str,
) -> None:
    """The key's create was in the batch before (job.decode.open_transactions): the delete travels
    without a schema, and is read with the table's accepted one; a key Postgres no longer
    holds stays a delete."""
    schema = toast_only_update(1, ()).schema
    assert schema is not None
    present, absent = (
        Change(TABLE, (("id", id_),), Op.DELETE, 200, None, coords(id_), resolve_from_source=True)
        for id_ in (2, 9)
    )
    filler = SourceFiller(database, ConverterModes())
    try:
        (settled, deleted), gone = filler.fill(TABLE, [present, absent], schema)
    finally:
        filler.close()
    assert gone == 0 and settled.op is Op.UPDATE and settled.row is not None
    assert (settled.row["id"], settled.row["description"]) == (2, "long text 2")
    assert deleted.is_delete and not deleted.resolve_from_source
    (unsettled,), _ = fill(database, [present])  # without a schema: nothing to read it with
    assert unsettled.is_delete
