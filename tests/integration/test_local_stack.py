"""The local stack: each service answers as the pipeline needs; `stack up/status/down` by PID."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from cdc_sync.core.kafka_clients import consumer_config, producer_config
from cdc_sync.core.settings import read_env_file
from cdc_sync.localstack.cli import stack_main
from cdc_sync.localstack.process import StackError, alive, group_members, stop_pid
from cdc_sync.localstack.services import BROKERS, check_end_offsets, start_broker, start_redis
from cdc_sync.localstack.stack import LocalStack
from cdc_sync.source import stream_options
from cdc_sync.source.offsets import PartitionRange
from cdc_sync.source.options import FETCH_TIMEOUT, parse_options
from cdc_sync.source.python_kafka import consume_range
from tests.fixtures.services import KafkaEndpoint

pytestmark = pytest.mark.integration

BACKLOG_RECORDS = 120  # of 0.9 MB: 108 MB, above librdkafka's default 100 MB response limit
STOP_RECORDS = 60_000  # of 3 kB: its server then took 5-20 s to exit after a SIGTERM


def test_postgres_has_logical_wal(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)


def test_broker_round_trip_and_end_offsets(kafka: KafkaEndpoint) -> None:
    topic = f"stack-check-{uuid.uuid4().hex[:8]}"
    producer = Producer(producer_config(kafka.bootstrap, kafka.flavor))
    for i in range(7):
        producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    producer.close()
    consumer = Consumer(consumer_config(kafka.bootstrap, kafka.flavor, group_id=topic))
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] == 7
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes | None] = []
        while len(values) < 7:
            message = consumer.poll(10)
            assert message is not None, f"only {len(values)} of 7 records came back"
            values.append(message.value())
    finally:
        consumer.close()
    assert values == [f"v{i}".encode() for i in range(7)]


def test_search_server_indexes_and_gets(search_url: str) -> None:
    index = f"stack-check-{uuid.uuid4().hex[:8]}"
    request = urllib.request.Request(
        f"{search_url}/{index}/_doc/1?refresh=true",
        data=json.dumps({"a": 1}).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).close()
    with urllib.request.urlopen(f"{search_url}/{index}/_doc/1", timeout=10) as response:
        assert json.loads(response.read())["_source"] == {"a": 1}


def test_redis_answers(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    key = f"stack-check:{uuid.uuid4().hex}"
    client.set(key, "v", ex=60)
    assert client.get(key) == b"v"
    client.close()


@pytest.mark.parametrize("broker", BROKERS)
def test_stack_up_status_down_stops_exactly_what_it_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], broker: str
) -> None:
    """Every `--broker` option starts, the Kafka Connect worker included (on noida it exited:
    its session timeout was below the broker's group.min.session.timeout.ms)."""
    root, env_file = tmp_path / "stack", tmp_path / "stack.env"
    common = ["--dir", str(root), "--env-file", str(env_file), "--broker", broker]
    assert stack_main(["up", *common]) == 0, capsys.readouterr().err
    try:
        values = read_env_file(env_file)
        assert values["CDC_SYNC_KAFKA_FLAVOR"] == broker
        assert values["CDC_SYNC_PG_URL"].startswith("postgresql://cdc_admin@127.0.0.1:")
        pids = [s.pid for s in LocalStack(root).started()]
        assert len(pids) == 5 and all(alive(pid) for pid in pids)  # with the Connect worker
        assert values["CDC_SYNC_CONNECT_URL"].startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{values['CDC_SYNC_CONNECT_URL']}/health") as health:
            assert json.loads(health.read())["status"] == "healthy"  # joined its group
        assert stack_main(["status", *common]) == 0
        assert stack_main(["up", *common]) == 0  # already up: reused, nothing new started
        assert [s.pid for s in LocalStack(root).started()] == pids
    finally:
        assert stack_main(["down", *common]) == 0
    assert not any(alive(pid) for pid in pids)
    assert not env_file.exists()
    assert stack_main(["status", *common]) == 1
    assert "not running" in capsys.readouterr().out


@pytest.mark.parametrize("flavor", ["tansu", "noida"])
def test_each_broker_stand_in_passes_the_end_offset_self_check(tmp_path: Path, flavor: str) -> None:
    started = start_broker(tmp_path, flavor)  # runs check_end_offsets before returning
    try:
        check_end_offsets(started.url, flavor)  # and again on a warm broker
    finally:
        stop_pid(started.pid)
    assert not alive(started.pid)


def test_a_backlog_above_librdkafkas_response_limit_reads_on_noida(tmp_path: Path) -> None:
    """noida answers a fetch with the partition's whole rest, whatever the fetch limits say:
    with librdkafka's default 100 MB response limit every fetch of a larger backlog failed, and
    the document consumer's first read of a 50,000-order snapshot got nothing until its timeout
    (`bench_e2e.py --broker noida`)."""
    started = start_broker(tmp_path, "noida")
    try:
        topic = f"backlog-{uuid.uuid4().hex[:8]}"
        producer = Producer(producer_config(started.url, "noida"))
        value = b"x" * 900_000  # under a producer's default 1 MB message limit
        for i in range(BACKLOG_RECORDS):
            producer.produce(topic, key=f"k{i}".encode(), value=value, partition=0)
        assert producer.flush(60) == 0
        options = parse_options(
            {**stream_options(bootstrap=started.url, flavor="noida", topics=[topic]),
             FETCH_TIMEOUT: "10000"}
        )  # fmt: skip
        read = [m.offset() for m in consume_range(options, PartitionRange(topic, 0, 0, 2))]
    finally:
        stop_pid(started.pid)
    assert read == [0, 1]


def test_a_stopped_broker_leaves_no_process_of_its_group_behind(tmp_path: Path) -> None:
    """noida-db is a console script that runs the server as its child; after a SIGTERM the
    script exits at once and the server, holding data, shuts down for seconds more: the stop
    returned while it ran (a bench found one still up after its stack had been stopped)."""
    started = start_broker(tmp_path, "noida")
    try:
        producer = Producer(producer_config(started.url, "noida"))
        for i in range(STOP_RECORDS):
            producer.produce("held", key=f"k{i}".encode(), value=b"x" * 3000, partition=0)
            if i % 10_000 == 0:
                producer.flush(60)  # the client's queue holds 100,000 records at most
        assert producer.flush(60) == 0
    finally:
        stop_pid(started.pid)
    assert group_members(started.pid) == []


def test_a_service_that_does_not_come_up_is_named_with_the_line_of_its_log_that_says_why(
    tmp_path: Path,
) -> None:
    """Redis on a port another process holds exits at once: the error says so in one line (the
    line of its log), as soon as it exited, not a log tail after the start timeout."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StackError) as raised:
            start_redis(tmp_path, port=port)
        elapsed = time.monotonic() - started
    message = str(raised.value)
    assert message.startswith("redis-server exited before it answered: ")
    assert "\n" not in message
    assert f"Failed listening on port {port}" in message
    assert f"(log {tmp_path / 'redis.log'})" in message
    assert elapsed < 30  # not the 60 s start timeout
