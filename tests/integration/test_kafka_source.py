"""The Kafka stream source against a real broker and a real local Spark session."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable

from cdc_sync.core.kafka_clients import admin_config, consumer_config, producer_config
from cdc_sync.job.batch_phases import SmallBatches
from cdc_sync.job.consumer_job import job_stream
from cdc_sync.job.runner import JobOptions
from cdc_sync.job.write.health import SinkHealth
from cdc_sync.job.write.health_relay import HealthRelay
from cdc_sync.source import kafka_stream, python_kafka, python_stream, stream_options
from cdc_sync.source.builtin import builtin_kafka_available
from cdc_sync.source.data_loss import DataLossError
from cdc_sync.source.offsets import PartitionRange
from cdc_sync.source.options import FETCH_TIMEOUT, KafkaSourceOptions, parse_options
from cdc_sync.source.python_kafka import (
    KAFKA_SCHEMA,
    CdcKafkaStreamReader,
    KafkaRangeUnreachable,
    Reach,
    consume_checked_range,
    consume_range,
    read_range_arrow,
)
from cdc_sync.source.recent_reads import RecentReads

pytestmark = pytest.mark.integration

Coordinate = tuple[str, int, int]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    shared = SparkSession.getActiveSession()  # the e2e session, when those tests ran first
    session = (
        SparkSession.builder.master("local[2]")
        .appName("test_kafka_source")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    if shared is None:  # stop only a session this module started
        session.stop()


def create_topics(bootstrap: str, names: list[str], partitions: int = 2) -> None:
    admin = AdminClient(admin_config(bootstrap))
    futures = admin.create_topics([NewTopic(name, partitions, 1) for name in names])
    for future in futures.values():
        future.result(timeout=30)


def produce(kafka: Any, records: list[tuple[str, int, bytes, bytes]]) -> None:
    producer = Producer(producer_config(kafka.bootstrap, kafka.flavor))
    for topic, partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0, "records left unsent"


def keyed_records(topics: list[str], count: int, tag: str) -> list[tuple[str, int, bytes, bytes]]:
    return [
        (
            topics[i % len(topics)],
            (i // len(topics)) % 2,
            f"{tag}-k{i}".encode(),
            bytes([i % 256]) * (i % 7) + f"{tag}-v{i}".encode(),
        )
        for i in range(count)
    ]


class Collector:
    """foreachBatch target: remembers every row and the size of every micro-batch."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, int, bytes, bytes]] = []
        self.batch_sizes: list[int] = []

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        self.batch_sizes.append(len(rows))
        self.rows.extend((r.topic, r.partition, r.offset, r.key, r.value) for r in rows)

    def coordinates(self) -> list[Coordinate]:
        return [(topic, partition, offset) for topic, partition, offset, _, _ in self.rows]


def one_partition(
    records: list[tuple[str, int, bytes, bytes]],
) -> list[tuple[str, int, bytes, bytes]]:
    return [(topic, 0, key, value) for topic, _, key, value in records]


def one_partition_topic(
    kafka: Any, tag: str, count: int, fail_on_data_loss: bool = True
) -> tuple[str, list[tuple[str, int, bytes, bytes]], KafkaSourceOptions]:
    """A new one-partition topic holding `count` records: its name, records and source options."""
    topic = f"{tag}{uuid.uuid4().hex[:8]}"
    create_topics(kafka.bootstrap, [topic], partitions=1)
    records = one_partition(keyed_records([topic], count, tag))
    produce(kafka, records)
    options = parse_options(
        stream_options(
            bootstrap=kafka.bootstrap,
            flavor=kafka.flavor,
            topics=[topic],
            fail_on_data_loss=fail_on_data_loss,
        )
    )
    return topic, records, options


def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient(admin_config(bootstrap))
    for future in admin.delete_topics(names).values():
        future.result(timeout=30)


def run_failing(stream: DataFrame, checkpoint: Path) -> str:
    """Run an availableNow query that must fail; its error message."""
    query = (
        stream.writeStream.foreachBatch(Collector())
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(timeout=240)
    except StreamingQueryException as error:
        return str(error)
    raise AssertionError(f"the query did not fail (active: {query.isActive})")


def run_available_now(stream: DataFrame, checkpoint: Path) -> Collector:
    collector = Collector()
    query = (
        stream.writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=240)
    assert not query.isActive, "availableNow query did not finish in 240 s"
    assert query.exception() is None, query.exception()
    return collector


def expected_coordinates(
    records: list[tuple[str, int, bytes, bytes]], base: dict[tuple[str, int], int]
) -> dict[Coordinate, tuple[bytes, bytes]]:
    """Offsets the broker assigns: consecutive per partition, from ``base`` (default 0)."""
    next_offset = dict(base)
    expected = {}
    for topic, partition, key, value in records:
        offset = next_offset.get((topic, partition), 0)
        next_offset[(topic, partition)] = offset + 1
        expected[(topic, partition, offset)] = (key, value)
    return expected


def assert_exactly(collector: Collector, expected: dict[Coordinate, tuple[bytes, bytes]]) -> None:
    coordinates = collector.coordinates()
    assert len(coordinates) == len(set(coordinates)), "a record was delivered twice"
    assert set(coordinates) == set(expected)
    for topic, partition, offset, key, value in collector.rows:
        assert (key, value) == expected[(topic, partition, offset)]


def test_schema_matches_the_builtin_kafka_source(spark: SparkSession, kafka: Any) -> None:
    stream = kafka_stream(spark, bootstrap=kafka.bootstrap, flavor=kafka.flavor, topics=["absent"])
    assert stream.isStreaming
    assert stream.schema.simpleString() == KAFKA_SCHEMA.simpleString()
    assert KAFKA_SCHEMA.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )


def test_pattern_stream_reads_each_record_once_and_resumes_from_checkpoint(
    spark: SparkSession, kafka: Any, tmp_path: Path
) -> None:
    prefix = f"src{uuid.uuid4().hex[:8]}"
    topics = [f"{prefix}.orders", f"{prefix}.customers"]
    create_topics(kafka.bootstrap, [*topics, f"other{prefix}"])
    first = keyed_records(topics, 60, "first")
    produce(kafka, [*first, (f"other{prefix}", 0, b"x", b"not matched")])

    def stream() -> DataFrame:
        return kafka_stream(
            spark,
            bootstrap=kafka.bootstrap,
            flavor=kafka.flavor,
            pattern=re.escape(prefix) + r"\..*",
        )

    checkpoint = tmp_path / "checkpoint"
    collected = run_available_now(stream(), checkpoint)
    assert_exactly(collected, expected_coordinates(first, {}))
    assert {row[0] for row in collected.rows} == set(topics)

    # More records, and a topic created after the first run that matches the pattern.
    late_topic = f"{prefix}.products"
    create_topics(kafka.bootstrap, [late_topic])
    second = keyed_records([*topics, late_topic], 30, "second")
    produce(kafka, second)

    base = {(t, p): 15 for t in topics for p in (0, 1)}
    resumed = run_available_now(stream(), checkpoint)
    assert_exactly(resumed, expected_coordinates(second, base))
    assert any(row[0] == late_topic and row[2] == 0 for row in resumed.rows)

    # Nothing new: a third run from the same checkpoint reads nothing.
    assert run_available_now(stream(), checkpoint).rows == []


def test_max_offsets_per_trigger_spreads_reading_over_several_batches(
    spark: SparkSession, kafka: Any, tmp_path: Path
) -> None:
    topics = [f"cap{uuid.uuid4().hex[:8]}.a", f"cap{uuid.uuid4().hex[:8]}.b"]
    create_topics(kafka.bootstrap, topics)
    records = keyed_records(topics, 50, "capped")
    produce(kafka, records)

    stream = kafka_stream(
        spark,
        bootstrap=kafka.bootstrap,
        flavor=kafka.flavor,
        topics=topics,
        max_offsets_per_trigger=12,
    )
    collected = run_available_now(stream, tmp_path / "checkpoint")
    assert_exactly(collected, expected_coordinates(records, {}))
    non_empty = [size for size in collected.batch_sizes if size]
    assert len(non_empty) >= 5, collected.batch_sizes
    assert max(non_empty) <= 12, collected.batch_sizes


def test_python_source_is_used_when_the_builtin_jar_is_missing(
    spark: SparkSession, kafka: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"py{uuid.uuid4().hex[:8]}"
    create_topics(kafka.bootstrap, [topic])
    records = keyed_records([topic], 10, "py")
    produce(kafka, records)
    # Explicitly through the Python data source, whatever the classpath holds.
    options = stream_options(bootstrap=kafka.bootstrap, flavor=kafka.flavor, topics=[topic])
    collected = run_available_now(python_stream(spark, options), tmp_path / "checkpoint")
    assert_exactly(collected, expected_coordinates(records, {}))
    if not builtin_kafka_available(spark):
        # kafka_stream must then pick the Python source, and say so.
        with caplog.at_level(logging.INFO, logger="cdc_sync.source"):
            stream = kafka_stream(
                spark, bootstrap=kafka.bootstrap, flavor=kafka.flavor, topics=[topic]
            )
        assert "cdc_kafka Python data source" in caplog.text
        assert_exactly(
            run_available_now(stream, tmp_path / "auto"), expected_coordinates(records, {})
        )


@pytest.mark.parametrize("consume", [consume_range, consume_checked_range])
def test_unreachable_range_fails_naming_topic_partition_offset(
    kafka: Any, consume: Callable[..., Iterator[Any]]
) -> None:
    topic = f"gone{uuid.uuid4().hex[:8]}"
    create_topics(kafka.bootstrap, [topic], partitions=1)
    produce(kafka, [(topic, 0, b"k", b"v")] * 3)
    options = parse_options(
        {
            "kafka.bootstrap.servers": kafka.bootstrap,
            "cdc.kafka.flavor": kafka.flavor,
            "subscribe": topic,
            FETCH_TIMEOUT: "1500",
        }
    )
    # Offsets 0-2 exist; 3-9 were planned but never written (as after a topic re-creation).
    read = consume(options, PartitionRange(topic, 0, 0, 10))
    with pytest.raises(KafkaRangeUnreachable, match=rf"topic '{topic}' partition 0: offset 3"):
        list(read)


def test_builtin_kafka_source_reads_each_record_once_when_its_jar_is_present(
    spark: SparkSession, kafka: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if not builtin_kafka_available(spark):
        pytest.skip(
            "built-in kafka source: the org.apache.spark:spark-sql-kafka-0-10_2.13 jar is not "
            "on Spark's classpath (set CDC_SYNC_SPARK_PACKAGES with Maven access)"
        )
    topic = f"bi{uuid.uuid4().hex[:8]}"
    create_topics(kafka.bootstrap, [topic])
    records = keyed_records([topic], 10, "bi")
    produce(kafka, records)
    with caplog.at_level(logging.INFO, logger="cdc_sync.source"):
        stream = kafka_stream(spark, bootstrap=kafka.bootstrap, flavor=kafka.flavor, topics=[topic])
    assert "cdc_kafka Python data source" not in caplog.text
    collected = run_available_now(stream, tmp_path / "checkpoint")
    assert_exactly(collected, expected_coordinates(records, {}))


def test_recreated_topic_fails_the_restarted_job_naming_partition_and_offsets(
    spark: SparkSession, kafka: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"reset{uuid.uuid4().hex[:8]}"
    create_topics(kafka.bootstrap, [topic], partitions=1)
    produce(kafka, one_partition(keyed_records([topic], 10, "old")))
    strict = JobOptions(checkpoint_dir=tmp_path / "checkpoint", warehouse=tmp_path / "warehouse")
    relay = HealthRelay(SinkHealth())  # the job's: where the source's worker processes log

    def stream(options: JobOptions) -> DataFrame:
        return job_stream(
            spark,
            options,
            bootstrap=kafka.bootstrap,
            flavor=kafka.flavor,
            topics=[topic],
            log_relay=relay.address,
        )

    assert len(run_available_now(stream(strict), strict.checkpoint_dir).rows) == 10

    # The topic is re-created (as after a broker reset): its offsets start again at 0.
    delete_topics(kafka.bootstrap, [topic])
    create_topics(kafka.bootstrap, [topic], partitions=1)
    fresh = one_partition(keyed_records([topic], 3, "new"))
    produce(kafka, fresh)

    message = run_failing(stream(strict), strict.checkpoint_dir)
    assert f"topic '{topic}' partition 0: checkpoint offset 10 is past the partition's end" in (
        message
    )
    assert "low watermark 0, high watermark 3" in message
    assert "--checkpoint" in message and "--no-fail-on-data-loss" in message

    # failOnDataLoss=false on the same checkpoint: continues at 0 and reads the new records,
    # and the planner's warning, written in Spark's worker process, reaches the job's log.
    lenient = replace(strict, fail_on_data_loss=False)
    with caplog.at_level(logging.WARNING, logger="cdc_sync.source"):
        resumed = run_available_now(stream(lenient), lenient.checkpoint_dir)
    assert_exactly(resumed, expected_coordinates(fresh, {}))
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.name == "cdc_sync.source.data_loss" and r.levelno == logging.WARNING
    ]
    assert warned, "the planner's data-loss warning never reached the job's log"
    assert f"failOnDataLoss=false: topic '{topic}' partition 0" in warned[0]
    assert "continuing from offset 0" in warned[0]
    assert f":{os.getpid()})" not in warned[0]  # named after the worker that wrote it
    assert run_available_now(stream(strict), strict.checkpoint_dir).rows == []
    relay.close()


def test_checkpoint_below_the_retained_offsets_fails_or_continues(
    spark: SparkSession, kafka: Any, tmp_path: Path
) -> None:
    if kafka.flavor == "tansu":
        pytest.skip("Tansu does not implement DeleteRecords (run with CDC_SYNC_TEST_BROKER=noida)")
    topic = f"retained{uuid.uuid4().hex[:8]}"
    create_topics(kafka.bootstrap, [topic], partitions=1)
    records = one_partition(keyed_records([topic], 10, "r"))
    produce(kafka, records[:4])
    strict = JobOptions(checkpoint_dir=tmp_path / "checkpoint", warehouse=tmp_path / "warehouse")

    def stream(options: JobOptions) -> DataFrame:
        return job_stream(
            spark, options, bootstrap=kafka.bootstrap, flavor=kafka.flavor, topics=[topic]
        )

    assert len(run_available_now(stream(strict), strict.checkpoint_dir).rows) == 4
    produce(kafka, records[4:])
    # Retention removes offsets 4-6 before the job reads them.
    admin = AdminClient(admin_config(kafka.bootstrap))
    for future in admin.delete_records([KafkaTopicPartition(topic, 0, 7)]).values():
        future.result(timeout=30)

    message = run_failing(stream(strict), strict.checkpoint_dir)
    assert f"topic '{topic}' partition 0: checkpoint offset 4 is below" in message
    assert "low watermark 7, high watermark 10" in message

    lenient = replace(strict, fail_on_data_loss=False)
    resumed = run_available_now(stream(lenient), lenient.checkpoint_dir)
    assert resumed.coordinates() == [(topic, 0, 7), (topic, 0, 8), (topic, 0, 9)]


def test_a_backlog_drains_in_bounded_batches_under_the_job_options(
    spark: SparkSession, kafka: Any, tmp_path: Path
) -> None:
    topic = f"backlog{uuid.uuid4().hex[:8]}"
    create_topics(kafka.bootstrap, [topic])
    records = keyed_records([topic], 30, "b")  # 15 per partition: three batches of 10
    produce(kafka, records)
    defaults = JobOptions(checkpoint_dir=tmp_path / "checkpoint", warehouse=tmp_path / "w")
    assert defaults.max_offsets_per_trigger is not None  # bounded unless asked otherwise
    options = replace(defaults, max_offsets_per_trigger=10)
    stream = job_stream(
        spark, options, bootstrap=kafka.bootstrap, flavor=kafka.flavor, topics=[topic]
    )
    collected = run_available_now(stream, options.checkpoint_dir)
    assert_exactly(collected, expected_coordinates(records, {}))
    assert [size for size in collected.batch_sizes if size] == [10, 10, 10]


def test_the_driver_reads_a_recreated_topic_from_its_start_when_told_to_continue(
    kafka: Any, tmp_path: Path
) -> None:
    """Small batches run on the driver, which reads their ranges itself (job.batch_phases). A
    topic re-created below the checkpoint under failOnDataLoss=false is planned from its low
    watermark: the driver reads the new records from there too, as the source's tasks do."""
    topic = f"recreated{uuid.uuid4().hex[:8]}"
    create_topics(kafka.bootstrap, [topic], partitions=1)
    produce(kafka, one_partition(keyed_records([topic], 10, "old")))
    delete_topics(kafka.bootstrap, [topic])
    create_topics(kafka.bootstrap, [topic], partitions=1)
    fresh = one_partition(keyed_records([topic], 3, "new"))
    produce(kafka, fresh)
    options = parse_options(
        stream_options(
            bootstrap=kafka.bootstrap, flavor=kafka.flavor, topics=[topic], fail_on_data_loss=False
        )
    )
    checkpoint = {topic: {"0": 10}}  # the old topic read to its end
    planner = CdcKafkaStreamReader(options)
    try:
        end = planner.latestOffset(checkpoint, ReadAllAvailable())
    finally:
        planner.stop()
    assert end == {topic: {"0": 3}}
    log = tmp_path / "offsets"
    log.mkdir()
    for batch_id, ends in enumerate([checkpoint, end]):
        (log / str(batch_id)).write_text(f"v1\n{{}}\n{json.dumps(ends)}\n")
    ranges = SmallBatches(options, tmp_path, 1000)._ranges(1)
    assert ranges == [PartitionRange(topic, 0, 0, 3)]
    read = [
        row for span in ranges for b in read_range_arrow(options, span) for row in b.to_pylist()
    ]
    assert [row["key"] for row in read] == [key for _, _, key, _ in fresh]


def planned_end(
    kafka: Any, topics: list[str], start: dict[str, dict[str, int]], **options: Any
) -> Any:
    """The end offsets a planner of `topics` plans for the batch from `start`, under its own
    read limit (`options`: `stream_options`')."""
    planner = CdcKafkaStreamReader(
        parse_options(
            stream_options(bootstrap=kafka.bootstrap, flavor=kafka.flavor, topics=topics, **options)
        )
    )
    try:
        return planner.latestOffset(start, planner.getDefaultReadLimit())
    finally:
        planner.stop()


def test_a_vanished_topic_is_forgotten_when_told_to_continue_and_read_from_its_start_later(
    kafka: Any,
) -> None:
    """Topics re-created by a new snapshot, one of them for a table without rows: Debezium
    makes no topic for it. Under failOnDataLoss=false its old offsets leave the plan (kept,
    they would fail the next strict start as stale, and its first new records as lost); when
    the topic exists again it is read from its start (the soak of 2026-11-29 found this)."""
    kept, vanished = (f"{name}{uuid.uuid4().hex[:8]}" for name in ("kept", "vanished"))
    create_topics(kafka.bootstrap, [kept], partitions=1)
    fresh = one_partition(keyed_records([kept], 3, "new"))
    produce(kafka, fresh)
    checkpoint = {kept: {"0": 10}, vanished: {"0": 5}}  # both read before the re-creation

    def plan(start: dict[str, dict[str, int]], fail_on_data_loss: bool) -> Any:
        return planned_end(kafka, [kept, vanished], start, fail_on_data_loss=fail_on_data_loss)

    # Strict: a vanished topic stops advancing (and is checked when it is back).
    at_end = {kept: {"0": 3}, vanished: {"0": 5}}
    assert plan(at_end, fail_on_data_loss=True) == at_end
    lenient = plan(checkpoint, fail_on_data_loss=False)
    assert lenient == {kept: {"0": 3}}
    create_topics(kafka.bootstrap, [vanished], partitions=1)
    produce(kafka, one_partition(keyed_records([vanished], 2, "back")))
    assert plan(lenient, fail_on_data_loss=True) == {kept: {"0": 3}, vanished: {"0": 2}}


def test_a_capped_backlog_is_read_oldest_first_in_time_order_and_in_proportion_otherwise(
    kafka: Any,
) -> None:
    """A snapshot writes its tables one after another: a document consumer's planner (backlog
    order "time") reads the first table whole before the second, from the records' own
    timestamps on the broker; the flat consumers' (proportional) read both at once."""
    first, second = (f"{name}{uuid.uuid4().hex[:8]}" for name in ("lines", "orders"))
    create_topics(kafka.bootstrap, [first, second], partitions=1)
    producer = Producer(producer_config(kafka.bootstrap, kafka.flavor))
    for topic, stamp in ((first, 1_700_000_000_000), (second, 1_700_000_100_000)):
        for i in range(30):
            producer.produce(topic, key=b"k%d" % i, value=b"v", partition=0, timestamp=stamp + i)
        assert producer.flush(30) == 0
    start = {first: {"0": 0}, second: {"0": 0}}

    def plan(order: str | None, cap: int) -> Any:
        return planned_end(
            kafka, [first, second], start, max_offsets_per_trigger=cap, backlog_order=order
        )

    assert plan(None, 20) == {first: {"0": 10}, second: {"0": 10}}
    in_time = plan("time", 40)
    if kafka.flavor == "noida":  # its fetch returns a partition's whole rest: not asked
        assert in_time == {first: {"0": 20}, second: {"0": 20}}
    else:
        assert in_time == {first: {"0": 30}, second: {"0": 10}}
    # The planner keeps its reader from batch to batch: a second call reads again.
    reader = Consumer(consumer_config(kafka.bootstrap, kafka.flavor))
    try:
        for offset in (5, 7):
            heads = python_kafka.head_times(reader, {(first, 0): offset, (second, 0): 29}, 10.0)
            assert heads == {(first, 0): 1_700_000_000_000 + offset, (second, 0): 1_700_000_100_029}
    finally:
        reader.close()


def test_consumers_of_one_application_read_a_range_from_the_broker_once(kafka: Any) -> None:
    """The driver's small batches read through the process's `RecentReads`: the first read of
    a range takes what the broker holds past it too (never waiting for more), and a consumer
    planning a range within it later gets the same records without asking the broker."""
    topic, records, options = one_partition_topic(kafka, "shared", 30)
    asked: list[tuple[int, int, int]] = []

    def broker(
        options: Any, span: PartitionRange, ahead: int, reach: Reach
    ) -> Iterator[pa.RecordBatch]:
        asked.append((span.start, span.end, ahead))
        yield from read_range_arrow(options, span, ahead, reach)

    reads = RecentReads(broker)

    def keys(start: int, end: int) -> list[bytes]:
        span = PartitionRange(topic, 0, start, end)
        return [row["key"] for batch in reads.read(options, span) for row in batch.to_pylist()]

    assert keys(0, 10) == [key for _, _, key, _ in records[:10]]
    assert keys(0, 30) == [key for _, _, key, _ in records]  # read ahead by the first
    assert keys(5, 25) == [key for _, _, key, _ in records[5:25]]
    assert asked == [(0, 10, reads.ahead)]
    produce(kafka, one_partition(keyed_records([topic], 5, "later")))
    assert len(keys(20, 35)) == 15
    assert asked[1][:2] == (30, 35)  # only the tail the window did not hold


def test_a_read_asks_the_broker_for_no_watermarks(
    kafka: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner checked the range against the watermarks moments ago; the read fetches at
    once (on Tansu the watermark request cost more than the fetch). Ranges read in turn, one
    read again from an earlier start, one read ahead past its end: each is exactly the
    partition's records of its range."""
    topic, records, options = one_partition_topic(kafka, "nomarks", 30)

    class NoWatermarks(Consumer):
        def get_watermark_offsets(self, *_: Any, **__: Any) -> Any:
            raise AssertionError("the read asked for watermarks")

    monkeypatch.setattr(python_kafka, "Consumer", NoWatermarks)

    def keys(start: int, end: int, ahead: int = 0) -> tuple[list[bytes], int]:
        reach = Reach(start)
        batches = read_range_arrow(options, PartitionRange(topic, 0, start, end), ahead, reach)
        return [row["key"] for batch in batches for row in batch.to_pylist()], reach.end

    assert keys(0, 10) == ([key for _, _, key, _ in records[:10]], 10)
    assert keys(10, 30) == ([key for _, _, key, _ in records[10:]], 30)
    assert keys(5, 12) == ([key for _, _, key, _ in records[5:12]], 12)
    later = one_partition(keyed_records([topic], 5, "later"))
    produce(kafka, later)
    read, reach = keys(28, 31, ahead=100)  # what the broker holds past the end, no more
    assert (read, reach) == ([key for _, _, key, _ in records[28:] + later], 35)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_read_that_gets_nowhere_is_checked_against_the_watermarks(
    kafka: Any, fail_on_data_loss: bool
) -> None:
    """A start past the partition's end (its topic re-created with fewer records since
    planning) gets nowhere (the Tansu stand-in answers such a fetch with nothing, not "out of
    range"); it is then checked against the watermarks: refused as data loss, or with
    failOnDataLoss=false skipped."""
    topic, _, options = one_partition_topic(kafka, "nowhere", 3, fail_on_data_loss)
    read = consume_range(options, PartitionRange(topic, 0, 10, 12))
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=topic):
            list(read)
    else:
        assert list(read) == []
