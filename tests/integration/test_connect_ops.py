"""`cdc-sync connectors` against a real Kafka Connect worker with the Debezium Postgres plugin."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from cdc_sync.connectors.ops import connectors_main, wait_running, wanted_config
from cdc_sync.connectors.rest import ConnectClient, ConnectError
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.model import Change, Coordinates
from cdc_sync.core.settings import read_env_file, write_env_file
from cdc_sync.debezium.connector import load_connector, pg_env_from_url
from cdc_sync.debezium.database import SourceMismatch
from cdc_sync.debezium.decoder import parse_record
from cdc_sync.demo.workload import create_demo_schema
from tests.fixtures.services import KafkaEndpoint, docker_available
from tests.pg import drop_slot, private_database

pytestmark = pytest.mark.integration
SHOP = "connectors/shop.json"


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    with private_database(pg_url, "ops") as url:
        create_demo_schema(url)
        yield url


@pytest.fixture
def env_file(tmp_path: Path, database: str, kafka: KafkaEndpoint, connect_url: str) -> Path:
    path = tmp_path / "stack.env"
    values = {
        "CDC_SYNC_PG_URL": database,
        "CDC_SYNC_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "CDC_SYNC_KAFKA_FLAVOR": kafka.flavor,
        "CDC_SYNC_CONNECT_URL": connect_url,
    }
    write_env_file(path, values)
    return path


def private(database: str) -> list[str]:
    """Settings that point the shop connector at this test's database, slot and topics."""
    prefix = f"ops{uuid.uuid4().hex[:6]}"
    dbname = urlsplit(database).path.lstrip("/")
    pairs = {
        "name": prefix,
        "database.dbname": dbname,
        "topic.prefix": prefix,
        "slot.name": prefix,
        "publication.name": prefix,
        "notification.sink.topic.name": f"{prefix}.notifications",
    }
    return [arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]


def run(env_file: Path, *args: str) -> int:
    return connectors_main(["--env-file", str(env_file), *args])


def test_validate_passes_the_demo_connector_and_names_bad_settings(
    env_file: Path, database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(env_file, "validate", "--connector", SHOP, "--mapping", "mappings/shop.yaml") == 0
    out = capsys.readouterr().out
    assert "0 error(s)" in out
    assert "warning: database.user" in out  # the local stack connects as a superuser
    bad = ["--set", "publication.name=dbz_publication", "--set", "heartbeat.interval.ms=0"]
    assert run(env_file, "validate", "--connector", SHOP, *bad) == 1
    out = capsys.readouterr().out
    assert "error: publication.name" in out and "error: heartbeat.interval.ms" in out


def test_apply_status_pause_resume_restart_offsets_delete(
    env_file: Path, database: str, connect_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = private(database)
    name = settings[1].split("=", 1)[1]
    client = ConnectClient(connect_url)
    assert run(env_file, "apply", "--connector", SHOP, *settings) == 0
    assert "create" in capsys.readouterr().out
    wait_running(client, name)
    assert run(env_file, "apply", "--connector", SHOP, *settings) == 0
    assert "up to date" in capsys.readouterr().out
    changed = [*settings, "--set", "heartbeat.interval.ms=5000"]
    assert run(env_file, "apply", "--connector", SHOP, *changed) == 0
    assert "~ heartbeat.interval.ms: 1000 -> 5000" in capsys.readouterr().out
    wait_running(client, name)
    assert run(env_file, "pause", "--name", name) == 0
    _wait_state(client, name, "PAUSED")
    assert run(env_file, "resume", "--name", name) == 0
    _wait_state(client, name, "RUNNING")
    assert run(env_file, "restart", "--name", name) == 0
    capsys.readouterr()
    deadline = time.monotonic() + 30
    while True:  # the restart shows as RESTARTING for a moment, then RUNNING again
        assert run(env_file, "status", "--name", name) == 0
        if f"connector {name}: RUNNING" in capsys.readouterr().out:
            break
        assert time.monotonic() < deadline, "connector not RUNNING after the restart"
        time.sleep(0.3)
    deadline = time.monotonic() + 30
    while not client.offsets(name).get("offsets"):
        assert time.monotonic() < deadline, "no source offsets committed"
        time.sleep(0.5)
    assert run(env_file, "slots") == 0
    assert name in capsys.readouterr().out
    assert run(env_file, "delete", "--name", name) == 0
    deadline = time.monotonic() + 30
    while name in client.connectors():  # deletion completes asynchronously
        assert time.monotonic() < deadline, "connector not deleted"
        time.sleep(0.3)
    with pytest.raises(ConnectError) as gone:
        client.config(name) or client.status(name)
    assert gone.value.status == 404
    drop_slot(database, name)


def test_incremental_snapshot_of_one_table_while_streaming(
    env_file: Path, database: str, connect_url: str, kafka: KafkaEndpoint
) -> None:
    settings = private(database)
    name = settings[1].split("=", 1)[1]
    client = ConnectClient(connect_url)
    assert run(env_file, "apply", "--connector", SHOP, *settings) == 0
    try:
        wait_running(client, name)
        topic = f"{name}.shop.products"
        before = _records(kafka, topic, at_least=3)
        snapshot = ["snapshot", "--connector", SHOP, *settings, "--table", "shop.products"]
        assert run(env_file, *snapshot, "--timeout", "90") == 0
        after = _records(kafka, topic, at_least=len(before) + 3)
        snapshot_rows = [parse_record(*r) for r in after[len(before) :]]
        sources = [json.loads(r[1])["payload"]["source"]["snapshot"] for r in after[len(before) :]]
        assert all(isinstance(c, Change) for c in snapshot_rows)
        assert "incremental" in sources
    finally:
        client.delete(name)
        drop_slot(database, name)


def test_snapshot_signals_the_connectors_database_not_cdc_sync_pg_url(
    env_file: Path,
    database: str,
    pg_url: str,
    connect_url: str,
    kafka: KafkaEndpoint,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """CDC_SYNC_PG_URL names `database`; the connector captures from a second one: `snapshot`
    and `slots` refuse to start, naming both. Without the URL (the connector's placeholders
    from CDC_SYNC_PG_*), the signal lands in the second (the only one Debezium reads), and
    Debezium's notifications say the snapshot started and completed."""
    with psycopg.connect(database, autocommit=True) as conn:
        # Without its signal table, a signal sent here would show as a newly created table.
        conn.execute("DROP TABLE shop.cdc_sync_signal")
    with private_database(pg_url, "ops2") as second:
        create_demo_schema(second)
        second_db = urlsplit(second).path.lstrip("/")
        settings = private(second)
        name = settings[1].split("=", 1)[1]
        snapshot = ["snapshot", "--connector", SHOP, *settings, "--table", "shop.products"]
        for refused in (snapshot, ["slots", "--connector", SHOP, *settings]):
            with pytest.raises(
                SourceMismatch, match=rf"captures \S+/{second_db} .*CDC_SYNC_PG_URL"
            ):
                run(env_file, *refused)
        parts_env = env_file.with_name("parts.env")
        values = read_env_file(env_file)
        write_env_file(
            parts_env,
            {k: v for k, v in values.items() if k != "CDC_SYNC_PG_URL"} | pg_env_from_url(pg_url),
        )
        client = ConnectClient(connect_url)
        assert run(env_file, "apply", "--connector", SHOP, *settings) == 0
        try:
            wait_running(client, name)
            _records(kafka, f"{name}.shop.products", at_least=3)  # initial snapshot is out
            capsys.readouterr()
            code = run(parts_env, *snapshot, "--timeout", "90")
            out = capsys.readouterr().out
            assert code == 0, out
            assert re.search(rf"^database: \S+/{second_db} \(connector {name}\)$", out, re.M), out
            assert re.search(r"^\S+ started: shop\.products$", out, re.M), out
            assert re.search(r"^\S+ completed$", out, re.M), out
            match = re.search(r"\(signal (snapshot-[0-9a-f-]+)\)", out)
            assert match, out
            with psycopg.connect(second) as conn:
                row = conn.execute(
                    "SELECT type FROM shop.cdc_sync_signal WHERE id = %s", (match.group(1),)
                ).fetchone()
            assert row == ("execute-snapshot",)
            with psycopg.connect(database) as conn:
                stray = conn.execute("SELECT to_regclass('shop.cdc_sync_signal')").fetchone()
            assert stray == (None,)
            assert run(parts_env, "slots", "--connector", SHOP, *settings) == 0
            slots = capsys.readouterr().out
            assert f"/{second_db} (connector {name})" in slots
            assert re.search(rf"^{name}\s+{second_db}\s", slots, re.M), slots
        finally:
            client.delete(name)
            drop_slot(second, name)


def _wait_state(client: ConnectClient, name: str, state: str) -> None:
    deadline = time.monotonic() + 30
    while client.status(name)["connector"]["state"] != state:
        assert time.monotonic() < deadline, f"connector never became {state}"
        time.sleep(0.3)


def _records(
    kafka: KafkaEndpoint, topic: str, at_least: int, timeout: float = 60
) -> list[tuple[bytes | None, bytes, Coordinates]]:
    deadline = time.monotonic() + timeout
    while True:
        consumer = Consumer(consumer_config(kafka.bootstrap, kafka.flavor, f"t{uuid.uuid4()}"))
        try:
            try:
                high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1]
            except KafkaException as exc:  # the connector has not created the topic yet
                if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                    raise
                high = 0
            records: list[tuple[bytes | None, bytes, Coordinates]] = []
            if high >= at_least:
                consumer.assign([TopicPartition(topic, 0, 0)])
                while len(records) < high:
                    message = consumer.poll(10)
                    assert message is not None
                    value = message.value()
                    if value is not None:
                        coordinates = Coordinates(topic, 0, message.offset() or 0)
                        records.append((message.key(), value, coordinates))
                    else:
                        high -= 1  # tombstones do not count
                return records
        finally:
            consumer.close()
        assert time.monotonic() < deadline, f"{topic}: fewer than {at_least} records"
        time.sleep(0.5)


def test_the_connector_runs_on_the_debezium_connect_image() -> None:
    """The production image (compose) runs the same file: checked where Docker exists."""
    if not docker_available():
        pytest.skip(
            "needs a Docker engine (testcontainers: quay.io/debezium/connect:3.0, "
            "apache/kafka:3.9.1, postgres:16)"
        )
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network
    from testcontainers.core.waiting_utils import wait_for_logs

    kafka_env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://kafka:9092",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@kafka:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
    }
    connect_env = {
        "BOOTSTRAP_SERVERS": "kafka:9092",
        "GROUP_ID": "cdc-sync-test",
        "CONFIG_STORAGE_TOPIC": "_configs",
        "OFFSET_STORAGE_TOPIC": "_offsets",
        "STATUS_STORAGE_TOPIC": "_status",
        "CONNECT_CONFIG_PROVIDERS": "env",
        "CONNECT_CONFIG_PROVIDERS_ENV_CLASS": (
            "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
        ),
        "CDC_SYNC_PG_HOST": "postgres",
        "CDC_SYNC_PG_PORT": "5432",
        "CDC_SYNC_PG_USER": "cdc_admin",
        "CDC_SYNC_PG_PASSWORD": "cdc_admin",
        "CDC_SYNC_PG_DB": "shop",
    }
    with Network() as network:
        postgres = (
            DockerContainer("postgres:16")
            .with_network(network)
            .with_network_aliases("postgres")
            .with_env("POSTGRES_USER", "cdc_admin")
            .with_env("POSTGRES_PASSWORD", "cdc_admin")
            .with_env("POSTGRES_DB", "shop")
            .with_command("postgres -c wal_level=logical")
            .with_exposed_ports(5432)
        )
        kafka = DockerContainer("apache/kafka:3.9.1").with_network(network)
        kafka = kafka.with_network_aliases("kafka")
        for name, value in kafka_env.items():
            kafka = kafka.with_env(name, value)
        with postgres, kafka:
            wait_for_logs(postgres, "ready to accept connections", timeout=120)
            wait_for_logs(kafka, "Kafka Server started", timeout=120)
            host, port = postgres.get_container_host_ip(), postgres.get_exposed_port(5432)
            create_demo_schema(f"postgresql://cdc_admin:cdc_admin@{host}:{port}/shop")
            connect = DockerContainer("quay.io/debezium/connect:3.0").with_network(network)
            for name, value in connect_env.items():
                connect = connect.with_env(name, value)
            with connect.with_exposed_ports(8083):
                url = f"http://{connect.get_container_host_ip()}:{connect.get_exposed_port(8083)}"
                client = ConnectClient(url)
                deadline = time.monotonic() + 180
                while True:
                    try:
                        client.plugins()
                        break
                    except OSError:
                        assert time.monotonic() < deadline, "Kafka Connect did not come up"
                        time.sleep(2)
                client.put_config("shop", wanted_config(load_connector(Path(SHOP)), {}))
                wait_running(client, "shop", timeout=180)
