"""The applied watermark is recorded on its own thread: a batch never waits for the sinks'
watermark writes, observations are evaluated in batch order, only the newest advanced watermark
is written when writes lag, failed writes are retried, and closing flushes."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

import pytest
from confluent_kafka import KafkaError, KafkaException

from cdc_sync.core.model import Change, Truncate
from cdc_sync.job.observe.watermark_rule import WatermarkRule
from cdc_sync.job.observe.watermark_writer import Observation, WatermarkWriter
from cdc_sync.job.observe.watermarks import WatermarkObserver
from cdc_sync.job.settle.applier import BatchMetrics
from cdc_sync.mapping import TableRoute
from cdc_sync.schema import RowSchema
from cdc_sync.sinks.base import WriteResult
from cdc_sync.source.offsets import PartitionOffsets, TopicPartition
from tests.changes import mapping_of, products_route

pytestmark = pytest.mark.unit

PRODUCTS: TopicPartition = ("cdc.shop.products", 0)
# How long a test lets the writer thread catch up: a bound against hanging, never a threshold.
WAIT = 10.0


class GatedSink:
    """Records watermarks; each write waits for `release` (set unless `blocked`) and the first
    `failures` writes raise."""

    name = "search"

    def __init__(self, blocked: bool = False, failures: int = 0) -> None:
        self.positions: list[int] = []
        self.calls = 0
        self.failures = failures
        self.entered = threading.Event()  # a write has started
        self.release = threading.Event()
        if not blocked:
            self.release.set()

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None:
        self.calls += 1
        self.entered.set()
        self.release.wait(WAIT)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("search is down")
        self.positions.append(position)

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        return None

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        return 0

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        return WriteResult()

    def close(self) -> None:
        return None


class Ends:
    """The broker's end offsets, counting reads; `unavailable` reads raise as a timeout would."""

    def __init__(self, ends: PartitionOffsets, unavailable: int = 0) -> None:
        self.ends = ends
        self.unavailable = unavailable
        self.reads = 0
        self.closed = False

    def of(self, topics: Sequence[str]) -> PartitionOffsets:
        self.reads += 1
        if self.unavailable:
            self.unavailable -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return dict(self.ends)

    def close(self) -> None:
        self.closed = True


class SeenRule(WatermarkRule):
    """The rule, noting the candidates in the order it evaluates them."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int | None] = []

    def observe(
        self,
        candidate: int | None,
        processed_ends: Mapping[TopicPartition, int],
        broker_ends: Mapping[TopicPartition, int] | None,
    ) -> int | None:
        self.seen.append(candidate)
        return super().observe(candidate, processed_ends, broker_ends)


def observer_of(sink: GatedSink, ends: Ends) -> WatermarkObserver:
    return WatermarkObserver(mapping_of(products_route()), [sink], ends, None)


def batch(batch_id: int, candidate: int | None) -> BatchMetrics:
    """Batch n read offset n of the one partition (so it is read to the broker's end, n + 1,
    when the ends are {PRODUCTS: n + 1} or lower)."""
    return BatchMetrics(batch_id, offsets={PRODUCTS: batch_id}, commit_bound=candidate)


def test_a_batch_returns_while_the_watermark_write_is_still_blocked() -> None:
    sink, ends = GatedSink(blocked=True), Ends({PRODUCTS: 1})
    observer = observer_of(sink, ends)
    observer(batch(0, 1_000))
    assert sink.entered.wait(WAIT)  # the thread is inside the sink's write, held there
    observer(batch(1, 2_000))  # a synchronous observer would wait on the sink here
    assert sink.calls == 1 and sink.positions == [] and observer.watermark is None
    sink.release.set()
    assert observer.flush(WAIT)
    assert observer.watermark == 2_000
    observer.close()


def test_lagging_writes_evaluate_every_batch_in_order_and_write_only_the_newest() -> None:
    sink, ends = GatedSink(blocked=True), Ends({PRODUCTS: 1})
    observer = observer_of(sink, ends)
    rule = observer.writer.rule = SeenRule()
    observer(batch(0, 1_000))
    assert sink.entered.wait(WAIT)
    # While 1_000 is being written, three more batches advance the watermark.
    for batch_id, candidate in [(1, 2_000), (2, 3_000), (3, None), (4, 4_000)]:
        observer(batch(batch_id, candidate))
    sink.release.set()
    assert observer.flush(WAIT)
    assert rule.seen == [1_000, 2_000, 3_000, None, 4_000]
    assert sink.positions == [1_000, 4_000]  # 2_000 and 3_000 never written: 4_000 covers them
    assert ends.reads == 2  # once per pass: the four waiting batches share one read
    observer.close()


def test_a_failed_write_is_logged_and_retried_with_the_next_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink, ends = GatedSink(failures=1), Ends({PRODUCTS: 1})
    observer = observer_of(sink, ends)
    with caplog.at_level(logging.WARNING, logger="cdc_sync.job.observe.watermark_writer"):
        observer(batch(0, 1_000))
        assert sink.entered.wait(WAIT)  # the first (failing) write has started
        observer(batch(1, None))  # advances nothing, but brings the retry
        assert observer.flush(WAIT)
    assert sink.calls == 2 and sink.positions == [1_000]
    assert "search: recording applied watermark 0/3E8 failed (ConnectionError" in caplog.text
    # The thread lives on: the next advance is written.
    observer(batch(2, 2_000))
    assert observer.flush(WAIT)
    assert sink.positions == [1_000, 2_000] and observer.watermark == 2_000
    observer.close()


def test_a_failed_write_is_retried_on_a_tick_when_no_batch_comes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = GatedSink(failures=2)
    routes = {PRODUCTS[0]: products_route()}
    writer = WatermarkWriter([sink], routes, lambda: {PRODUCTS: 1}, retry_seconds=0.01)
    with caplog.at_level(logging.WARNING, logger="cdc_sync.job.observe.watermark_writer"):
        writer.submit(Observation(0, 1_000, {PRODUCTS: 1}))
        assert writer.flush(WAIT)
    assert sink.calls == 3 and sink.positions == [1_000] and writer.recorded == 1_000
    assert caplog.text.count("recording applied watermark 0/3E8 failed") == 2
    assert writer.close(WAIT)


def test_unavailable_end_offsets_skip_the_candidate_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink, ends = GatedSink(), Ends({PRODUCTS: 1}, unavailable=1)
    observer = observer_of(sink, ends)
    with caplog.at_level(logging.WARNING, logger="cdc_sync.job.observe.watermarks"):
        observer(batch(0, 1_000))
        assert observer.flush(WAIT)
    assert "end offsets unavailable" in caplog.text and sink.positions == []
    observer(batch(1, 2_000))
    assert observer.flush(WAIT)
    assert sink.positions == [2_000]
    observer.close()


def test_close_records_the_pending_watermark_then_closes_the_end_offset_reader() -> None:
    sink, ends = GatedSink(blocked=True), Ends({PRODUCTS: 1})
    observer = observer_of(sink, ends)
    observer(batch(0, 1_000))
    assert sink.entered.wait(WAIT)
    observer(batch(1, 2_000))
    observer(batch(2, 3_000))
    closer = threading.Thread(target=observer.close)
    closer.start()
    assert not ends.closed  # the write is still held: close waits for it
    sink.release.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    assert sink.positions == [1_000, 3_000] and ends.closed
    assert not observer.writer._thread.is_alive()
    observer(batch(3, 4_000))  # a batch racing the stop: dropped, no error
    assert sink.positions == [1_000, 3_000]


def test_close_gives_up_on_a_stuck_sink_and_leaves_the_reader_to_the_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink, ends = GatedSink(blocked=True), Ends({PRODUCTS: 1})
    observer = observer_of(sink, ends)
    observer(batch(0, 1_000))
    assert sink.entered.wait(WAIT)
    with caplog.at_level(logging.WARNING, logger="cdc_sync.job.observe.watermark_writer"):
        observer.close(timeout_seconds=0.01)
    assert "applied watermark 0/3E8 not recorded in every sink" in caplog.text
    assert not ends.closed  # the thread may still read it
    sink.release.set()  # let the thread finish
