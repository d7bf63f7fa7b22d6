"""Documents during a full snapshot: a root renders while the snapshot goes on once every other
table of its document has ended that same snapshot, and only if the snapshot read the root's own
row; every other root waits for the snapshot's last row. So an initial build whose root table
Debezium reads last (after the tables its documents read) writes while it reads, each document
once and whole, and a re-snapshot never mixes a row it has not re-read yet with rows it has."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_sync.connectors.checks import document_table_order
from cdc_sync.core.model import Change, Coordinates, Op, TableId, Truncate
from cdc_sync.documents.sync import DocumentSync
from tests.unit.test_documents import (
    MAPPING,
    SCHEMAS_BY_TABLE,
    CountingIndex,
    MemoryIndex,
    change,
    folded,
    load,
)

pytestmark = pytest.mark.unit

# Orders with their customer and lines: three tables, no filter.
SHALLOW = """
version: 1
source: {topic_prefix: t}
tables: {}
documents:
  orders:
    index: order_docs
    root: s.orders
    relations:
      customer: {table: s.customers, kind: one, join: {customer_id: id}}
      lines:
        table: s.lines
        join: {id: order_id}
        columns: [line_no, qty]
        type: nested
"""
TABLES = ("customers", "lines", "orders")


def customer(ident: int, name: str, version: int) -> Change:
    return change("customers", {"id": ident, "name": name}, False, version)


def order(ident: int, status: str, version: int) -> Change:
    return change("orders", {"id": ident, "customer_id": 1, "status": status}, False, version)


def line(order_id: int, line_no: int, version: int, qty: int = 1) -> Change:
    row = {"order_id": order_id, "line_no": line_no, "product_id": 7, "qty": qty}
    return change("lines", row, False, version)


def read(found: Change, marker: str) -> Change:
    """`found` as a full snapshot's row with Debezium's `source.snapshot` marker."""
    return dataclasses.replace(
        found,
        op=Op.READ,
        ends_snapshot=marker in ("last", "last_in_data_collection"),
        snapshot_continues=marker != "last",
    )


def ends(batch: Sequence[Change]) -> list[Truncate]:
    """The snapshot ends of the tables whose last snapshot row is in `batch` (the job's)."""
    return [
        Truncate(c.table, c.version, Coordinates("t", 0, c.version), snapshot_end=True)
        for c in batch
        if c.ends_snapshot
    ]


def apply(sync: DocumentSync, batch: Sequence[Change]) -> None:
    sync.apply(ends(batch), folded(batch), records=len(batch))


def started(tmp_path: Path, index: MemoryIndex, text: str = SHALLOW) -> DocumentSync:
    sync = DocumentSync(load(tmp_path, text), tmp_path / "state.sqlite", index, full_batch=1000)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    return sync


def first_snapshot(sync: DocumentSync) -> None:
    """A first full snapshot at 5: customers, lines, then order 1 with the snapshot's last row."""
    apply(
        sync,
        [
            read(customer(1, "c", 5), "first"),
            read(customer(2, "d", 5), "last_in_data_collection"),
            read(line(1, 1, 5), "first_in_data_collection"),
            read(line(1, 2, 5), "last_in_data_collection"),
            read(order(1, "new", 5), "last"),
        ],
    )


def test_a_root_table_read_last_renders_while_it_is_read(tmp_path: Path) -> None:
    index = CountingIndex()
    sync = started(tmp_path, index)
    apply(
        sync,
        [
            read(customer(1, "c", 5), "first"),
            read(customer(2, "d", 5), "last_in_data_collection"),
            read(line(1, 1, 5), "first_in_data_collection"),
            read(line(2, 1, 5), "last_in_data_collection"),
        ],
    )
    assert index.bulks == []
    apply(
        sync,
        [read(order(1, "new", 5), "first_in_data_collection"), read(order(2, "new", 5), "true")],
    )
    assert index.bulks == [["1", "2"]]  # written while the snapshot goes on, whole
    assert index.docs["1"]["lines"] == [{"line_no": 1, "qty": 1}]
    assert index.docs["2"]["customer"] == {"id": 1, "name": "c"}
    apply(sync, [read(order(3, "new", 5), "last")])
    assert index.bulks == [["1", "2"], ["3"]]  # each document once


def test_a_table_that_ended_an_earlier_snapshot_does_not_count(tmp_path: Path) -> None:
    """A second full snapshot (at 9) reads the customers and orders before the lines: the lines'
    end at 5 was the first snapshot's, so the re-read orders wait for the lines."""
    index = CountingIndex()
    sync = started(tmp_path, index)
    first_snapshot(sync)
    assert index.bulks == [["1"]]
    apply(
        sync,
        [
            read(customer(1, "c", 9), "first"),
            read(customer(2, "d", 9), "last_in_data_collection"),
            read(order(1, "paid", 9), "last_in_data_collection"),
        ],
    )
    assert index.bulks == [["1"]]
    apply(
        sync, [read(line(1, 1, 9, qty=4), "first_in_data_collection"), read(line(1, 2, 9), "last")]
    )
    assert index.bulks == [["1"], ["1"]]
    assert index.docs["1"]["status"] == "paid" and index.docs["1"]["lines"][0]["qty"] == 4


def test_a_root_the_snapshot_has_not_read_yet_waits(tmp_path: Path) -> None:
    """A re-snapshot that renamed the customer and re-read the lines first: order 1's own row is
    still the first snapshot's, so rendering it now could mix rows Postgres never held together;
    it renders once the snapshot has read it."""
    index = CountingIndex()
    sync = started(tmp_path, index)
    first_snapshot(sync)
    apply(
        sync,
        [
            read(customer(1, "renamed", 9), "first"),
            read(customer(2, "d", 9), "last_in_data_collection"),
            read(line(1, 1, 9), "first_in_data_collection"),
            read(line(1, 2, 9), "last_in_data_collection"),
        ],
    )
    assert index.bulks == [["1"]]
    apply(
        sync,
        [read(order(1, "paid", 9), "first_in_data_collection"), read(order(2, "new", 9), "true")],
    )
    assert index.bulks == [["1"], ["1", "2"]]
    assert index.docs["1"]["customer"]["name"] == "renamed" and index.docs["1"]["status"] == "paid"


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[list[Change], list[int]]:
    """One initial snapshot of the three tables, in any table order, its rows marked as Debezium
    marks them (a one-row table read first says only "first"), cut into batches anywhere."""
    orders = draw(st.integers(1, 5))
    rows = {
        "customers": [customer(i, f"c{i}", 5) for i in range(1, draw(st.integers(1, 3)) + 1)],
        "orders": [order(i, "new", 5) for i in range(1, orders + 1)],
        "lines": [
            line(o, n, 5, qty=n)
            for o in range(1, orders + 1)
            for n in range(1, draw(st.integers(0, 2)) + 1)
        ],
    }
    order_of_tables = draw(st.permutations([t for t in TABLES if rows[t]]))
    stream: list[Change] = []
    for table in order_of_tables:
        found = rows[table]
        for position, row in enumerate(found):
            marker = "true"
            if position == len(found) - 1:
                marker = "last_in_data_collection"
            if position == 0 and not stream:
                marker = "first"
            stream.append(read(row, marker))
    stream[-1] = read(stream[-1], "last")
    cuts = draw(st.lists(st.integers(1, len(stream)), max_size=4, unique=True))
    return stream, sorted({0, *cuts, len(stream)})


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(snapshots())
def test_an_initial_snapshot_writes_each_document_once_whole_in_any_table_order(
    tmp_path_factory: pytest.TempPathFactory, snapshot: tuple[list[Change], list[int]]
) -> None:
    """Whatever the order Debezium reads the tables in and wherever the batches end: each
    document is written once, and the index is the one a single batch of the whole snapshot
    writes."""
    stream, cuts = snapshot
    index, whole = CountingIndex(), CountingIndex()
    sync = started(tmp_path_factory.mktemp("batches"), index)
    for start, end in pairwise(cuts):
        apply(sync, stream[start:end])
    apply(started(tmp_path_factory.mktemp("whole"), whole), stream)
    written = [ident for bulk in index.bulks for ident in bulk]
    assert sorted(written) == sorted(set(written))
    assert index.docs == whole.docs
    sync.close()


def test_the_tables_beside_the_roots(tmp_path: Path) -> None:
    """The product's tags (through a join table) count; the root table does not, unless a level
    nests it again."""
    (spec,) = load(tmp_path, MAPPING).documents.values()
    expected = {"customers", "lines", "products", "tags", "product_tags"}
    assert spec.read_besides_roots() == {TableId("s", t) for t in expected}
    nested = SHALLOW.replace(
        "        type: nested\n",
        "        type: nested\n      parent: {table: s.orders, kind: one, join: {id: id}}\n",
    )
    (again,) = load(tmp_path, nested).documents.values()
    assert TableId("s", "orders") in again.read_besides_roots()


@pytest.mark.parametrize(
    ("listed", "after_the_root"),
    [
        ("s.customers,s.lines,s.orders", []),
        ("s.orders,s.customers,s.lines", ["s.customers, s.lines"]),
        ("s.customers,s.orders,s.lines", ["s.lines"]),
        ("s\\..*", []),  # one pattern for all: the list does not say the order
    ],
)
def test_connectors_validate_warns_of_a_root_table_listed_before_its_documents_tables(
    tmp_path: Path, listed: str, after_the_root: list[str]
) -> None:
    checks = document_table_order({"table.include.list": listed}, load(tmp_path, SHALLOW))
    assert {c.severity for c in checks} <= {"warning"}
    assert [c.message.split(" before ")[1].split(":")[0] for c in checks] == after_the_root
