"""Document indices built behind their alias on a real search server (osmem-server locally): a
new state (a new checkpoint) replaying beside an index it did not write, with a spec changed on
the way, leaves readers on the old index until it has caught up, then moves the alias to a new
index made with the new mapping."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_sync.documents.sync import DocumentSync
from cdc_sync.sinks.search import SearchSink
from cdc_sync.sinks.search import readback as search_readback
from tests.unit.test_document_lifecycle import LOG, order
from tests.unit.test_documents import MAPPING, SCHEMAS_BY_TABLE, folded, load

pytestmark = pytest.mark.integration


@pytest.fixture
def sink(search_url: str) -> Iterator[SearchSink]:
    sink = SearchSink("opensearch", search_url, tombstone_retention_seconds=3600)
    yield sink
    sink.close()


def held(sink: SearchSink, alias: str) -> dict[str, dict[str, Any]]:
    return {i: doc for i, (_, doc) in search_readback.documents(sink.backend, alias).items()}


def test_a_new_state_builds_behind_the_alias_with_the_new_mapping(
    sink: SearchSink, tmp_path: Path
) -> None:
    alias = f"docs_{uuid.uuid4().hex[:8]}"
    text = MAPPING.replace("index: order_docs", f"index: {alias}")
    as_object = text.replace("        type: nested\n", "")
    old = DocumentSync(load(tmp_path, as_object), tmp_path / "old.sqlite", sink)
    old.ensure_targets(SCHEMAS_BY_TABLE)
    old.apply([], folded(LOG))
    old.close()
    before = held(sink, alias)
    assert set(before) == {"1", "2"} and len(before["1"]["lines"]) == 1
    assert search_readback.field_types(sink.backend, alias)["lines"] == "object"

    new = DocumentSync(load(tmp_path, text), tmp_path / "new.sqlite", sink, full_batch=2)
    new.ensure_targets(SCHEMAS_BY_TABLE)
    for start in (0, 2):  # full batches: the replay goes on
        new.apply([], folded(LOG[start : start + 2]), records=2)
        assert held(sink, alias) == before
        assert sorted(sink.backend.mappings(alias)) == [f"{alias}_v1"]
    assert sink.index_exists(f"{alias}_v2")  # the build's, not behind the alias yet
    new.apply([], folded(LOG[4:]), records=1)  # caught up
    assert sorted(sink.backend.mappings(alias)) == [f"{alias}_v2"]
    assert not sink.index_exists(f"{alias}_v1")
    assert held(sink, alias) == before
    assert search_readback.field_types(sink.backend, alias)["lines"] == "nested"
    # From here on the new state writes through the alias, fenced as ever.
    new.apply([], folded([order(2, status="paid", version=500)]), records=1)
    assert held(sink, alias)["2"]["status"] == "paid"
    new.close()
