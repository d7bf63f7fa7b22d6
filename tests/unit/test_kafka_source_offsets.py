"""Offset arithmetic of the Kafka stream source (no Kafka, no Spark)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_sync.source.offsets import (
    PartitionRange,
    cap_total,
    dumps,
    from_offset_json,
    loads,
    ranges_between,
    to_offset_json,
)
from cdc_sync.source.options import EARLIEST, LATEST, parse_options

pytestmark = pytest.mark.unit

topic_partitions = st.tuples(
    st.text(alphabet="abcxyz._-", min_size=1, max_size=8), st.integers(0, 20)
)
offset_maps = st.dictionaries(topic_partitions, st.integers(0, 10**12), max_size=12)


def test_offset_json_has_spark_kafka_shape() -> None:
    offsets = {("orders", 1): 7, ("orders", 0): 42, ("customers", 0): 3}
    assert json.loads(dumps(offsets)) == {"customers": {"0": 3}, "orders": {"0": 42, "1": 7}}
    # Canonical text: Spark compares offsets by their JSON, so order must not depend on input.
    assert dumps(offsets) == dumps(dict(reversed(list(offsets.items()))))
    assert dumps({("t", 10): 1, ("t", 2): 1}) == '{"t": {"2": 1, "10": 1}}'


@given(offset_maps)
def test_offset_json_round_trips(offsets: dict[tuple[str, int], int]) -> None:
    assert loads(dumps(offsets)) == offsets
    assert from_offset_json(to_offset_json(offsets)) == offsets


def test_offset_json_rejects_flat_maps() -> None:
    with pytest.raises(ValueError, match="topic 'orders'"):
        from_offset_json({"orders": 5})  # type: ignore[dict-item]


def test_ranges_skip_empty_and_start_new_partitions_at_zero() -> None:
    start = {("a", 0): 5, ("a", 1): 9, ("b", 0): 3}
    end = {("a", 0): 8, ("a", 1): 9, ("b", 0): 3, ("c", 0): 4, ("c", 1): 0}
    assert ranges_between(start, end) == [
        PartitionRange("a", 0, 5, 8),
        PartitionRange("c", 0, 0, 4),
    ]
    assert ranges_between(end, end) == []


@given(offset_maps, st.integers(1, 10_000), st.data())
def test_cap_total_respects_cap_and_progresses(
    start: dict[tuple[str, int], int], cap: int, data: st.DataObject
) -> None:
    latest = {tp: offset + data.draw(st.integers(0, 5_000)) for tp, offset in start.items()}
    end = cap_total(start, latest, cap)
    assert set(end) == set(latest)
    backlog = sum(latest[tp] - start[tp] for tp in latest)
    read = sum(end[tp] - start[tp] for tp in end)
    for tp in end:
        assert start[tp] <= end[tp] <= latest[tp]
    # Uses the whole cap when there is that much to read, otherwise reads everything.
    assert read == min(cap, backlog)


def test_cap_total_spreads_in_proportion_to_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("u", 0): 0}
    latest = {("t", 0): 300, ("t", 1): 200, ("u", 0): 0}
    assert cap_total(start, latest, 40) == {("t", 0): 30, ("t", 1): 110, ("u", 0): 0}


def test_cap_total_counts_new_partitions_from_zero_and_rounds_fairly() -> None:
    latest = {("new", 0): 1, ("new", 1): 1, ("new", 2): 1}
    end = cap_total({}, latest, 2)
    assert sum(end.values()) == 2
    assert all(offset in (0, 1) for offset in end.values())


def test_cap_total_rejects_non_positive_cap() -> None:
    with pytest.raises(ValueError, match="maxOffsetsPerTrigger"):
        cap_total({}, {("t", 0): 1}, 0)


def test_options_arrive_lower_cased_and_are_validated() -> None:
    options = parse_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "cdc.kafka.flavor": "tansu",
            "subscribepattern": r"shop\..*",
            "maxoffsetspertrigger": "500",
            "startingoffsets": '{"shop.orders": {"0": -2, "1": -1, "2": 17}}',
            "kafka.security.protocol": "PLAINTEXT",
        }
    )
    assert options.flavor == "tansu"
    assert options.max_offsets_per_trigger == 500
    assert options.starting == {
        ("shop.orders", 0): EARLIEST,
        ("shop.orders", 1): LATEST,
        ("shop.orders", 2): 17,
    }
    assert options.consumer_overrides == (("security.protocol", "PLAINTEXT"),)
    assert options.matches("shop.orders")
    assert not options.matches("__shop.offsets")
    assert not options.matches("other.shop.orders")


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"subscribe": "t"}, "kafka.bootstrap.servers"),
        ({"kafka.bootstrap.servers": "h:1"}, "subscribePattern"),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "subscribepattern": "t"},
            "subscribe",
        ),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "cdc.kafka.flavor": "x"}, "flavor"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "maxoffsetspertrigger": "0"}, "max"),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", "startingoffsets": "[1]"},
            "starting",
        ),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "typo": "1"}, "known options"),
    ],
)
def test_invalid_options_name_the_setting(raw: dict[str, str], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        parse_options(raw)


def test_builtin_options_map_the_same_stream() -> None:
    from cdc_sync.source import stream_options
    from cdc_sync.source.builtin import builtin_options

    options = stream_options(
        bootstrap="127.0.0.1:9092", flavor="tansu", pattern=r"shop\..*", max_offsets_per_trigger=9
    )
    mapped = builtin_options(options)
    assert mapped["kafka.bootstrap.servers"] == "127.0.0.1:9092"
    assert mapped["subscribePattern"] == r"shop\..*"
    assert mapped["maxOffsetsPerTrigger"] == "9"
    assert mapped["startingOffsets"] == "earliest"
    assert mapped["kafka.isolation.level"] == "read_committed"
    # Passed through with the built-in source's own default (true) unless the job says otherwise.
    assert mapped["failOnDataLoss"] == "true"
    lenient = stream_options(
        bootstrap="127.0.0.1:9092", flavor="kafka", topics=["t"], fail_on_data_loss=False
    )
    assert builtin_options(lenient)["failOnDataLoss"] == "false"
    # Settings the built-in source refuses or that only cdc_kafka understands are not passed.
    assert not {"cdc.kafka.flavor", "kafka.group.id", "kafka.auto.offset.reset"} & set(mapped)
