"""Per-sink shapes on real servers (search, Redis, Delta): soft deletes and filters stay fenced.

A soft delete is a write at the delete's version: a stale update after it is refused (the row
stays marked), a re-insert clears the mark. It marks only a row the sink holds: a delete of a
row the filter excluded, or that the sink never held, leaves nothing (and still fences). A row
leaving a filter is a delete at its version: a stale change that still matched cannot bring it
back. The end of a full snapshot marks the rows it no longer holds and keeps the marked ones.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_sync.core.model import Change, Coordinates, Op, TableId, Truncate
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.job.decode.fold import fold_key
from cdc_sync.mapping import TableRoute, load_mapping
from cdc_sync.sinks.base import Sink
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.redis import RedisSink
from cdc_sync.sinks.search import SearchSink
from cdc_sync.verify.compare import cache_rows, delta_rows, search_rows

pytestmark = pytest.mark.integration
TABLE = TableId("shop", "products")
SCHEMA = RowSchema(
    (
        Column("id", ColumnType(TypeKind.INT32, optional=False)),
        Column("name", ColumnType(TypeKind.STRING)),
        Column("price", ColumnType(TypeKind.DECIMAL, precision=10, scale=2)),
        Column("in_stock", ColumnType(TypeKind.BOOLEAN)),
    )
)
Rows = Callable[[], dict[str, dict[str, Any]]]


@pytest.fixture(params=["search", "search-elasticsearch", "cache", "delta"])
def target(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[TableRoute, Sink, Rows]]:
    tag = uuid.uuid4().hex[:8]
    section, _, kind = str(request.param).partition("-")
    route = route_of(tmp_path / "m.yaml", f"{section}: {{{_section(section, tag)}}}")
    sink: Any
    if section == "search":
        sink = SearchSink(kind or "opensearch", request.getfixturevalue("search_url"), 3600)
        assert route.search is not None
        alias = route.search.index

        def rows() -> dict[str, dict[str, Any]]:
            sink.refresh(alias)
            return search_rows(sink.backend, route)
    elif section == "cache":
        url = request.getfixturevalue("redis_url")
        sink = RedisSink(url, tombstone_retention_seconds=3600)
        client = redis.Redis.from_url(url)

        def rows() -> dict[str, dict[str, Any]]:
            return cache_rows(client, route)
    else:
        sink = DeltaSink(tmp_path / "warehouse", 3600)

        def rows() -> dict[str, dict[str, Any]]:
            return delta_rows(tmp_path / "warehouse", route, ["id"])

    sink.ensure_target(route, route.sink_schema(section, SCHEMA))
    yield route, sink, rows
    sink.close()


def _section(sink: str, tag: str) -> str:
    return {
        "search": f"index: t_shaped_{tag}",
        "cache": f"prefix: t{tag}",
        "delta": f"table: shop.products_{tag}",
    }[sink]


def upsert(
    version: int, in_stock: bool = True, name: str = "n", key: int = 1, op: Op = Op.UPDATE
) -> Change:
    row = {"id": key, "name": name, "price": Decimal("2.50"), "in_stock": in_stock}
    return Change(TABLE, (("id", key),), op, version, row, _at(version), 1_000, schema=SCHEMA)


def delete(version: int, key: int = 1) -> Change:
    return Change(TABLE, (("id", key),), Op.DELETE, version, None, _at(version), 1_700_000_000_000)


def _at(offset: int) -> Coordinates:
    return Coordinates("cdc.shop.products", 0, offset)


def write(target: tuple[TableRoute, Sink, Rows], *changes: Change) -> tuple[int, int]:
    route, sink, _ = target
    section = next(iter(route.shapes))
    result = sink.apply(route, route.sink_changes(SCHEMA, list(changes))[section])
    assert not result.failures
    return result.applied, result.fenced


def marked(route: TableRoute, row: dict[str, Any]) -> bool:
    shape = next(iter(route.shapes.values()))
    return row.get(shape.markers[0]) is True


def test_a_stale_update_after_a_soft_delete_stays_marked_and_a_reinsert_clears_it(
    target: tuple[TableRoute, Sink, Rows],
) -> None:
    route, _, rows = target
    assert write(target, upsert(10, name="first")) == (1, 0)
    assert rows()["1"]["cents"] == "250"
    write(target, delete(20))
    held = rows()["1"]
    assert marked(route, held) and held["name"] == "first"  # the stored fields stay
    write(target, upsert(15, name="stale"))  # older than the delete: fenced
    held = rows()["1"]
    assert marked(route, held) and held["name"] == "first"
    write(target, upsert(30, name="again"))
    held = rows()["1"]
    assert not marked(route, held) and held["name"] == "again"


def test_a_row_leaving_the_filter_is_deleted_and_a_stale_match_cannot_return(
    target: tuple[TableRoute, Sink, Rows],
) -> None:
    _, _, rows = target
    write(target, upsert(10))
    assert "1" in rows()
    write(target, upsert(20, in_stock=False))
    assert "1" not in rows()
    write(target, upsert(15, in_stock=True, name="stale"))
    assert "1" not in rows()
    write(target, upsert(30, in_stock=True, name="back"))
    assert rows()["1"]["name"] == "back"


def test_a_delete_of_a_row_the_filter_excluded_marks_nothing_and_still_fences(
    target: tuple[TableRoute, Sink, Rows],
) -> None:
    """Issue 27 point 5: the delete wrote `{id, _deleted: true}` into the sink whose filter
    excluded the row (tenant B's row in tenant A's index)."""
    _, _, rows = target
    write(target, upsert(10, in_stock=False))
    assert rows() == {}
    write(target, delete(20))
    assert rows() == {}
    write(target, upsert(15, name="stale"))  # older than the delete: fenced, matching or not
    assert rows() == {}


def test_a_delete_of_a_row_the_sink_never_held_marks_nothing(
    target: tuple[TableRoute, Sink, Rows],
) -> None:
    _, _, rows = target
    write(target, delete(20))
    assert rows() == {}
    write(target, upsert(15, name="stale"))
    assert rows() == {}
    write(target, upsert(30, name="later"))
    assert rows()["1"]["name"] == "later"


def test_a_row_that_left_the_filter_then_was_deleted_in_one_batch_is_not_marked(
    target: tuple[TableRoute, Sink, Rows],
) -> None:
    """The sink holds the row as it matched; the batch folds its update out of the filter and
    its delete into the delete alone (newest per key): the row's last state did not match."""
    _, _, rows = target
    write(target, upsert(10, name="matched"))
    write(target, fold_key([upsert(20, in_stock=False), delete(30)]))
    assert rows() == {}


def test_a_delete_after_an_update_in_one_batch_marks_the_row_as_it_was_last(
    target: tuple[TableRoute, Sink, Rows],
) -> None:
    route, _, rows = target
    write(target, upsert(10, name="first"))
    write(target, fold_key([upsert(20, name="last"), delete(30)]))
    held = rows()["1"]
    assert marked(route, held) and held["name"] == "last", held


def test_a_snapshot_end_marks_the_rows_it_no_longer_holds_and_keeps_the_marked_ones(
    target: tuple[TableRoute, Sink, Rows],
) -> None:
    """Issue 27 point 6: the snapshot's end hard-deleted every row older than it, marked ones
    included: a re-snapshot after lost offsets purged the soft-delete history, and rows
    deleted while capture did not publish were removed instead of marked."""
    route, sink, rows = target
    write(target, upsert(10, key=1, name="gone"), upsert(10, key=2), upsert(10, key=3))
    write(target, delete(12, key=2))
    marked_at = rows()["2"][next(iter(route.shapes.values())).markers[1]]
    write(target, upsert(40, key=3, name="snapshot", op=Op.READ))
    end = Truncate(TABLE, 40, _at(41), None, 1_800_000_000_000, snapshot_end=True)
    sink.truncate(route, end)
    held = rows()
    assert set(held) == {"1", "2", "3"}, held
    assert marked(route, held["1"]) and held["1"]["name"] == "gone"
    at = next(iter(route.shapes.values())).markers[1]
    assert held["1"][at] is not None and held["1"][at] != marked_at
    assert marked(route, held["2"]) and held["2"][at] == marked_at  # kept as it was
    assert not marked(route, held["3"]) and held["3"]["name"] == "snapshot"
    write(target, upsert(35, key=1, name="stale"))  # older than the snapshot's mark: fenced
    assert marked(route, rows()["1"]) and rows()["1"]["name"] == "gone"


def test_a_truncate_still_removes_every_older_row_marked_or_not(
    target: tuple[TableRoute, Sink, Rows],
) -> None:
    _, sink, rows = target
    route = target[0]
    write(target, upsert(10, key=1), upsert(10, key=2))
    write(target, delete(12, key=2))
    sink.truncate(route, Truncate(TABLE, 40, _at(41), 41, 1_800_000_000_000))
    assert rows() == {}


# One key's history: row states (in the filter or not, named by the step) and deletes, a
# delete never twice in a row (Postgres cannot delete a row that is gone).
HISTORIES = st.lists(st.booleans(), min_size=1, max_size=8).flatmap(
    lambda states: st.lists(st.booleans(), min_size=len(states), max_size=len(states)).map(
        lambda deletes: [
            event
            for in_stock, then_delete in zip(states, deletes, strict=True)
            for event in ([in_stock, None] if then_delete else [in_stock])
        ]
    )
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(history=HISTORIES, cuts=st.sets(st.integers(1, 15)))
def test_whatever_the_batches_a_marked_row_is_the_last_matching_state_of_a_deleted_row(
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    history: list[bool | None],
    cuts: set[int],
) -> None:
    """On the real cache: a key's changes (True: a row in the filter, False: outside it,
    None: a delete), cut into micro-batches anywhere, each folded as the job folds a batch.
    The cache ends holding the last state if it matches; nothing if it does not; after a
    delete, the row as it was last, marked, only if it matched, and for sure when the cache
    held it before the delete's batch; never a stub."""
    tag = uuid.uuid4().hex[:8]
    route = route_of(tmp_path_factory.mktemp(tag) / "m.yaml", f"cache: {{prefix: p{tag}}}")
    sink = RedisSink(redis_url, tombstone_retention_seconds=3600)
    changes = [
        delete(version) if state is None else upsert(version, state, name=f"v{version}")
        for version, state in enumerate(history, start=10)
    ]
    bounds = [0, *sorted(c for c in cuts if c < len(changes)), len(changes)]
    batches = [changes[a:b] for a, b in itertools.pairwise(bounds)]
    client = redis.Redis.from_url(redis_url)
    try:
        for batch in batches:
            shaped = route.sink_changes(SCHEMA, [fold_key(batch)])["cache"]
            assert not sink.apply(route, shaped).failures
        held = cache_rows(client, route).get("1")
    finally:
        sink.close()
        client.close()
    last = history[-1]
    if last is not None:
        assert (held is not None) == last and (held is None or held["_deleted"] is False)
        assert held is None or held["name"] == f"v{len(history) + 9}"
        return
    before = history[-2] if len(history) > 1 else None  # the state the delete removed
    if held is not None:
        assert held["_deleted"] is True and held["in_stock"] is True and before is True
        assert held["name"] == f"v{len(history) + 8}" and held["cents"] == "250"  # no stub
    delete_batch = next(b for b in batches if b[-1] is changes[-1])
    if before is True and delete_batch[0] is changes[-1]:
        assert held is not None  # the cache held the row as it matched: it is marked


def route_of(path: Path, section: str) -> TableRoute:
    """The products route of these tests, with one sink `section`."""
    path.write_text(
        "version: 1\nsource: {topic_prefix: cdc}\ntables:\n  shop.products:\n"
        "    filter: in_stock\n    on_delete: soft\n"
        "    computed: {cents: 'CAST(price * 100 AS BIGINT)'}\n"
        f"    {section}\n"
    )
    return load_mapping(path).tables[TABLE]
