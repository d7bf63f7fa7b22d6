"""E2E pipelines: each gets a private database, topic prefix, Redis db, indices and warehouse."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from pyspark.sql import SparkSession

from cdc_sync.connectors.engine import CaptureEngine
from cdc_sync.connectors.ops import wait_for_topics, wait_running, wanted_config
from cdc_sync.connectors.rest import ConnectClient
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import load_connector
from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.job.spark_session import build_spark
from cdc_sync.mapping import MappingFile
from tests.adversarial.pipeline import Pipeline
from tests.adversarial.workload import Workload, create_schema
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.e2e.sinks_state import clean_sinks
from tests.fixtures.services import KafkaEndpoint
from tests.pg import drop_slot, private_database

CONNECTOR = Path("connectors/shop.json")
SHOP_REDIS_DB = 3


def with_path(url: str, path: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=path))


def adversarial_connections(
    database: str,
    kafka: KafkaEndpoint,
    search_url: str,
    redis_url: str,
    redis_db: int,
    root: Path,
) -> Connections:
    """A private database's pipeline on the session's services, in its own Redis database."""
    return Connections(
        pg_url=database,
        kafka_bootstrap=kafka.bootstrap,
        kafka_flavor=kafka.flavor,
        search_url=search_url,
        search_client="opensearch",
        redis_url=with_path(redis_url, f"/{redis_db}"),
        connect_url=None,
        warehouse=str(root / "warehouse"),
    )


@contextmanager
def running_adversarial(
    connections: Connections, root: Path, seed: int, operations: int = 40
) -> Iterator[tuple[Pipeline, Workload]]:
    """The adversarial schema on the connections' (private) database, its seed rows and
    `operations` of the workload (part of the initial snapshot), captured and synced by the
    suite's processes; stopped at the end."""
    database = connections.require("pg_url")
    create_schema(database)
    workload = Workload(database, seed)
    workload.seed_rows()
    workload.run(operations)
    pipeline = Pipeline.create(connections, root)
    pipeline.start()
    try:
        yield pipeline, workload
    finally:
        pipeline.stop()
        workload.close()


# The suite's one Spark JVM runs every e2e job one after the other (~25 min): twice Spark's
# default heap, and its output in a file whose end a failure shows (a JVM that ended left only
# py4j's "Answer from Java side is empty" in the tests' output).
SPARK_DRIVER_MEMORY = "2g"
SPARK_LOG_TAIL_BYTES = 6000
SPARK_LOG = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def spark(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkSession]:
    log = request.config.stash[SPARK_LOG] = tmp_path_factory.getbasetemp() / "spark-jvm.log"
    session = build_spark("cdc-sync-e2e", jvm_log=log, driver_memory=SPARK_DRIVER_MEMORY)
    yield session
    try:
        session.stop()
    except Exception as error:
        raise RuntimeError(f"the e2e Spark JVM is gone; {spark_log_tail(log)}") from error
    # Every e2e job's stops ran in this JVM: none may have cut a stream thread short
    # (cdc_sync.job.stopping).
    overflows = log.read_text(errors="replace").count("StackOverflowError") if log.exists() else 0
    assert overflows == 0, f"{overflows} StackOverflowError(s) in the e2e Spark JVM's log {log}"


def spark_log_tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return "no JVM log was written"
    with log.open("rb") as file:
        file.seek(max(0, file.seek(0, 2) - SPARK_LOG_TAIL_BYTES))
        return f"the end of its log {log}:\n{file.read().decode(errors='replace')}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that failed on a Spark JVM that is gone shows the end of the JVM's log."""
    report = yield
    gone = ("Answer from Java side is empty", "Py4JNetworkError", "ConnectionRefusedError")
    if report.failed and any(text in str(report.longrepr) for text in gone):
        report.sections.append(
            ("Spark JVM log", spark_log_tail(item.config.stash.get(SPARK_LOG, None)))
        )
    return report


@contextmanager
def running_pipeline(
    spark: SparkSession,
    mapping: MappingFile,
    connections: Connections,
    root: Path,
    connector_overrides: Mapping[str, str],
    connect_url: str | None = None,
) -> Iterator[SyncHarness]:
    """Clean sinks, start capture (embedded engine, or the connector registered on a Kafka
    Connect worker when `connect_url` is given), wait for the snapshot, start the job."""
    clean_sinks(mapping, connections)
    prefix = mapping.topic_prefix
    overrides = {
        "topic.prefix": prefix,
        "slot.name": f"{prefix}_slot",
        "publication.name": f"{prefix}_pub",
        **connector_overrides,
    }
    harness = SyncHarness(spark, mapping, connections, root)
    if connect_url:
        capture = _worker_capture(connect_url, connections, mapping, overrides)
    else:
        embedded = EmbeddedCapture(connections, root, overrides)
        harness.snapshot_again = embedded.snapshot_again
        capture = embedded.running()
    with capture:
        harness.start()
        try:
            yield harness
        finally:
            harness.stop()


class EmbeddedCapture:
    """The embedded engine of one pipeline; its slot is dropped whenever it stops."""

    def __init__(self, connections: Connections, root: Path, overrides: Mapping[str, str]) -> None:
        self.connections = connections
        self.state_dir = root / "capture"  # its offset file
        self.settings = {**overrides, "slot.drop.on.stop": "true"}
        self.engine: CaptureEngine | None = None

    @contextmanager
    def running(self) -> Iterator[None]:
        self._start()
        try:
            yield
        finally:
            if self.engine is not None:
                self.engine.stop()

    def snapshot_again(self, while_down: Callable[[], None]) -> None:
        """Capture restarted without its offsets (and on a new slot): a new initial snapshot
        on the same topics. What `while_down` changed was never published."""
        assert self.engine is not None
        self.engine.stop()
        self.engine = None
        while_down()
        shutil.rmtree(self.state_dir)
        self._start()

    def _start(self) -> None:
        engine = CaptureEngine.from_file(CONNECTOR, self.connections, self.state_dir, self.settings)
        engine.start()
        try:
            engine.wait_ready(timeout_seconds=120)
        except BaseException:
            engine.stop()
            raise
        self.engine = engine


@contextmanager
def _worker_capture(
    connect_url: str, connections: Connections, mapping: MappingFile, overrides: Mapping[str, str]
) -> Iterator[None]:
    """The same connector file, registered over REST; the database is this pipeline's own."""
    name = mapping.topic_prefix
    database = urlsplit(connections.require("pg_url")).path.lstrip("/")
    config = wanted_config(
        load_connector(CONNECTOR), {**overrides, "name": name, "database.dbname": database}
    )
    client = ConnectClient(connect_url)
    client.put_config(name, config)
    try:
        wait_running(client, name)
        wait_for_topics(connections, [f"{mapping.topic_prefix}.{t}" for t in mapping.tables])
        yield
    finally:
        client.delete(name)
        drop_slot(connections.require("pg_url"), overrides["slot.name"])


@dataclass(frozen=True)
class Services:
    """The session's services, shared by every e2e pipeline."""

    spark: SparkSession
    pg_url: str
    kafka: KafkaEndpoint
    search_url: str
    redis_url: str

    def connections(self, database_url: str, redis_db: int, root: Path) -> Connections:
        """A pipeline's settings: its own database, Redis db and warehouse."""
        return Connections(
            pg_url=database_url,
            kafka_bootstrap=self.kafka.bootstrap,
            kafka_flavor=self.kafka.flavor,
            search_url=self.search_url,
            search_client="opensearch",
            redis_url=with_path(self.redis_url, f"/{redis_db}"),
            connect_url=None,
            warehouse=str(root / "warehouse"),
        )


@pytest.fixture(scope="session")
def services(
    spark: SparkSession, pg_url: str, kafka: KafkaEndpoint, search_url: str, redis_url: str
) -> Services:
    return Services(spark, pg_url, kafka, search_url, redis_url)


CAPTURE_PATHS = ["embedded", "connect"]


@pytest.fixture(scope="session", params=CAPTURE_PATHS)
def pipeline(
    request: pytest.FixtureRequest, services: Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SyncHarness]:
    """The demo shop schema with its seed rows, captured (by the embedded engine, then by a
    Kafka Connect worker) and synced for the whole session."""
    connect_url = request.getfixturevalue("connect_url") if request.param == "connect" else None
    root = tmp_path_factory.mktemp(f"e2e-{request.param}")
    with private_database(services.pg_url, "shop_e2e") as database:
        connections = services.connections(database, SHOP_REDIS_DB, root)
        create_demo_schema(database)
        mapping = e2e_mapping(f"e2e{uuid.uuid4().hex[:6]}")
        with running_pipeline(
            services.spark, mapping, connections, root, {}, connect_url
        ) as harness:
            yield harness
