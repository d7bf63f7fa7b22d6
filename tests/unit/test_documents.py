"""Document indices kept from the log (cdc_sync.documents): after any sequence of changes to any
table of a three-level document with a many-to-many, cut into batches of any size, replayed,
every document equals the one rendered from the tables' final rows."""

from __future__ import annotations

import dataclasses
import textwrap
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import Change, Coordinates, Op, TableId, Truncate, document_id
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.documents import fanout
from cdc_sync.documents import sync as document_sync
from cdc_sync.documents.comparisons import Comparisons, schema_types
from cdc_sync.documents.render import render
from cdc_sync.documents.rows import Row
from cdc_sync.documents.sync import DocumentSync
from cdc_sync.mapping import MappingFile, TableRoute, load_mapping
from cdc_sync.relations import DocumentSpec, Kind, NestedType
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.search.actions import BulkAction

pytestmark = pytest.mark.unit

MAPPING = """
version: 1
source: {topic_prefix: t}
tables:
  s.orders:
    search: {index: flat_orders}
documents:
  orders:
    index: order_docs
    root: s.orders
    filter: "status <> 'void'"
    relations:
      customer: {table: s.customers, kind: one, join: {customer_id: id}}
      lines:
        table: s.lines
        join: {id: order_id}
        columns: [line_no, product_id, qty]
        rename: {qty: quantity}
        type: nested
        relations:
          product:
            table: s.products
            kind: one
            join: {product_id: id}
            relations:
              tags:
                table: s.tags
                through: {table: s.product_tags, join: {id: product_id}}
                join: {tag_id: id}
"""

INT = ColumnType(TypeKind.INT64)
TEXT = ColumnType(TypeKind.STRING)
COLUMNS = {
    "customers": (("id", INT), ("name", TEXT)),
    "orders": (("id", INT), ("customer_id", INT), ("status", TEXT)),
    "lines": (("order_id", INT), ("line_no", INT), ("product_id", INT), ("qty", INT)),
    "products": (("id", INT), ("name", TEXT)),
    "tags": (("id", INT), ("label", TEXT)),
    "product_tags": (("product_id", INT), ("tag_id", INT)),
}
KEYS = {
    "customers": ("id",),
    "orders": ("id",),
    "lines": ("order_id", "line_no"),
    "products": ("id",),
    "tags": ("id",),
    "product_tags": ("product_id", "tag_id"),
}
SCHEMAS = {
    name: RowSchema(tuple(Column(c, t) for c, t in columns)) for name, columns in COLUMNS.items()
}
SCHEMAS_BY_TABLE = {TableId("s", name): schema for name, schema in SCHEMAS.items()}


def load(tmp_path: Path, text: str = MAPPING) -> MappingFile:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return load_mapping(path)


class MemoryIndex:
    """A search server's versioning (`external_gte`) and aliases, in memory."""

    def __init__(self) -> None:
        self.indices: dict[str, dict[str, tuple[int, Mapping[str, Any] | None]]] = {}
        self.aliases: dict[str, str] = {}
        self.routes: list[TableRoute] = []
        self.mappings: dict[str, Mapping[str, Any]] = {}  # each index's mapping at creation

    @property
    def docs(self) -> dict[str, dict[str, Any]]:
        """The documents behind the (only) alias."""
        (index,) = self.aliases.values()
        return {i: dict(doc) for i, (_, doc) in self.indices[index].items() if doc is not None}

    @property
    def versions(self) -> dict[str, int]:
        (index,) = self.aliases.values()
        return {i: version for i, (version, _) in self.indices[index].items()}

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        assert route.search is not None
        self.routes.append(route)
        if route.search.index not in self.aliases:
            self.aliases[route.search.index] = f"{route.search.index}_v1"
            self._create(f"{route.search.index}_v1", route)

    def _create(self, index: str, route: TableRoute) -> None:
        assert route.search is not None
        self.indices[index] = {}
        self.mappings[index] = route.search.mapping

    def holds(self, alias: str) -> bool:
        return alias in self.aliases

    def index_exists(self, index: str) -> bool:
        return index in self.indices

    def next_generation(self, route: TableRoute) -> str:
        """As the search sink's: the generation behind the alias plus one, made anew."""
        assert route.search is not None
        alias = route.search.index
        held = self.aliases.get(alias, f"{alias}_v0")
        index = f"{alias}_v{int(held.rsplit('_v', 1)[1]) + 1}"
        self._create(index, route)
        return index

    def highest_version(self, alias: str) -> int:
        index = self.aliases.get(alias)
        return max((v for v, _ in self.indices.get(index or "", {}).values()), default=0)

    def promote(self, alias: str, index: str) -> None:
        old = self.aliases.get(alias)
        self.aliases[alias] = index
        if old is not None:
            del self.indices[old]

    def write_documents(self, alias: str, actions: Sequence[BulkAction]) -> WriteResult:
        held = self.indices[self.aliases.get(alias, alias)]
        result = WriteResult()
        for action in actions:
            if held.get(action.doc_id, (-1, None))[0] > action.version:
                result = result.merge(WriteResult(fenced=1))
                continue
            held[action.doc_id] = (action.version, action.document)
            result = result.merge(WriteResult(applied=1))
        return result


class Tables:
    """The source tables' rows, and a RowSource over them (what verify reads from Postgres)."""

    def __init__(self, spec: DocumentSpec) -> None:
        self.data: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {n: {} for n in COLUMNS}
        self.comparisons = Comparisons([spec], schema_types(SCHEMAS_BY_TABLE))

    def _row(self, table: str, row: dict[str, Any]) -> Row:
        key = tuple((k, row[k]) for k in KEYS[table])
        return Row(document_id(key), tuple(v for _, v in key), row)

    def rows(self, table: TableId, ids: Sequence[str]) -> list[Row]:
        found = [self._row(table.table, r) for r in self.data[table.table].values()]
        return [r for r in found if r.id in set(ids)]

    def joined(self, table: TableId, key: str, values: Iterable[str]) -> list[Row]:
        (side,) = [s for s in self.comparisons.sides()[table] if s.key == key]
        rows = [self._row(table.table, r) for r in self.data[table.table].values()]
        return [row for row in rows if side.value(row) in set(values)]

    def expected(self, spec: DocumentSpec) -> dict[str, dict[str, Any]]:
        roots = [
            self._row("orders", r) for r in self.data["orders"].values() if r["status"] != "void"
        ]
        return render(spec, roots, self)


small = st.integers(1, 4)
OPERATIONS = st.one_of(
    st.tuples(
        st.just("customers"), st.fixed_dictionaries({"id": small, "name": st.sampled_from("ab")})
    ),
    st.tuples(
        st.just("orders"),
        st.fixed_dictionaries(
            {"id": small, "customer_id": small, "status": st.sampled_from(["new", "void", "paid"])}
        ),
    ),
    st.tuples(
        st.just("lines"),
        st.fixed_dictionaries(
            {"order_id": small, "line_no": st.integers(1, 2), "product_id": small, "qty": small}
        ),
    ),
    st.tuples(
        st.just("products"), st.fixed_dictionaries({"id": small, "name": st.sampled_from("xy")})
    ),
    st.tuples(
        st.just("tags"), st.fixed_dictionaries({"id": small, "label": st.sampled_from("pq")})
    ),
    st.tuples(
        st.just("product_tags"), st.fixed_dictionaries({"product_id": small, "tag_id": small})
    ),
)
STEPS = st.lists(st.tuples(OPERATIONS, st.booleans()), min_size=1, max_size=40)


def change(table: str, row: dict[str, Any], delete: bool, version: int) -> Change:
    key = tuple((k, row[k]) for k in KEYS[table])
    return Change(
        TableId("s", table),
        key,
        Op.DELETE if delete else Op.UPDATE,
        version,
        None if delete else dict(row),
        Coordinates(f"t.s.{table}", 0, version),
        schema=SCHEMAS[table],
    )


def folded(changes: Sequence[Change]) -> dict[TableId, list[Change]]:
    """Newest change per key, per table (the job's fold)."""
    newest: dict[tuple[TableId, str], Change] = {}
    for c in changes:
        newest[(c.table, c.doc_id)] = c
    by_table: dict[TableId, list[Change]] = {}
    for (table, _), c in newest.items():
        by_table.setdefault(table, []).append(c)
    return by_table


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=STEPS,
    cut=st.integers(1, 7),
    replay=st.booleans(),
    chunk=st.integers(1, 3),
    bulk=st.integers(1, 4),
    in_flight=st.integers(1, 3),
)
def test_documents_equal_the_join_of_the_final_rows(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[tuple[str, dict[str, Any]], bool]],
    cut: int,
    replay: bool,
    chunk: int,
    bulk: int,
    in_flight: int,
) -> None:
    directory = tmp_path_factory.mktemp("docs")
    mapping = load(directory)
    index = MemoryIndex()
    with pytest.MonkeyPatch.context() as patch:  # bulks of `bulk` documents, several at once
        patch.setattr(document_sync, "BULK_CHUNK", bulk)
        check_documents(mapping, directory, index, steps, cut, replay, chunk, in_flight)


def check_documents(
    mapping: MappingFile,
    directory: Path,
    index: MemoryIndex,
    steps: list[tuple[tuple[str, dict[str, Any]], bool]],
    cut: int,
    replay: bool,
    chunk: int,
    in_flight: int,
) -> None:
    sync = DocumentSync(
        mapping, directory / "state.sqlite", index, chunk=chunk, bulks_in_flight=in_flight
    )
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    tables = Tables(mapping.documents["orders"])
    log = []
    for version, ((table, row), delete) in enumerate(steps, start=1):
        key = tuple(row[k] for k in KEYS[table])
        if delete:
            tables.data[table].pop(key, None)
        else:
            tables.data[table][key] = dict(row)
        log.append(change(table, row, delete, version * 10))
    for start in range(0, len(log), cut):
        batch = folded(log[start : start + cut])
        sync.apply([], batch)
        if replay:  # the batch re-run after a crash: harmless
            sync.apply([], batch)
    spec = mapping.documents["orders"]
    assert index.docs == tables.expected(spec)
    sync.close()


def test_a_truncate_of_a_nested_table_empties_it_in_every_document(tmp_path: Path) -> None:
    mapping = load(tmp_path)
    index = MemoryIndex()
    sync = DocumentSync(mapping, tmp_path / "state.sqlite", index)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    sync.apply(
        [],
        folded(
            [
                change("orders", {"id": 1, "customer_id": 1, "status": "new"}, False, 10),
                change(
                    "lines", {"order_id": 1, "line_no": 1, "product_id": 2, "qty": 3}, False, 10
                ),
                change("products", {"id": 2, "name": "x"}, False, 10),
            ]
        ),
    )
    assert index.docs["1"]["lines"][0]["product"] == {"id": 2, "name": "x", "tags": []}
    truncate = Truncate(TableId("s", "lines"), 20, Coordinates("t.s.lines", 0, 5))
    sync.apply([truncate], {})
    assert index.docs["1"]["lines"] == []
    assert index.versions["1"] == 20


def test_a_filtered_root_leaves_and_comes_back_whole(tmp_path: Path) -> None:
    mapping = load(tmp_path)
    index = MemoryIndex()
    sync = DocumentSync(mapping, tmp_path / "state.sqlite", index)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    line = {"order_id": 1, "line_no": 1, "product_id": 2, "qty": 3}
    sync.apply(
        [],
        folded(
            [
                change("orders", {"id": 1, "customer_id": 1, "status": "new"}, False, 10),
                change("lines", line, False, 10),
            ]
        ),
    )
    assert "1" in index.docs
    sync.apply(
        [], folded([change("orders", {"id": 1, "customer_id": 1, "status": "void"}, False, 20)])
    )
    assert "1" not in index.docs
    sync.apply(
        [], folded([change("orders", {"id": 1, "customer_id": 1, "status": "paid"}, False, 30)])
    )
    assert index.docs["1"]["lines"] == [
        {"line_no": 1, "product_id": 2, "quantity": 3, "product": None}
    ]


def test_a_stale_change_does_not_overwrite_the_state(tmp_path: Path) -> None:
    mapping = load(tmp_path)
    index = MemoryIndex()
    sync = DocumentSync(mapping, tmp_path / "state.sqlite", index)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    sync.apply([], folded([change("customers", {"id": 1, "name": "b"}, False, 20)]))
    sync.apply(
        [], folded([change("orders", {"id": 1, "customer_id": 1, "status": "new"}, False, 30)])
    )
    sync.apply([], folded([change("customers", {"id": 1, "name": "a"}, False, 10)]))  # replayed
    assert index.docs["1"]["customer"] == {"id": 1, "name": "b"}


def test_the_documents_survive_a_restart_with_pending_roots(tmp_path: Path) -> None:
    """A crash between the state's commit and the search write: the roots stay pending, and the
    re-run batch (whose line the state already moved) still re-renders the old parent."""
    mapping = load(tmp_path)

    class Flaky(MemoryIndex):
        down = False

        def write_documents(self, alias: str, actions: Sequence[BulkAction]) -> WriteResult:
            if self.down:
                raise ConnectionError("search server gone")
            return super().write_documents(alias, actions)

    index = Flaky()
    line = {"order_id": 1, "line_no": 1, "product_id": 2, "qty": 3}
    first = DocumentSync(mapping, tmp_path / "state.sqlite", index)
    first.ensure_targets(SCHEMAS_BY_TABLE)
    first.apply(
        [],
        folded(
            [
                change("orders", {"id": 1, "customer_id": 1, "status": "new"}, False, 10),
                change("orders", {"id": 2, "customer_id": 1, "status": "new"}, False, 10),
                change("lines", line, False, 10),
            ]
        ),
    )
    moved = dict(line, order_id=2)
    batch = folded([change("lines", line, True, 20), change("lines", moved, False, 20)])
    index.down = True
    with pytest.raises(ConnectionError):
        first.apply([], batch)
    first.close()
    index.down = False
    again = DocumentSync(mapping, tmp_path / "state.sqlite", index)
    again.ensure_targets(SCHEMAS_BY_TABLE)  # the index exists, the spec is the same: no build
    again.apply([], batch)  # the replay: the state already moved the line
    assert index.docs["1"]["lines"] == []
    assert [line["line_no"] for line in index.docs["2"]["lines"]] == [1]


def test_the_spec_parses_levels_relations_and_types(tmp_path: Path) -> None:
    spec = load(tmp_path).documents["orders"]
    assert spec.index == "order_docs" and spec.table == TableId("s", "orders")
    lines = spec.relations[1]
    assert (lines.kind, lines.nested_type, lines.on) == (
        Kind.MANY,
        NestedType.NESTED,
        (("id", "order_id"),),
    )
    tags = lines.relations[0].relations[0]
    assert tags.through is not None and tags.through.table == TableId("s", "product_tags")
    assert spec.tables() == {TableId("s", t) for t in COLUMNS}


def test_document_tables_without_a_section_are_routed_to_no_sink(tmp_path: Path) -> None:
    mapping = load(tmp_path)
    lines = mapping.tables[TableId("s", "lines")]
    assert lines.documents and lines.sinks() == ()
    assert mapping.tables[TableId("s", "orders")].search is not None
    assert "t.s.product_tags" in mapping.topics()


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (
            "    relations:\n      customer: {table: s.customers, kind: one}\n",
            "documents.orders.relations.customer.join",
        ),
        (
            "    relations:\n      customer: {table: s.customers, kind: sometimes, join: {a: b}}\n",
            "documents.orders.relations.customer.kind",
        ),
        (
            "    relations:\n      t: {table: s.tags, kind: one, join: {a: b},\n"
            "          through: {table: s.x, join: {a: b}}}\n",
            "documents.orders.relations.t.kind",
        ),
        (
            "    relations:\n      status: {table: s.tags, join: {a: b}}\n    columns: [status]\n",
            "documents.orders.relations",
        ),
        ("    colour: red\n", "documents.orders.colour"),
    ],
)
def test_a_bad_document_spec_names_the_field(tmp_path: Path, edit: str, path: str) -> None:
    text = (
        "version: 1\nsource: {topic_prefix: t}\ntables: {}\n"
        "documents:\n  orders:\n    root: s.orders\n" + edit
    )
    with pytest.raises(ConfigError) as error:
        load(tmp_path, text)
    assert error.value.path == path


def test_a_changed_spec_rebuilds_the_index_behind_its_alias(tmp_path: Path) -> None:
    mapping = load(tmp_path)
    index = MemoryIndex()
    sync = DocumentSync(mapping, tmp_path / "state.sqlite", index)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    line = {"order_id": 1, "line_no": 1, "product_id": 2, "qty": 3}
    sync.apply(
        [],
        folded(
            [
                change("orders", {"id": 1, "customer_id": 1, "status": "new"}, False, 10),
                change("orders", {"id": 2, "customer_id": 1, "status": "void"}, False, 10),
                change("lines", line, False, 10),
            ]
        ),
    )
    sync.close()
    assert index.aliases == {"order_docs": "order_docs_v1"}
    changed = load(tmp_path, MAPPING.replace("rename: {qty: quantity}", "rename: {qty: amount}"))
    again = DocumentSync(changed, tmp_path / "state.sqlite", index)
    again.ensure_targets(SCHEMAS_BY_TABLE)
    assert index.aliases["order_docs"] != "order_docs_v1"
    assert "order_docs_v1" not in index.indices
    assert index.docs == {
        "1": {
            "id": 1,
            "customer_id": 1,
            "status": "new",
            "customer": None,
            "lines": [{"line_no": 1, "product_id": 2, "amount": 3, "product": None}],
        }
    }
    promoted = index.aliases["order_docs"]
    unchanged = DocumentSync(changed, tmp_path / "state.sqlite", index)
    unchanged.ensure_targets(SCHEMAS_BY_TABLE)  # same spec: no rebuild
    assert index.aliases["order_docs"] == promoted


def test_unchanged_toast_values_the_fill_left_come_from_the_state(tmp_path: Path) -> None:
    """A column still unavailable after the fill (e.g. dropped since) keeps the state's value."""
    mapping = load(tmp_path)
    index = MemoryIndex()
    sync = DocumentSync(mapping, tmp_path / "state.sqlite", index)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    order = {"id": 1, "customer_id": 1, "status": "new"}
    sync.apply(
        [],
        folded(
            [
                change("orders", order, False, 10),
                change("customers", {"id": 1, "name": "long"}, False, 10),
            ]
        ),
    )
    renamed = dataclasses.replace(
        change("customers", {"id": 1, "name": None}, False, 20),
        unavailable_columns=frozenset({"name"}),
    )
    sync.apply([], {TableId("s", "customers"): [renamed]})
    assert index.docs["1"]["customer"] == {"id": 1, "name": "long"}


def test_a_new_state_beside_an_older_index_overwrites_its_documents(tmp_path: Path) -> None:
    """A new checkpoint replays the topics into a new state while the index keeps documents
    written at higher versions: the replay's renders (a root's delete included) must win."""
    mapping = load(tmp_path)
    index = MemoryIndex()
    old = DocumentSync(mapping, tmp_path / "old.sqlite", index)
    old.ensure_targets(SCHEMAS_BY_TABLE)
    one_batch = [
        change("orders", {"id": 1, "customer_id": 1, "status": "new"}, False, 500),
        change("orders", {"id": 2, "customer_id": 1, "status": "new"}, False, 900),
    ]
    old.apply([], folded(one_batch))  # both documents at version 900
    assert index.versions["1"] == 900
    new = DocumentSync(mapping, tmp_path / "new.sqlite", index)
    new.ensure_targets(SCHEMAS_BY_TABLE)
    new.apply(
        [], folded([change("orders", {"id": 1, "customer_id": 1, "status": "new"}, True, 600)])
    )
    assert "1" not in index.docs  # the delete at version 600 < 900 would have been fenced


def test_a_placeholder_is_never_a_value_in_a_document(tmp_path: Path) -> None:
    mapping = load(tmp_path)
    index = MemoryIndex()
    sync = DocumentSync(mapping, tmp_path / "state.sqlite", index)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    order = {"id": 1, "customer_id": 1, "status": "new"}
    placeholder = dataclasses.replace(
        change("customers", {"id": 1, "name": "__debezium_unavailable_value"}, False, 20),
        unavailable_columns=frozenset({"name"}),
    )
    sync.apply(
        [],
        {**folded([change("orders", order, False, 10)]), TableId("s", "customers"): [placeholder]},
    )
    assert index.docs["1"]["customer"] == {"id": 1}


def test_a_full_batch_of_snapshot_rows_waits_for_the_end_of_the_backlog(tmp_path: Path) -> None:
    mapping = load(tmp_path)
    index = MemoryIndex()
    sync = DocumentSync(mapping, tmp_path / "state.sqlite", index, full_batch=2)
    sync.ensure_targets(SCHEMAS_BY_TABLE)

    def read(table: str, row: dict[str, Any], last: bool = False) -> Change:
        return dataclasses.replace(change(table, row, False, 10), op=Op.READ, ends_snapshot=last)

    orders = [read("orders", {"id": i, "customer_id": 1, "status": "new"}) for i in (1, 2)]
    sync.apply([], folded(orders), records=2)  # full, more behind it: not rendered yet
    assert index.docs == {}
    line = read("lines", {"order_id": 1, "line_no": 1, "product_id": 2, "qty": 3}, last=True)
    customer = read("customers", {"id": 1, "name": "a"})
    sync.apply([], folded([line, customer]), records=2)  # full, but a table's snapshot ended
    assert set(index.docs) == {"1", "2"} and index.docs["1"]["lines"][0]["quantity"] == 3
    sync.apply([], folded([read("customers", {"id": 1, "name": "b"})]), records=1)  # partial
    assert index.docs["2"]["customer"] == {"id": 1, "name": "b"}


class CountingIndex(MemoryIndex):
    """Records every bulk it takes (the ids of its actions)."""

    def __init__(self) -> None:
        super().__init__()
        self.bulks: list[list[str]] = []

    def write_documents(self, alias: str, actions: Sequence[BulkAction]) -> WriteResult:
        self.bulks.append([action.doc_id for action in actions])
        return super().write_documents(alias, actions)


def test_a_document_that_did_not_change_is_not_written_again(tmp_path: Path) -> None:
    """A re-rendered root whose document is what the index holds costs no write (the search
    server re-indexes a re-sent document as fully as a changed one); a changed one is written."""
    mapping = load(tmp_path)
    index = CountingIndex()
    sync = DocumentSync(mapping, tmp_path / "state.sqlite", index)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    line = {"order_id": 1, "line_no": 1, "product_id": 2, "qty": 3}
    sync.apply(
        [],
        folded(
            [
                change("orders", {"id": 1, "customer_id": 1, "status": "new"}, False, 10),
                change("lines", line, False, 10),
                change("products", {"id": 2, "name": "x"}, False, 10),
            ]
        ),
    )
    assert index.bulks == [["1"]]
    sync.apply([], folded([change("products", {"id": 2, "name": "x"}, False, 11)]))
    assert index.bulks == [["1"]]  # rendered again, the same document: not sent
    assert index.versions["1"] == 10
    sync.apply([], folded([change("products", {"id": 2, "name": "y"}, False, 12)]))
    assert index.bulks == [["1"], ["1"]]
    assert index.docs["1"]["lines"][0]["product"]["name"] == "y"
    assert index.versions["1"] == 12


def test_rendered_chunks_are_written_in_bulks_as_large_as_the_sinks(tmp_path: Path) -> None:
    """Roots render a chunk at a time (memory), but go to the server in bulks as large as the
    search sink's: small bulks left the local search server re-indexing for minutes."""
    mapping = load(tmp_path)
    index = CountingIndex()
    sync = DocumentSync(mapping, tmp_path / "state.sqlite", index, chunk=2)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    orders = [
        change("orders", {"id": n, "customer_id": 1, "status": "new"}, False, 10)
        for n in range(1, 6)
    ]
    sync.apply([], folded(orders))
    assert [sorted(bulk) for bulk in index.bulks] == [["1", "2", "3", "4", "5"]]


class SlowIndex(MemoryIndex):
    """Each bulk takes longer than the one before and counts how many run at once; `failing`:
    the bulk (by number, from 1) that fails at once."""

    def __init__(self, failing: int | None = None) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.running = self.most = self.calls = 0
        self.failing = failing

    def write_documents(self, alias: str, actions: Sequence[BulkAction]) -> WriteResult:
        with self.lock:
            self.calls += 1
            number = self.calls
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if number == self.failing:
                raise ConnectionError("the search server went away")
            time.sleep(0.03 * number)
            return super().write_documents(alias, actions)
        finally:
            with self.lock:
                self.running -= 1


def many_orders(count: int) -> dict[TableId, list[Change]]:
    return folded(
        [
            change("orders", {"id": n, "customer_id": 1, "status": "new"}, False, 10)
            for n in range(1, count + 1)
        ]
    )


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_bulks_go_out_side_by_side_up_to_their_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_flight: int
) -> None:
    """Rendering goes on while bulks are written, `bulks_in_flight` of them at once, never more;
    every document arrives."""
    monkeypatch.setattr(document_sync, "BULK_CHUNK", 2)
    mapping = load(tmp_path)
    index = SlowIndex()
    sync = DocumentSync(mapping, tmp_path / "s.sqlite", index, chunk=1, bulks_in_flight=in_flight)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    sync.apply([], many_orders(12))
    assert index.calls == 6
    assert index.most == in_flight
    assert sorted(index.docs, key=int) == [str(n) for n in range(1, 13)]
    sync.close()


def test_a_failed_bulk_leaves_none_writing_and_every_root_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bulk that fails fails the step only once no other bulk is still writing (nothing of the
    step lands after it has failed), and the roots stay pending: the batch run again writes
    every document."""
    monkeypatch.setattr(document_sync, "BULK_CHUNK", 2)
    mapping = load(tmp_path)
    index = SlowIndex(failing=2)
    sync = DocumentSync(mapping, tmp_path / "s.sqlite", index, chunk=1, bulks_in_flight=3)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    batch = many_orders(12)
    with pytest.raises(ConnectionError, match="went away"):
        sync.apply([], batch)
    assert index.running == 0
    index.failing = None
    sync.apply([], batch)  # the batch again, as Spark re-runs a failed one
    assert sorted(index.docs, key=int) == [str(n) for n in range(1, 13)]
    sync.close()


def test_bulks_in_flight_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bulks_in_flight must be at least 1, got 0"):
        DocumentSync(load(tmp_path), tmp_path / "s.sqlite", MemoryIndex(), bulks_in_flight=0)


def test_a_fan_out_climbs_the_join_index_without_reading_a_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A product renamed under many orders reaches them through join values and ids alone:
    reading the rows on the way held every line and order of the fan-out in memory, parsed
    (2.4 GB for a product in a million orders)."""
    mapping = load(tmp_path)
    sync = DocumentSync(mapping, tmp_path / "state.sqlite", MemoryIndex())
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    rows = [change("products", {"id": 7, "name": "x"}, False, 10)]
    rows += [change("tags", {"id": 3, "label": "t"}, False, 10)]
    rows += [change("product_tags", {"product_id": 7, "tag_id": 3}, False, 10)]
    for n in range(1, 6):
        rows += [change("orders", {"id": n, "customer_id": 1, "status": "new"}, False, 10)]
        rows += [
            change("lines", {"order_id": n, "line_no": 1, "product_id": 7, "qty": 1}, False, 10)
        ]
    sync.apply([], folded(rows))

    def no_row_reads(*_args: Any) -> list[Row]:
        raise AssertionError("a fan-out read rows")

    state = sync.state
    monkeypatch.setattr(state, "joined", no_row_reads)
    monkeypatch.setattr(state, "rows", no_row_reads)
    spec = mapping.documents["orders"]
    for table, row in (("products", {"id": 7, "name": "y"}), ("tags", {"id": 3, "label": "u"})):
        with state.transaction():
            changed = state.merge(
                TableId("s", table), [document_sync._entry(change(table, row, False, 20))]
            )
        assert fanout.affected_roots(spec, {TableId("s", table): changed}, state) == {
            str(n) for n in range(1, 6)
        }
    sync.close()
