"""The embedded capture's publisher waits for a broker that does not answer (SIGSTOP), and fails
only when the producer itself gives the records up (`message.timeout.ms`).

A 550,000-row snapshot on the Tansu stand-in ended when the broker's acknowledgements lagged past
the publisher's former fixed minute (benchmarks, 2026-11-28): its snapshot then starts over from
the first row. Each test has a broker of its own (`private_broker`), so it can freeze that
process without disturbing other tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from cdc_sync.connectors.publisher import KafkaPublisher, PublishError, Record, TopicSettings
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.localstack.process import Started
from tests.adversarial.child import frozen
from tests.fixtures.services import KafkaEndpoint

pytestmark = pytest.mark.integration

TOPIC = "cdc.outage.rows"
REPORT_SECONDS = 1.0  # the publisher's wait between reports, shortened for the test
FROZEN_SECONDS = 4.0  # longer than several reports


@pytest.fixture(autouse=True)
def short_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cdc_sync.connectors.publisher.REPORT_SECONDS", REPORT_SECONDS)
    monkeypatch.setattr("cdc_sync.connectors.publisher.FLUSH_TIMEOUT_SECONDS", 1.0)  # close()


def records(first: int, count: int) -> list[Record]:
    return [
        Record(TOPIC, f'{{"id": {n}}}'.encode(), f'{{"n": {n}}}'.encode())
        for n in range(first, first + count)
    ]


def topic_values(bootstrap: str) -> list[bytes]:
    consumer = Consumer(
        consumer_config(
            bootstrap, "tansu", group_id="outage-check", **{"enable.partition.eof": True}
        )
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                break  # the partition's end
            values.append(bytes(message.value() or b""))
        return values
    finally:
        consumer.close()


def test_a_broker_that_stops_answering_is_waited_for_and_nothing_is_lost(
    private_broker: Started, caplog: pytest.LogCaptureFixture
) -> None:
    publisher = KafkaPublisher(private_broker.url, "tansu", TopicSettings(1, 1, {}))
    try:
        publisher.publish_batch(records(0, 10))  # the topic exists, the connection is up
        with frozen(private_broker.pid):
            thaw = threading.Timer(
                FROZEN_SECONDS, lambda: os.kill(private_broker.pid, signal.SIGCONT)
            )
            thaw.start()
            started = time.monotonic()
            publisher.publish_batch(records(10, 50))
            waited = time.monotonic() - started
            thaw.join()
    finally:
        publisher.close()
    assert waited >= FROZEN_SECONDS - 0.5
    assert "has not acknowledged" in caplog.text
    assert publisher.published == 60
    expected = [f'{{"n": {n}}}'.encode() for n in range(60)]
    assert topic_values(private_broker.url) == expected  # every record once, in order


def test_records_the_producer_gives_up_on_end_the_batch(private_broker: Started) -> None:
    publisher = KafkaPublisher(
        private_broker.url, "tansu", TopicSettings(1, 1, {}), **{"message.timeout.ms": 2000}
    )
    try:
        publisher.publish_batch(records(0, 1))
        with frozen(private_broker.pid), pytest.raises(PublishError, match="records failed"):
            publisher.publish_batch(records(1, 5))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(private_broker.pid, signal.SIGCONT)
        publisher.producer.purge()
        publisher.close()


def test_a_stopping_capture_ends_a_batch_that_waits_for_the_broker(private_broker: Started) -> None:
    """`CaptureEngine.stop` asks the publisher to stop waiting: the batch fails (its offsets are
    not committed) instead of holding the stop for the producer's delivery timeout."""
    publisher = KafkaPublisher(private_broker.url, "tansu", TopicSettings(1, 1, {}))
    failed: list[BaseException] = []

    def publish() -> None:
        try:
            publisher.publish_batch(records(1, 5))
        except PublishError as exc:
            failed.append(exc)

    try:
        publisher.publish_batch(records(0, 1))
        with frozen(private_broker.pid):
            waiting = threading.Thread(target=publish)
            waiting.start()
            time.sleep(1.0)
            stopped_at = time.monotonic()
            publisher.stop_waiting()
            waiting.join(10)
            assert not waiting.is_alive()
            assert time.monotonic() - stopped_at < 2.0
    finally:
        publisher.producer.purge()
        publisher.close()
    assert len(failed) == 1
    assert "unacknowledged" in str(failed[0])


def kafka_client_threads() -> int:
    """This process's librdkafka threads (native, so Python's `threading` does not see them; they
    name themselves `rdk:main`, `rdk:broker…`). Only theirs: the whole process's count moved with
    Spark's and the JVM's threads, by 3 during one CI run."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended since the listing
            names.append(Path(f"/proc/self/task/{task}/comm").read_text())
    return sum(name.startswith("rdk:") for name in names)


def test_a_closed_publisher_leaves_no_kafka_client_behind(kafka: KafkaEndpoint) -> None:
    """A publisher kept an admin client (for its topics) that close() did not end: it held its
    broker threads and reconnected to a stopped broker every second for as long as the capture
    object lived. Closed, a publisher that created a topic holds no client threads."""
    before = kafka_client_threads()
    publisher = KafkaPublisher(kafka.bootstrap, kafka.flavor, TopicSettings(1, 1, {}))
    topic = f"cdc.closed.{uuid.uuid4().hex[:8]}"
    publisher.publish_batch([Record(topic, b'{"id": 1}', b'{"n": 1}')])
    assert kafka_client_threads() > before  # the producer's threads are up
    publisher.close()
    assert kafka_client_threads() <= before
