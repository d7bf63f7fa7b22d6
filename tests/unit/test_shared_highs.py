"""High watermarks asked of the broker once for every planner of the machine
(source.shared_highs): each consumer's planner is a process of its own."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from cdc_sync.source.offsets import PartitionOffsets, TopicPartition
from cdc_sync.source.options import SHARED_HIGHS, parse_options
from cdc_sync.source.shared_highs import SharedHighs

pytestmark = pytest.mark.unit

PARTITIONS = [("cdc.shop.orders", 0), ("cdc.shop.customers", 0)]


class Broker:
    def __init__(self, high: int = 10) -> None:
        self.high = high
        self.asked: list[list[TopicPartition]] = []

    def __call__(self, partitions: Sequence[TopicPartition]) -> PartitionOffsets:
        self.asked.append(list(partitions))
        return {tp: self.high for tp in partitions}


def test_a_planner_plans_with_the_highs_another_asked_for_a_moment_ago(tmp_path: Path) -> None:
    broker = Broker()
    first, second = (SharedHighs("b:9092", 10_000, tmp_path) for _ in range(2))
    assert first.highs(PARTITIONS, broker) == {tp: 10 for tp in PARTITIONS}
    broker.high = 12
    assert second.highs(PARTITIONS, broker) == {tp: 10 for tp in PARTITIONS}
    assert len(broker.asked) == 1


def test_a_planner_never_plans_twice_with_one_read(tmp_path: Path) -> None:
    """The next trigger comes within the limit; the read of the last one would hold back
    what arrived since (batches every second trigger)."""
    broker = Broker()
    first, second = (SharedHighs("b:9092", 10_000, tmp_path) for _ in range(2))
    first.highs(PARTITIONS, broker)
    second.highs(PARTITIONS, broker)
    broker.high = 12  # the next trigger
    assert first.highs(PARTITIONS, broker) == {tp: 12 for tp in PARTITIONS}
    broker.high = 14
    assert second.highs(PARTITIONS, broker) == {tp: 12 for tp in PARTITIONS}  # first's, newer
    assert len(broker.asked) == 2
    assert second.highs(PARTITIONS, broker) == {tp: 14 for tp in PARTITIONS}
    assert len(broker.asked) == 3


def test_highs_older_than_the_limit_are_asked_again(tmp_path: Path) -> None:
    broker = Broker()
    shared = SharedHighs("b:9092", 50, tmp_path)
    shared.highs(PARTITIONS, broker)
    time.sleep(0.1)
    broker.high = 12
    assert shared.highs(PARTITIONS, broker) == {tp: 12 for tp in PARTITIONS}
    assert len(broker.asked) == 2


def test_a_partition_the_others_did_not_ask_for_is_asked(tmp_path: Path) -> None:
    broker = Broker()
    shared = SharedHighs("b:9092", 10_000, tmp_path)
    shared.highs(PARTITIONS[:1], broker)
    assert shared.highs(PARTITIONS, broker) == {tp: 10 for tp in PARTITIONS}
    assert broker.asked[-1] == PARTITIONS


def test_other_brokers_and_a_zero_limit_share_nothing(tmp_path: Path) -> None:
    broker = Broker()
    SharedHighs("a:9092", 10_000, tmp_path).highs(PARTITIONS, broker)
    SharedHighs("b:9092", 10_000, tmp_path).highs(PARTITIONS, broker)
    SharedHighs("b:9092", 0, tmp_path).highs(PARTITIONS, broker)
    assert len(broker.asked) == 3


def _plan(directory: str, asked_log: str) -> dict[str, int]:
    def ask(partitions: Sequence[TopicPartition]) -> PartitionOffsets:
        with open(asked_log, "a") as log:
            log.write("asked\n")
        time.sleep(0.3)  # a busy broker: the others arrive while this one asks
        return {tp: 7 for tp in partitions}

    highs = SharedHighs("b:9092", 10_000, Path(directory)).highs(PARTITIONS, ask)
    return {f"{t}:{p}": h for (t, p), h in highs.items()}


def test_planner_processes_asking_at_once_wait_for_one_answer(tmp_path: Path) -> None:
    asked_log = tmp_path / "asked"
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        answers = pool.starmap(_plan, [(str(tmp_path), str(asked_log))] * 4)
    assert answers == [{"cdc.shop.orders:0": 7, "cdc.shop.customers:0": 7}] * 4
    assert asked_log.read_text().count("asked") == 1


@pytest.mark.parametrize(
    ("flavor", "given", "expected"),
    [("tansu", None, 250), ("kafka", None, 0), ("noida", None, 0), ("kafka", "100", 100),
     ("tansu", "0", 0)],
)  # fmt: skip
def test_the_limit_defaults_by_broker_and_can_be_set(
    flavor: str, given: str | None, expected: int
) -> None:
    raw = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "cdc.kafka.flavor": flavor}
    if given is not None:
        raw[SHARED_HIGHS] = given
    assert parse_options(raw).shared_highs_ms == expected


def test_a_bad_limit_names_the_option() -> None:
    raw = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", SHARED_HIGHS: "-1"}
    with pytest.raises(ValueError, match=SHARED_HIGHS):
        parse_options(raw)
