"""Offset arithmetic of the Kafka stream source (no Kafka, no Spark)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_sync.source.offsets import (
    PartitionRange,
    cap_oldest_first,
    cap_total,
    dumps,
    from_offset_json,
    loads,
    oldest_first_floor,
    ranges_between,
    to_offset_json,
)
from cdc_sync.source.options import BACKLOG_ORDER, EARLIEST, LATEST, LOG_RELAY, parse_options

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


def read_in_batches(
    log: dict[tuple[str, int], list[int]], cap: int, oldest_first: bool
) -> list[dict[tuple[str, int], tuple[int, int]]]:
    """Every batch's ranges reading `log` (per partition, its records' timestamps) from the
    start, each batch capped at `cap`, heads read from the log as the source reads them."""
    latest = {tp: len(times) for tp, times in log.items()}
    start = dict.fromkeys(log, 0)
    batches = []
    while start != latest:
        heads = {tp: times[start[tp]] for tp, times in log.items() if start[tp] < len(times)}
        if oldest_first:
            end = cap_oldest_first(start, latest, cap, heads)
        else:
            end = cap_total(start, latest, cap)
        for tp in end:
            assert start[tp] <= end[tp] <= latest[tp]
        backlog = sum(latest[tp] - start[tp] for tp in latest)
        assert sum(end[tp] - start[tp] for tp in end) == min(cap, backlog)
        batches.append({tp: (start[tp], end[tp]) for tp in end if end[tp] > start[tp]})
        start = end
    return batches


@given(
    st.lists(st.integers(0, 400), min_size=1, max_size=6),
    st.integers(1, 500),
    st.randoms(use_true_random=False),
)
def test_oldest_first_reads_a_snapshot_table_by_table_in_the_order_it_was_written(
    sizes: list[int], cap: int, rng: random.Random
) -> None:
    """A snapshot writes its tables one after another (each its own partition here, in an
    order unrelated to their names): read oldest first, a batch reads a table beyond its floor
    only once every table written ahead of it is read whole (in this batch or before), and
    each batch uses the whole cap."""
    order = [("t", i) for i in range(len(sizes))]
    rng.shuffle(order)
    log: dict[tuple[str, int], list[int]] = {}
    clock = 0
    for tp, size in zip(order, sizes, strict=True):
        log[tp] = list(range(clock, clock + size))
        clock += size
    done: set[tuple[str, int]] = {tp for tp in order if not log[tp]}
    for batch in read_in_batches(log, cap, oldest_first=True):
        floor = oldest_first_floor(cap, len([tp for tp in log if tp not in done]))
        done |= {tp for tp, (_, end) in batch.items() if end == len(log[tp])}
        for tp, (begin, end) in batch.items():
            if any(p not in done for p in order[: order.index(tp)]):
                assert end - begin <= floor, (tp, batch)
    assert done == set(log)


@given(
    st.dictionaries(
        topic_partitions, st.lists(st.integers(0, 10**6), max_size=60), min_size=1, max_size=6
    ),
    st.integers(1, 50),
)
def test_oldest_first_reads_interleaved_logs_whole_and_the_oldest_heads_beyond_their_floor(
    logs: dict[tuple[str, int], list[int]], cap: int
) -> None:
    """Partitions written at the same time (each its own timestamps, in order): every record is
    read, in batches that use the whole cap, and a partition read beyond its floor had a next
    record no newer than any partition left with records after its floor (or less)."""
    log = {tp: sorted(times) for tp, times in logs.items()}
    start = dict.fromkeys(log, 0)
    for batch in read_in_batches(log, cap, oldest_first=True):
        heads = {tp: (log[tp][start[tp]], tp) for tp in log if start[tp] < len(log[tp])}
        floor = oldest_first_floor(cap, len(heads))
        beyond = [tp for tp, (begin, end) in batch.items() if end - begin > floor]
        short = [
            tp
            for tp in heads
            if batch.get(tp, (0, 0))[1] - batch.get(tp, (0, 0))[0] <= floor
            and batch.get(tp, (0, start[tp]))[1] < len(log[tp])
        ]
        assert all(heads[tp] <= heads[other] for tp in beyond for other in short), batch
        start |= {tp: end for tp, (_, end) in batch.items()}
    assert start == {tp: len(times) for tp, times in log.items()}


@given(
    st.lists(st.integers(1, 300), min_size=2, max_size=6),
    st.integers(1, 500),
    st.integers(0, 5),
)
def test_oldest_first_moves_every_waiting_partition_whatever_its_clock_says(
    sizes: list[int], cap: int, ahead: int
) -> None:
    """One partition stamped far ahead of the others (a producer's clock) is still read in
    every batch whose cap covers one record of each waiting partition."""
    log = {("t", i): [i] * size for i, size in enumerate(sizes)}
    skewed = ("t", ahead % len(sizes))
    log[skewed] = [10**12] * len(log[skewed])
    start = dict.fromkeys(log, 0)
    for batch in read_in_batches(log, cap, oldest_first=True):
        waiting = [tp for tp in log if start[tp] < len(log[tp])]
        if cap >= len(waiting):
            assert set(batch) == set(waiting), batch
        start |= {tp: end for tp, (_, end) in batch.items()}


def test_oldest_first_puts_partitions_without_a_head_time_last() -> None:
    start = {("a", 0): 0, ("b", 0): 0, ("c", 0): 5}
    latest = {("a", 0): 10, ("b", 0): 10, ("c", 0): 5}
    end = cap_oldest_first(start, latest, 12, {("b", 0): 7})
    assert end == {("a", 0): 2, ("b", 0): 10, ("c", 0): 5}
    assert cap_oldest_first(start, latest, 50, {}) == latest
    with pytest.raises(ValueError, match="maxOffsetsPerTrigger"):
        cap_oldest_first(start, latest, 0, {})


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


def test_backlog_order_defaults_to_proportional_and_names_itself_when_wrong() -> None:
    raw = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t"}
    assert parse_options(raw).backlog_order == "proportional"
    assert parse_options({**raw, BACKLOG_ORDER: "Time"}).backlog_order == "time"
    with pytest.raises(ValueError, match=BACKLOG_ORDER):
        parse_options({**raw, BACKLOG_ORDER: "newest"})


def test_the_log_relay_is_a_host_and_port_and_names_itself_when_wrong() -> None:
    from cdc_sync.source import stream_options
    from cdc_sync.source.builtin import builtin_options

    raw = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t"}
    assert parse_options(raw).log_relay is None
    assert parse_options({**raw, LOG_RELAY.lower(): "127.0.0.1:4100"}).log_relay == (
        "127.0.0.1",
        4100,
    )
    for wrong in ("127.0.0.1", "host:port", ":4100", "h:70000"):
        with pytest.raises(ValueError, match=LOG_RELAY):
            parse_options({**raw, LOG_RELAY: wrong})
    options = stream_options(bootstrap="b:9092", flavor="kafka", topics=["t"], log_relay=("h", 1))
    assert parse_options(options).log_relay == ("h", 1)
    assert LOG_RELAY not in builtin_options(options)  # the Python source's alone
