"""A small batch's ranges are read from the broker at once by the driver (job.batch_phases
`DriverPhases`), and decoded and folded one partition at a time, in range order. A stand-in
reader plays the broker; the read against a real broker is in the integration tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_sync.job.batch_phases import READERS, DriverPhases, SmallBatches, read_pool
from cdc_sync.job.decode.partition import FOLDED_SCHEMA
from cdc_sync.source.offsets import PartitionRange, to_offset_json
from cdc_sync.source.options import KafkaSourceOptions
from cdc_sync.source.python_kafka import ARROW_SCHEMA, Reach
from cdc_sync.source.recent_reads import RecentReads

pytestmark = pytest.mark.unit

OPTIONS = KafkaSourceOptions("127.0.0.1:1", "kafka", ("t",), None, "earliest", None, 1000)
RANGES = [PartitionRange(f"t{n}", 0, 10 * n, 10 * n + 3) for n in range(4)]


def records(span: PartitionRange) -> pa.RecordBatch:
    offsets = list(range(span.start, span.end))
    rows = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([b"k"] * rows, pa.binary()),
            pa.array([b"v"] * rows, pa.binary()),
            pa.array([span.topic] * rows, pa.string()),
            pa.array([span.partition] * rows, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array([None] * rows, ARROW_SCHEMA.field("timestamp").type),
            pa.array([0] * rows, pa.int32()),
        ],
        schema=ARROW_SCHEMA,
    )


def test_the_ranges_are_read_at_once_and_decoded_in_their_order() -> None:
    # Two reads must be at the broker together to pass the barrier: one at a time times out.
    together = threading.Barrier(2, timeout=10)

    def broker(
        options: KafkaSourceOptions, span: PartitionRange, ahead: int, reach: Reach
    ) -> Iterator[pa.RecordBatch]:
        together.wait()
        yield records(span)
        reach.end = span.end

    seen: list[tuple[str, list[int]]] = []

    def decode_fold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(list(batches))
        seen.append((table["topic"][0].as_py(), table["offset"].to_pylist()))
        yield pa.RecordBatch.from_pylist([], schema=FOLDED_SCHEMA)

    phases = DriverPhases(OPTIONS, RANGES, read_pool(), RecentReads(read=broker, ahead=0))
    assert phases.decode(decode_fold) == []
    assert seen == [(span.topic, list(range(span.start, span.end))) for span in RANGES]
    assert len(phases.changes) == len(RANGES)


def test_the_small_batches_of_a_consumer_read_on_the_same_threads(tmp_path: Path) -> None:
    """A batch's own pool started and joined its threads every batch: on a busy driver a
    quarter of a small batch's time (py-spy). The consumer's pool is kept across batches: six
    batches of four ranges each are read on at most READERS threads, not on new ones each."""
    batches = 6
    folder = tmp_path / "offsets"
    folder.mkdir()
    for batch_id in range(batches + 1):
        ends = {(span.topic, span.partition): span.start + 3 * batch_id for span in RANGES}
        (folder / str(batch_id)).write_text(f"v1\n{{}}\n{json.dumps(to_offset_json(ends))}\n")
    threads: list[threading.Thread] = []  # kept alive: a new thread is a new object

    def broker(
        options: KafkaSourceOptions, span: PartitionRange, ahead: int, reach: Reach
    ) -> Iterator[pa.RecordBatch]:
        threads.append(threading.current_thread())
        yield records(span)
        reach.end = span.end

    def nothing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pylist([], schema=FOLDED_SCHEMA)

    small = SmallBatches(OPTIONS, tmp_path, 1000, reads=RecentReads(read=broker, ahead=0))
    for batch_id in range(1, batches + 1):
        phases = small.phases(None, batch_id)  # type: ignore[arg-type]  # a driver batch
        assert isinstance(phases, DriverPhases) and phases.decode(nothing) == []
        phases.close()
    assert len(threads) == batches * len(RANGES)
    assert len(set(threads)) <= READERS
