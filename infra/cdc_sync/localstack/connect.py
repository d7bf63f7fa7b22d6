"""A Kafka Connect distributed worker (REST on a free loopback port) with the Debezium Postgres
plugin, assembled by `make bootstrap` (infra/connect/assemble-local-worker.sh)."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
import uuid
from pathlib import Path

from cdc_sync.debezium.connector import pg_env_from_url
from cdc_sync.localstack.process import StackError, Started, free_port, spawn, wait_until

POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
# The wheel's Connect logs through log4j2: without a config it logs nothing at all.
LOG4J = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.clients.name = org.apache.kafka.clients
logger.clients.level = warn
logger.reflections.name = org.reflections
logger.reflections.level = error
"""


# The worker's group session. Kafka (and noida) refuse a JoinGroup below their
# group.min.session.timeout.ms, 6000 ms by default: the worker then exits. Tansu accepts less,
# and its joins take about half the session timeout, so it gets a shorter one.
SESSION_TIMEOUT_MS = 6000
TANSU_SESSION_TIMEOUT_MS = 3000


def worker_home() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(os.environ.get("CDC_SYNC_CONNECT_HOME", cache / "cdc-sync" / "connect-worker"))


def worker_properties(bootstrap: str, flavor: str, port: int, home: Path, group: str) -> str:
    settings = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "config.storage.topic": f"_{group}_configs",
        "offset.storage.topic": f"_{group}_offsets",
        "status.storage.topic": f"_{group}_status",
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "offset.flush.interval.ms": "1000",
        "listeners": f"http://127.0.0.1:{port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(port),
        "plugin.path": str(home / "plugins"),
        # The wheel's reflections 0.9 breaks the default plugin scan.
        "plugin.discovery": "service_load",
        "session.timeout.ms": str(
            TANSU_SESSION_TIMEOUT_MS if flavor == "tansu" else SESSION_TIMEOUT_MS
        ),
        "heartbeat.interval.ms": "500",
        # connectors/*.json read database settings as ${env:CDC_SYNC_PG_*}.
        "config.providers": "env",
        "config.providers.env.class": (
            "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
        ),
    }
    if flavor == "tansu":
        # One record per produce batch keeps Tansu's end offsets right (internal topics too).
        settings |= {"batch.size": "0", "producer.batch.size": "0"}
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def start_connect(root: Path, bootstrap: str, flavor: str, pg_url: str) -> Started:
    home = worker_home()
    if not (home / ".assembled").exists():
        raise StackError(f"Kafka Connect worker not assembled in {home} (run `make bootstrap`)")
    java = shutil.which("java")
    if java is None:
        raise StackError("java not found (run `make bootstrap`)")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    properties = root / "worker.properties"
    group = f"cdc-sync-connect-{uuid.uuid4().hex[:6]}"
    properties.write_text(worker_properties(bootstrap, flavor, port, home, group))
    log = root / "connect.log"
    log_config = root / "log4j2.properties"
    log_config.write_text(LOG4J)
    argv = [
        java,
        "-Xmx768m",
        f"-Dlog4j2.configurationFile={log_config}",
        "-cp",
        f"{home / 'classpath'}/*",
        "org.apache.kafka.connect.cli.ConnectDistributed",
        str(properties),
    ]
    env = os.environ | pg_env_from_url(pg_url)
    pid = spawn("connect", argv, log, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _ready(url), "Kafka Connect", log, timeout=90, pid=pid)
    return Started("connect", pid, url, log)


def _ready(url: str) -> bool:
    """The worker has joined its group and read its config topic (`/health` answers 200 only
    then: KIP-1017, Connect 3.9), and it lists the Debezium Postgres plugin. The REST server
    alone answers earlier, and goes away again when the group join fails."""
    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
        if response.status != 200:
            return False
    with urllib.request.urlopen(f"{url}/connector-plugins", timeout=5) as response:
        plugins = json.loads(response.read())
    return any(p.get("class") == POSTGRES_CONNECTOR for p in plugins)
