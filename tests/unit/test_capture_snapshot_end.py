"""The capture's readiness looks for the snapshot's end in each published record with a byte
search first (`SNAPSHOT_END`), and parses only the records it matches: it must match every
record whose envelope ends the snapshot, whatever its rows hold and however it is spaced."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_sync.connectors.engine import SNAPSHOT_END
from cdc_sync.connectors.partitioner import partition_for

pytestmark = pytest.mark.unit

SNAPSHOT_VALUES = ("true", "first", "first_in_data_collection", "last_in_data_collection",
                   "last", "false", "incremental")  # fmt: skip
row_values = st.one_of(st.text(), st.integers(), st.none(), st.just('"snapshot":"last"'))


def ends_snapshot(value: bytes) -> bool:
    doc: Any = json.loads(value)
    return doc.get("payload", doc).get("source", {}).get("snapshot") in ("last", "false")


@given(
    st.sampled_from(SNAPSHOT_VALUES),
    st.dictionaries(st.sampled_from(["id", "name", "snapshot", "source"]), row_values),
    st.booleans(),
    st.booleans(),
)
def test_every_record_that_ends_the_snapshot_matches_the_byte_search(
    snapshot: str, row: dict[str, Any], with_schema: bool, spaced: bool
) -> None:
    envelope = {"after": row, "op": "r", "source": {"snapshot": snapshot, "table": "t"}}
    document = {"schema": {"type": "struct", "field": "snapshot"}, "payload": envelope}
    separators = (", ", ": ") if spaced else (",", ":")
    value = json.dumps(document if with_schema else envelope, separators=separators).encode()
    if ends_snapshot(value):
        assert SNAPSHOT_END.search(value)
    if snapshot in ("last", "false"):
        assert ends_snapshot(value)


@given(st.binary(max_size=64))
def test_a_topic_of_one_partition_takes_every_key_without_a_hash(key: bytes) -> None:
    assert partition_for(key, 1) == 0
