"""Search sink on a real server (osmem-server locally), through both clients."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import opensearchpy
import pytest

from cdc_sync.core.model import Change, Coordinates, Truncate
from cdc_sync.mapping import TableRoute
from cdc_sync.sinks.search import SearchSink
from cdc_sync.sinks.search import readback as search_readback
from tests.changes import LONG_FIELDS, change, products_route, tombstone_only
from tests.envelopes import UNAVAILABLE, product

pytestmark = pytest.mark.integration


@pytest.fixture(params=["opensearch", "elasticsearch"])
def sink(request: pytest.FixtureRequest, search_url: str) -> Iterator[SearchSink]:
    sink = SearchSink(request.param, search_url, tombstone_retention_seconds=3600)
    yield sink
    sink.close()


@pytest.fixture
def route(sink: SearchSink) -> TableRoute:
    route = products_route()
    sink.ensure_target(route, change(route, "c", 1, 1, product(1)).schema)
    return route


def docs(sink: SearchSink, route: TableRoute) -> dict[str, dict[str, Any]]:
    assert route.search is not None
    sink.refresh(route.search.index)
    found = sink.backend.mget(route.search.index, [str(i) for i in range(1, 10)])
    return {d["_id"]: d["_source"] for d in found if d.get("found")}


def apply(sink: SearchSink, route: TableRoute, *changes: Change) -> tuple[int, int, int]:
    result = sink.apply(route, list(changes))
    return result.applied, result.fenced, len(result.failures)


def test_newer_wins_and_an_older_update_is_fenced(sink: SearchSink, route: TableRoute) -> None:
    assert apply(sink, route, change(route, "c", 10, 1, product(1, name="v10"))) == (1, 0, 0)
    assert apply(sink, route, change(route, "u", 30, 1, product(1, name="v30"))) == (1, 0, 0)
    assert apply(sink, route, change(route, "u", 20, 1, product(1, name="v20"))) == (0, 1, 0)
    assert docs(sink, route)["1"]["name"] == "v30"


def test_a_stale_update_after_a_delete_does_not_resurrect(
    sink: SearchSink, route: TableRoute
) -> None:
    apply(sink, route, change(route, "c", 10, 2, product(2)))
    assert apply(sink, route, change(route, "d", 40, 2)) == (1, 0, 0)
    assert apply(sink, route, change(route, "u", 30, 2, product(2, name="stale"))) == (0, 1, 0)
    assert "2" not in docs(sink, route)


def test_replaying_a_batch_is_idempotent(sink: SearchSink, route: TableRoute) -> None:
    batch = [change(route, "c", 10, 3, product(3)), change(route, "c", 11, 4, product(4))]
    apply(sink, route, *batch)
    before = docs(sink, route)
    applied, fenced, failed = apply(sink, route, *batch)
    assert failed == 0 and applied + fenced == 2
    assert docs(sink, route) == before


def test_unchanged_toast_field_keeps_the_stored_value(sink: SearchSink, route: TableRoute) -> None:
    apply(sink, route, change(route, "c", 10, 5, product(5, description="long stored text")))
    toast = product(5, name="renamed", description=UNAVAILABLE)
    assert apply(sink, route, change(route, "u", 20, 5, toast)) == (1, 0, 0)
    doc = docs(sink, route)["5"]
    assert (doc["name"], doc["description"]) == ("renamed", "long stored text")


def test_composite_style_ids_and_new_columns_evolve_the_mapping(
    sink: SearchSink, route: TableRoute
) -> None:
    wider = change(route, "c", 10, 6, product(6) | {"in_stock": None, "stock": 12}, LONG_FIELDS)
    sink.ensure_target(route, wider.schema)  # adds `stock` to the index mapping
    assert route.search is not None
    mappings = sink.backend.mappings(route.search.index)
    assert all("stock" in m["properties"] for m in mappings.values())
    assert apply(sink, route, wider) == (1, 0, 0)
    assert docs(sink, route)["6"]["stock"] == 12


def test_a_document_the_mapping_rejects_is_a_terminal_record_failure(
    sink: SearchSink, route: TableRoute
) -> None:
    bad = change(
        route,
        "c",
        10,
        7,
        product(7) | {"stock": "not a number"},
        [*LONG_FIELDS[:-1], {"type": "string", "optional": True, "field": "stock"}],
    )
    sink.ensure_target(
        route, change(route, "c", 9, 8, product(8) | {"stock": 1}, LONG_FIELDS).schema
    )
    result = sink.apply(route, [bad, change(route, "c", 11, 8, product(8))])
    assert result.applied == 1
    [failure] = result.failures
    assert failure.change.doc_id == "7"
    assert "exception" in failure.error_class
    assert "not a number" not in failure.message  # no payloads in errors


def test_an_existing_index_gets_the_tombstone_retention_as_gc_deletes(sink: SearchSink) -> None:
    route = products_route()
    assert route.search is not None
    alias = route.search.index
    # An index made before this release (or by hand), with the server's default gc_deletes.
    sink.backend.create_index(f"{alias}_v1", {"properties": {}}, {}, alias)
    sink.ensure_target(route, None)
    held = sink.backend.settings(alias)
    assert [s["index"]["gc_deletes"] for s in held.values()] == ["3600s"]
    assert search_readback.field_types(sink.backend, alias) == {}


def test_equal_versions_of_one_transaction_keep_kafka_order_across_batches(
    sink: SearchSink, route: TableRoute
) -> None:
    """Delete + re-insert in one transaction share its version: the re-insert, later in Kafka
    order but in the next micro-batch, must apply (external_gte)."""
    apply(sink, route, change(route, "c", 10, 6, product(6, name="before")))
    apply(sink, route, change(route, "d", 30, 6))
    assert apply(sink, route, change(route, "c", 30, 6, product(6, name="again"))) == (1, 0, 0)
    assert docs(sink, route)["6"]["name"] == "again"


def test_a_tombstone_without_its_delete_event_deletes_what_is_stored(
    sink: SearchSink, route: TableRoute
) -> None:
    apply(sink, route, change(route, "c", 10, 7, product(7)))
    assert apply(sink, route, tombstone_only(route, 7)) == (1, 0, 0)
    assert "7" not in docs(sink, route)
    assert apply(sink, route, tombstone_only(route, 8)) == (1, 0, 0)  # nothing stored: done
    assert apply(sink, route, change(route, "c", 5, 7, product(7, name="stale"))) == (0, 1, 0)
    apply(sink, route, change(route, "c", 20, 7, product(7, name="later")))
    assert docs(sink, route)["7"]["name"] == "later"


def test_read_back_returns_every_document_past_the_result_window(sink: SearchSink) -> None:
    """verify reads whole indices: from/size paging stops at index.max_result_window (10,000 by
    default: the 100k soak failed there), so the read-back scrolls."""
    alias = f"readback_window_{sink.backend.__class__.__name__.lower()}"
    if not sink.backend.alias_exists(alias):
        sink.backend.create_index(f"{alias}_v1", {}, {}, alias)
    count = 10_050
    for start in range(0, count, 5000):
        operations: list[dict[str, Any]] = []
        for n in range(start, min(start + 5000, count)):
            operations += [
                {
                    "index": {
                        "_index": alias,
                        "_id": str(n),
                        "version": n + 1,
                        "version_type": "external",
                    }
                },
                {"n": n},
            ]
        sink.backend.bulk(operations)
    held = search_readback.documents(sink.backend, alias)
    assert len(held) == count
    assert held["10049"] == (10_050, {"n": 10_049})


def test_concurrent_writes_share_the_clients_connections(
    sink: SearchSink, route: TableRoute, caplog: pytest.LogCaptureFixture
) -> None:
    # The driver commits tables in parallel through one client: no connection may be opened
    # and thrown away per request.
    def write(key: int) -> tuple[int, int, int]:
        return apply(sink, route, change(route, "c", 10 + key, key, product(key)))

    with caplog.at_level(logging.WARNING, logger="urllib3"), ThreadPoolExecutor(4) as pool:
        assert list(pool.map(write, range(1, 9))) == [(1, 0, 0)] * 8
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]
    assert sorted(docs(sink, route), key=int) == [str(k) for k in range(1, 9)]


class AnswerLost:
    """The real backend, except that the first bulk's answer never reaches the client: the
    server applied it, the client timed out (what a slow server and a 30 s client timeout do)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.bulk_items: list[int] = []  # documents and deletes sent per bulk request

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def bulk(self, operations: list[dict[str, Any]]) -> dict[str, Any]:
        self.bulk_items.append(sum(1 for line in operations if {"index", "delete"} & set(line)))
        answer: dict[str, Any] = self.backend.bulk(operations)
        if len(self.bulk_items) == 1:
            raise opensearchpy.ConnectionTimeout("TIMEOUT", "read timed out", None)
        return answer


def test_a_bulk_without_an_answer_is_not_sent_again_for_what_the_index_holds(
    sink: SearchSink, route: TableRoute
) -> None:
    apply(sink, route, change(route, "c", 10, 5, product(5, name="v10")))
    lost = AnswerLost(sink.backend)
    sink.writer.backend = lost  # type: ignore[assignment]
    sink.writer.sleep = lambda _: None
    batch = [
        change(route, "u", 20, 5, product(5, name="v20")),
        change(route, "c", 20, 6, product(6)),
        change(route, "d", 20, 7),
    ]
    applied, fenced, failed = apply(sink, route, *batch)
    # Resent: only the delete (an absent document does not prove its tombstone was kept).
    assert lost.bulk_items == [3, 1]
    assert (applied, fenced, failed) == (3, 0, 0)
    held = docs(sink, route)
    assert held["5"]["name"] == "v20" and "6" in held and "7" not in held


def test_after_a_lost_answer_an_equal_version_with_other_content_is_sent_again(
    sink: SearchSink, route: TableRoute
) -> None:
    # Two changes of one transaction (one version) in two batches: if the second batch's bulk
    # gets no answer and the index shows the version with the first change's content, the
    # second change was not applied and must be sent.
    apply(sink, route, change(route, "c", 30, 8, product(8, name="first")))

    class NeverApplied(AnswerLost):
        def bulk(self, operations: list[dict[str, Any]]) -> dict[str, Any]:
            self.bulk_items.append(len(operations) // 2)
            if len(self.bulk_items) == 1:
                raise opensearchpy.ConnectionTimeout("TIMEOUT", "read timed out", None)
            return dict(self.backend.bulk(operations))

    lost = NeverApplied(sink.backend)
    sink.writer.backend = lost  # type: ignore[assignment]
    sink.writer.sleep = lambda _: None
    assert apply(sink, route, change(route, "u", 30, 8, product(8, name="second"))) == (1, 0, 0)
    assert lost.bulk_items == [1, 1]
    assert docs(sink, route)["8"]["name"] == "second"


def test_truncate_removes_older_documents_fenced_and_leaves_tombstones(
    sink: SearchSink, route: TableRoute
) -> None:
    """Documents below the truncate's version go (each leaves a delete tombstone, so a stale
    update stays out); a later change applied before the truncate arrived, and its own
    transaction's reload, stay."""
    apply(sink, route, change(route, "c", 10, 1, product(1)), change(route, "c", 20, 2, product(2)))
    apply(sink, route, change(route, "c", 60, 3, product(3)), change(route, "c", 50, 4, product(4)))
    truncate = Truncate(route.table, 50, Coordinates("cdc.shop.products", 0, 9), 55)
    assert sink.truncate(route, truncate) == 2
    assert sorted(docs(sink, route)) == ["3", "4"]
    assert apply(sink, route, change(route, "u", 30, 1, product(1, name="stale"))) == (0, 1, 0)
    assert "1" not in docs(sink, route)
    assert sink.truncate(route, truncate) == 0  # replayed: nothing older is left
    assert apply(sink, route, change(route, "c", 70, 1, product(1, name="new"))) == (1, 0, 0)
