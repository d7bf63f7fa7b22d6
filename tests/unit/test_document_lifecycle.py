"""A document index over its life beside the job's state: a snapshot's end under the table's
`on_snapshot_end`, a rebuild under a changed or added filter, a new state (a new checkpoint)
building behind the alias while readers keep the old index, and a state that does not belong
to its checkpoint refused before it renders anything."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest

from cdc_sync.core.model import Change, Coordinates, Op, TableId, Truncate
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.documents.builds import Build, planned
from cdc_sync.documents.checkpoint import state_fits_checkpoint
from cdc_sync.documents.state import Applied, applied, remove_state
from cdc_sync.documents.sync import STATE_FILE, DocumentSync
from tests.unit.test_documents import (
    MAPPING,
    SCHEMAS,
    SCHEMAS_BY_TABLE,
    CountingIndex,
    MemoryIndex,
    change,
    folded,
    load,
)

pytestmark = pytest.mark.unit

LINES = TableId("s", "lines")
UNFILTERED = MAPPING.replace("    filter: \"status <> 'void'\"\n", "")


def order(ident: int, status: str = "new", version: int = 10, delete: bool = False) -> Change:
    return change("orders", {"id": ident, "customer_id": 1, "status": status}, delete, version)


def line(order_id: int, line_no: int, version: int = 10, op: Op = Op.UPDATE) -> Change:
    row = {"order_id": order_id, "line_no": line_no, "product_id": 7, "qty": 1}
    return dataclasses.replace(change("lines", row, False, version), op=op)


def line_numbers(index: MemoryIndex, ident: str) -> list[int]:
    return [found["line_no"] for found in index.docs[ident]["lines"]]


# --- 1: a snapshot's end follows the table's `on_snapshot_end` ----------------------------------


@pytest.mark.parametrize(("policy", "kept"), [("sweep", [1]), ("keep", [1, 2])])
def test_a_partial_snapshot_end_removes_unread_rows_only_when_the_table_sweeps(
    tmp_path: Path, policy: str, kept: list[int]
) -> None:
    """A snapshot that re-read only line 1 (`snapshot.select.statement.overrides`) ends: under
    `keep` line 2 stays in the documents, as in the flat sinks (job.settle.truncates)."""
    text = MAPPING.replace("tables:\n", f"tables:\n  s.lines: {{on_snapshot_end: {policy}}}\n")
    index = MemoryIndex()
    sync = DocumentSync(load(tmp_path, text), tmp_path / "state.sqlite", index)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    sync.apply([], folded([order(1), line(1, 1), line(1, 2)]))
    assert line_numbers(index, "1") == [1, 2]
    reread = dataclasses.replace(line(1, 1, version=20, op=Op.READ), ends_snapshot=True)
    ended = Truncate(LINES, 20, Coordinates("t.s.lines", 0, 9), snapshot_end=True)
    sync.apply([ended], folded([reread]))
    assert line_numbers(index, "1") == kept


# --- 2: a rebuild evaluates the filter it builds with -------------------------------------------


TYPED_ORDERS = RowSchema(
    (
        *SCHEMAS["orders"].columns,
        Column("total", ColumnType(TypeKind.DECIMAL, precision=10, scale=2)),
        Column("placed", ColumnType(TypeKind.DATE)),
    )
)
TYPED_SCHEMAS = {**SCHEMAS_BY_TABLE, TableId("s", "orders"): TYPED_ORDERS}


def typed_order(ident: int, status: str, total: str, placed: str) -> Change:
    row = {
        "id": ident,
        "customer_id": 1,
        "status": status,
        "total": Decimal(total),
        "placed": date.fromisoformat(placed),
    }
    return dataclasses.replace(change("orders", row, False, 10), schema=TYPED_ORDERS)


TYPED_LOG = [
    typed_order(1, "new", "9.99", "2024-03-01"),
    typed_order(2, "paid", "10.00", "2024-03-01"),
    typed_order(3, "void", "25.50", "2023-12-31"),
    typed_order(4, "paid", "120.00", "2024-01-01"),
]


def with_filter(text: str, sql: str | None) -> str:
    clause = "" if sql is None else f"    filter: {json.dumps(sql)}\n"
    return text.replace("    root: s.orders\n", f"    root: s.orders\n{clause}")


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        # A changed filter: the roots of the new one, not those the old one matched.
        ("status <> 'void'", "total >= 10 AND placed >= DATE '2024-01-01'", {"2", "4"}),
        # A filter added to an unfiltered document: its matching roots, not none.
        (None, "status = 'paid'", {"2", "4"}),
        (None, "total > 20.00", {"3", "4"}),
        # A filter removed: every root.
        ("status = 'paid'", None, {"1", "2", "3", "4"}),
    ],
)
def test_a_rebuild_evaluates_its_own_filter_over_every_root_in_the_state(
    tmp_path: Path, before: str | None, after: str | None, expected: set[str]
) -> None:
    index = MemoryIndex()
    first = DocumentSync(load(tmp_path, with_filter(UNFILTERED, before)), tmp_path / "s", index)
    first.ensure_targets(TYPED_SCHEMAS)
    first.apply([], folded(TYPED_LOG))
    first.close()
    again = DocumentSync(load(tmp_path, with_filter(UNFILTERED, after)), tmp_path / "s", index)
    again.ensure_targets(TYPED_SCHEMAS)
    assert set(index.docs) == expected
    assert index.aliases["order_docs"] == "order_docs_v2"  # rebuilt behind the alias
    # Later batches keep the new membership: a root that starts matching arrives.
    again.apply([], folded([typed_order(1, "paid", "50.00", "2024-05-05")]))
    assert "1" in index.docs


# --- 4 and 5: a new state builds behind the alias -----------------------------------------------


# The log as a replay reads it: order 3 comes and goes, order 1 gets its line later.
LOG = [
    order(1, version=100),
    order(3, version=150),
    line(1, 1, version=200),
    order(3, version=300, delete=True),
    order(2, version=400),
]


def written_by_an_earlier_state(tmp_path: Path, text: str = MAPPING) -> MemoryIndex:
    index = MemoryIndex()
    old = DocumentSync(load(tmp_path, text), tmp_path / "old.sqlite", index)
    old.ensure_targets(SCHEMAS_BY_TABLE)
    old.apply([], folded(LOG))
    old.close()
    assert set(index.docs) == {"1", "2"} and line_numbers(index, "1") == [1]
    return index


def test_a_replay_into_a_new_state_never_shows_an_older_or_deleted_document(
    tmp_path: Path,
) -> None:
    index = written_by_an_earlier_state(tmp_path)
    before = index.docs
    new = DocumentSync(load(tmp_path), tmp_path / "new.sqlite", index, full_batch=2)
    new.ensure_targets(SCHEMAS_BY_TABLE)
    for start in (0, 2):  # full batches: the replay has more behind them
        new.apply([], folded(LOG[start : start + 2]), records=2)
        assert index.docs == before  # not order 1 without its line, not order 3 back
        assert index.aliases == {"order_docs": "order_docs_v1"}
    new.apply([], folded(LOG[4:]), records=1)  # not full: caught up, the alias moves
    assert index.aliases == {"order_docs": "order_docs_v2"}
    assert "order_docs_v1" not in index.indices
    assert index.docs == before
    # Versions follow the new state: each the state's when the document was rendered.
    assert index.versions == {"1": 300, "3": 300, "2": 400}
    new.apply([], folded([order(2, status="paid", version=500)]), records=1)
    assert index.docs["2"]["status"] == "paid"


def test_a_build_interrupted_by_a_crash_resumes_into_the_same_index(tmp_path: Path) -> None:
    index = written_by_an_earlier_state(tmp_path)
    before = index.docs
    new = DocumentSync(load(tmp_path), tmp_path / "new.sqlite", index, full_batch=2)
    new.ensure_targets(SCHEMAS_BY_TABLE)
    new.apply([], folded(LOG[0:2]), records=2)
    new.apply([], folded(LOG[2:4]), records=2)
    new.close()  # the job dies
    building = index.indices["order_docs_v2"]
    assert set(building) == {"1", "3"}  # what the first batches rendered (3 deleted since)
    again = DocumentSync(load(tmp_path), tmp_path / "new.sqlite", index, full_batch=2)
    again.ensure_targets(SCHEMAS_BY_TABLE)
    assert index.indices["order_docs_v2"] is building  # resumed, not started over
    assert index.docs == before
    again.apply([], folded(LOG[4:]), records=1)
    assert index.aliases == {"order_docs": "order_docs_v2"} and index.docs == before


def test_a_snapshot_in_progress_keeps_the_build_going(tmp_path: Path) -> None:
    """A batch of snapshot rows that ends no table's snapshot is not the end of the replay,
    even when it is not full (the connector is still reading the table)."""
    index = written_by_an_earlier_state(tmp_path)
    before = index.docs
    new = DocumentSync(load(tmp_path), tmp_path / "new.sqlite", index, full_batch=10)

    def read(found: Change, last: bool = False) -> Change:
        return dataclasses.replace(found, op=Op.READ, ends_snapshot=last)

    new.ensure_targets(SCHEMAS_BY_TABLE)
    new.apply([], folded([read(order(1, version=900)), read(order(2, version=900))]), records=2)
    assert index.aliases == {"order_docs": "order_docs_v1"} and index.docs == before
    new.apply([], folded([read(line(1, 1, version=900), last=True)]), records=1)
    assert index.aliases == {"order_docs": "order_docs_v2"} and index.docs == before


def snapshot_row(found: Change, marker: str) -> Change:
    """`found` as a full snapshot's row with Debezium's `source.snapshot` marker."""
    return dataclasses.replace(
        found,
        op=Op.READ,
        ends_snapshot=marker in ("last", "last_in_data_collection"),
        snapshot_continues=marker != "last",
    )


def test_an_initial_snapshot_renders_each_document_once_when_it_ends(tmp_path: Path) -> None:
    """The capture slower than the job: a batch that is not full holds the orders and ends the
    customers' snapshot while the lines are still to be read. Rendering then would show
    documents Postgres never held (orders without their lines) and render every one again; no
    document is written until the snapshot's last row, and then each once, whole."""
    index = CountingIndex()
    sync = DocumentSync(load(tmp_path), tmp_path / "state.sqlite", index, full_batch=100)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    customer = change("customers", {"id": 1, "name": "c"}, False, 5)
    first = [
        snapshot_row(customer, "last_in_data_collection"),
        snapshot_row(order(1, version=5), "first_in_data_collection"),
        snapshot_row(order(2, version=5), "true"),
    ]
    customers_end = Truncate(
        TableId("s", "customers"), 5, Coordinates("t", 0, 1), snapshot_end=True
    )
    sync.apply([customers_end], folded(first), records=3)
    assert index.bulks == []
    lines = [
        snapshot_row(line(1, 1, version=5), "true"),
        snapshot_row(line(2, 1, version=5), "last"),
    ]
    sync.apply([], folded(lines), records=2)
    assert index.bulks == [["1", "2"]]
    assert line_numbers(index, "1") == [1] and index.docs["2"]["customer"] == {"id": 1, "name": "c"}


def test_incremental_snapshot_rows_render_when_the_batch_is_not_full(tmp_path: Path) -> None:
    """Incremental-snapshot rows interleave with the stream (no `snapshot_continues`): a batch
    of them that is not full renders as before, a full one waits for more."""
    index = CountingIndex()
    sync = DocumentSync(load(tmp_path), tmp_path / "state.sqlite", index, full_batch=2)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    incremental = [dataclasses.replace(order(i, version=5), op=Op.READ) for i in (1, 2)]
    sync.apply([], folded(incremental), records=2)
    assert index.bulks == []
    sync.apply([], folded([dataclasses.replace(order(3, version=6), op=Op.READ)]), records=1)
    assert sorted(index.bulks[0]) == ["1", "2", "3"]


def test_a_spec_changed_on_a_new_checkpoint_reaches_the_index_mapping(tmp_path: Path) -> None:
    """The way to add a table to a document (docs/known-limits.md): a new checkpoint. Its new
    index is made with the new mapping (`object` -> `nested` cannot change in place)."""
    as_object = MAPPING.replace("        type: nested\n", "")
    index = written_by_an_earlier_state(tmp_path, as_object)
    assert index.mappings["order_docs_v1"]["properties"]["lines"]["type"] == "object"
    new = DocumentSync(load(tmp_path), tmp_path / "new.sqlite", index)
    new.ensure_targets(SCHEMAS_BY_TABLE)
    new.apply([], folded(LOG), records=len(LOG))
    (held,) = index.aliases.values()
    assert index.mappings[held]["properties"]["lines"]["type"] == "nested"
    assert set(index.docs) == {"1", "2"}


# --- 7: a state that does not belong to its checkpoint ------------------------------------------


def start_query(path: Path, query_id: str = "1f0c-a") -> Path:
    """A streaming query's checkpoint as Spark writes it when the query starts (the layout
    tests/e2e/test_documents.py reads from a real one): `metadata` with the query's id."""
    (path / "offsets").mkdir(parents=True)
    (path / "commits").mkdir()
    (path / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    return path


def commit(path: Path, batch: int) -> None:
    """Batch `batch` planned (`offsets/<n>`) and, its foreachBatch returned, committed."""
    (path / "offsets" / str(batch)).write_text('v1\n{"batchWatermarkMs":0}\n{"t.s.orders":{"0":5}}')
    (path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def spark_checkpoint(path: Path, committed: int, query_id: str = "1f0c-a") -> Path:
    """A checkpoint whose query committed batches 0..`committed`."""
    start_query(path, query_id)
    for batch in range(committed + 1):
        commit(path, batch)
    return path


def test_a_lost_state_beside_a_kept_checkpoint_is_refused_before_it_renders(
    tmp_path: Path,
) -> None:
    """The checkpoint says batches 0-3 were applied; the state holds none of them: rendering
    from it would write partial documents (`lines: []`) at raised versions."""
    checkpoint = spark_checkpoint(tmp_path / "checkpoint", committed=3)
    index = written_by_an_earlier_state(tmp_path)
    before = index.docs
    sync = DocumentSync.beside_checkpoint(load(tmp_path), checkpoint, index)
    with pytest.raises(RuntimeError, match="committed batches up to 3"):
        sync.ensure_targets(SCHEMAS_BY_TABLE)
    assert index.docs == before


def run_batches(
    tmp_path: Path, checkpoint: Path, batches: range, index: MemoryIndex | None = None
) -> Path:
    """`batches` applied and committed as the job runs them (the query started first); the
    state's path."""
    if not checkpoint.exists():
        start_query(checkpoint)
    sync = DocumentSync.beside_checkpoint(load(tmp_path), checkpoint, index or MemoryIndex())
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    for batch in batches:
        sync.apply([], folded([order(batch + 1, version=10 * (batch + 1))]), 1, batch)
        commit(checkpoint, batch)
    sync.close()
    return checkpoint / STATE_FILE


def test_a_state_fits_the_checkpoint_it_applied_the_batches_of(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    state = run_batches(tmp_path, checkpoint, range(4))
    assert state_fits_checkpoint(checkpoint, state) is None
    # One batch ahead: it applied batch 4, Spark died before committing it (it re-runs).
    sync = DocumentSync.beside_checkpoint(load(tmp_path), checkpoint, MemoryIndex())
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    sync.apply([], folded([order(9, version=90)]), 1, batch_id=4)
    sync.close()
    assert state_fits_checkpoint(checkpoint, state) is None


def test_a_new_state_fits_a_new_checkpoint(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"  # the query has not started yet
    assert state_fits_checkpoint(checkpoint, checkpoint / STATE_FILE) is None
    start_query(checkpoint)  # started, no batch committed
    assert state_fits_checkpoint(checkpoint, checkpoint / STATE_FILE) is None


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("lost", "holds no batch, but checkpoint .* committed batches up to 3"),
        ("restored", "applied batches up to 1, but checkpoint .* committed batches up to 3"),
        ("checkpoint replaced", "written under the checkpoint of query 1f0c-a, but .* query 7e1d"),
        ("checkpoint deleted", "written under the checkpoint of query 1f0c-a, but .* no query"),
        ("older release", "holds rows but records no batch"),
    ],
)
def test_a_state_that_does_not_belong_to_its_checkpoint_says_why(
    tmp_path: Path, case: str, reason: str
) -> None:
    checkpoint = tmp_path / "checkpoint"
    state = checkpoint / STATE_FILE
    if case == "lost":
        spark_checkpoint(checkpoint, committed=3)
    elif case == "restored":
        run_batches(tmp_path, checkpoint, range(2))
        shutil.copy(state, tmp_path / "copy")
        run_batches(tmp_path, checkpoint, range(2, 4))
        shutil.copy(tmp_path / "copy", state)
    elif case.startswith("checkpoint"):
        run_batches(tmp_path, checkpoint, range(4))
        shutil.copy(state, tmp_path / "copy")
        shutil.rmtree(checkpoint)
        state.parent.mkdir(parents=True)
        shutil.copy(tmp_path / "copy", state)
        if case == "checkpoint replaced":
            start_query(checkpoint, "7e1d")
            commit(checkpoint, 0)
    else:
        spark_checkpoint(checkpoint, committed=3)
        old = DocumentSync(load(tmp_path), state, MemoryIndex())
        old.ensure_targets(SCHEMAS_BY_TABLE)
        old.apply([], folded([order(1)]))  # no batch ids: as releases before them wrote
        old.close()
    found = state_fits_checkpoint(checkpoint, state)
    assert found is not None and re.search(reason, found), found


def test_a_state_removed_leaves_a_new_one_that_builds_behind_the_alias(tmp_path: Path) -> None:
    """What the job does with a misfit: the state removed, the documents' query started over
    on a new checkpoint; the index is rebuilt behind its alias."""
    index = written_by_an_earlier_state(tmp_path)
    before = index.docs
    checkpoint = spark_checkpoint(tmp_path / "checkpoint", committed=3)
    state = checkpoint / STATE_FILE
    assert state_fits_checkpoint(checkpoint, state) is not None  # lost
    shutil.rmtree(checkpoint)  # the job's answer: a new checkpoint ...
    remove_state(state)  # ... and a new state
    assert not state.exists()
    assert state_fits_checkpoint(checkpoint, state) is None
    fresh = DocumentSync.beside_checkpoint(load(tmp_path), checkpoint, index, full_batch=2)
    fresh.ensure_targets(SCHEMAS_BY_TABLE)
    start_query(checkpoint, "9b9b")
    fresh.apply([], folded(LOG[:2]), records=2, batch_id=0)
    assert index.docs == before and index.aliases == {"order_docs": "order_docs_v1"}
    fresh.apply([], folded(LOG[2:]), records=1, batch_id=1)
    assert index.docs == before and index.aliases == {"order_docs": "order_docs_v2"}
    assert applied(state) == Applied(1, "9b9b", rows=True)


def test_one_instance_keeps_only_the_documents_it_is_given(tmp_path: Path) -> None:
    mapping = load(tmp_path)
    index = MemoryIndex()
    sync = DocumentSync(mapping, tmp_path / "orders.sqlite", index, names=["orders"])
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    assert list(sync.specs) == ["orders"]
    with pytest.raises(ValueError, match=r"no document invoices \(documents: orders\)"):
        DocumentSync(mapping, tmp_path / "other.sqlite", index, names=["invoices"])


@pytest.mark.parametrize(
    ("known", "building", "building_exists", "alias_exists", "has_roots", "build"),
    [
        ("fp", None, False, True, True, Build.IN_PLACE),  # the state's own index
        (None, None, False, False, False, Build.IN_PLACE),  # a first start
        (None, None, False, True, False, Build.BUILD_BEHIND),  # a new checkpoint
        ("old", None, False, True, True, Build.BUILD_NOW),  # the spec changed
        ("fp", None, False, False, True, Build.BUILD_NOW),  # the index deleted
        (None, None, False, False, True, Build.BUILD_NOW),  # a document new to a kept state
        ("fp", "docs_v2", True, True, False, Build.RESUME),  # a build a stop interrupted
        ("fp", "docs_v2", False, True, False, Build.BUILD_BEHIND),  # ... its index gone
        ("old", "docs_v2", True, True, False, Build.BUILD_BEHIND),  # ... its spec changed
    ],
)
def test_what_a_start_does_with_a_document_index(
    known: str | None,
    building: str | None,
    building_exists: bool,
    alias_exists: bool,
    has_roots: bool,
    build: Build,
) -> None:
    assert planned("fp", known, building, building_exists, alias_exists, has_roots) is build
