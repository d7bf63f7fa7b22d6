"""The production compose stack, checked without Docker: what the pipeline relies on is there."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_sync.cli import build_parser
from cdc_sync.connectors.ops import placeholder_env
from cdc_sync.core.model import TableId
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import PLACEHOLDER, load_connector, source_conninfo
from cdc_sync.debezium.slots import Slot
from cdc_sync.job.observe.capture_probes import CaptureReadings, ConnectorState
from cdc_sync.job.observe.metrics import JobMetrics
from cdc_sync.job.settle.applier import BatchMetrics, TableProgress
from cdc_sync.job.write.health import SinkHealth
from cdc_sync.mapping import load_mapping
from cdc_sync.sinks.base import WriteResult

pytestmark = pytest.mark.unit
INFRA = Path("infra")
COMPOSE = INFRA / "compose.yaml"


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])


def test_postgres_runs_with_logical_wal(services: dict[str, Any]) -> None:
    command = " ".join(services["postgres"]["command"])
    assert "wal_level=logical" in command


def test_every_published_port_binds_loopback(services: dict[str, Any]) -> None:
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert published
    assert all(str(p).startswith("127.0.0.1:") for p in published), published


def test_connect_resolves_the_connector_placeholders(services: dict[str, Any]) -> None:
    env = services["connect"]["environment"]
    assert env["CONNECT_CONFIG_PROVIDERS"] == "env"
    assert env["CONNECT_CONFIG_PROVIDERS_ENV_CLASS"].endswith("EnvVarConfigProvider")
    connector = load_connector(Path("connectors/shop.json"))
    wanted = {n for v in connector.config.values() for n in PLACEHOLDER.findall(v)}
    assert wanted and wanted <= set(env)


# Names the Debezium image's entrypoint maps itself; any other worker setting must be CONNECT_*.
CONNECT_IMAGE_VARS = {
    "BOOTSTRAP_SERVERS",
    "GROUP_ID",
    "CONFIG_STORAGE_TOPIC",
    "OFFSET_STORAGE_TOPIC",
}
CONNECT_IMAGE_VARS |= {"STATUS_STORAGE_TOPIC", "HEAP_OPTS", "LOG_LEVEL"}


def test_connect_worker_settings_reach_the_worker(services: dict[str, Any]) -> None:
    env = services["connect"]["environment"]
    ignored = [
        name
        for name in env
        if name not in CONNECT_IMAGE_VARS
        and not name.startswith(("CONNECT_", "CDC_SYNC_PG_"))  # CDC_SYNC_PG_*: read via ${env:}
    ]
    assert not ignored, f"the image ignores {ignored}: prefix worker settings with CONNECT_"


def test_register_service_mounts_the_connector_and_an_executable_script(
    services: dict[str, Any],
) -> None:
    register = services["register-connector"]
    mounts = " ".join(register["volumes"])
    assert "../connectors/shop.json" in mounts
    script = INFRA / "connect" / "register.sh"
    assert script.exists() and os.access(script, os.X_OK)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0


def test_sync_job_environment_covers_every_routed_sink(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = services["sync-job"]["environment"]
    for name in [k for k in os.environ if k.startswith("CDC_SYNC_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("CDC_SYNC_STATE_DIR", "/nonexistent")  # no local stack env file
    connections = Connections.load()
    mapping = load_mapping(Path("mappings/shop.yaml"))
    routes = list(mapping.tables.values())
    required = ["kafka_bootstrap", "pg_url", "warehouse"]
    required += ["search_url"] if any(r.search for r in routes) else []
    required += ["redis_url"] if any(r.cache for r in routes) else []
    for field in required:
        assert connections.require(field)
    assert connections.kafka_flavor == "kafka"
    assert "spark-sql-kafka" in env["CDC_SYNC_SPARK_PACKAGES"]
    assert "delta-spark" in env["CDC_SYNC_SPARK_PACKAGES"]


def test_depends_on_targets_exist(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for target in service.get("depends_on", {}):
            assert target in services, f"{name} depends on unknown service {target}"


def test_job_image_installs_java_17_and_the_project() -> None:
    dockerfile = (INFRA / "Dockerfile").read_text()
    assert re.search(r"openjdk-17-jre", dockerfile)
    assert "pip install" in dockerfile


def _compose_command() -> list[str] | None:
    """`docker compose` (plugin) or a standalone Compose v2 `docker-compose` (v1: no spec)."""
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) is None:
            continue
        probe = subprocess.run([*command, "version"], capture_output=True, text=True)
        if probe.returncode == 0 and re.search(r"\bv?2\.", probe.stdout):
            return command
    return None


def test_compose_config_is_valid_when_docker_compose_is_installed() -> None:
    command = _compose_command()
    if command is None:
        pytest.skip(
            "Docker Compose v2 is not installed (neither `docker compose` nor docker-compose)"
        )
    # `config` parses and validates against the Compose spec; it needs no Docker engine.
    result = subprocess.run(
        [*command, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True
    )
    # stderr too: some pip-installed wrappers of the binary drop its exit code
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_connector_commands_in_the_job_image_reach_the_workers_database(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`compose run sync-job cdc-sync connectors snapshot` resolves the connector's placeholders
    to the database the Connect worker captures from (where the signal must go)."""
    for name in [k for k in os.environ if k.startswith("CDC_SYNC_")]:
        monkeypatch.delenv(name)
    for name, value in services["sync-job"]["environment"].items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("CDC_SYNC_STATE_DIR", "/nonexistent")
    connector = load_connector(Path("connectors/shop.json"))
    worker = {k: str(v) for k, v in services["connect"]["environment"].items()}
    ops = placeholder_env(Connections.load())
    assert source_conninfo(connector, ops) == source_conninfo(connector, worker)


# Metrics: the job serves them, Prometheus scrapes them, Grafana shows them (files only here).
PROMETHEUS_CONFIG = INFRA / "prometheus" / "prometheus.yml"
GRAFANA = INFRA / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "cdc-sync.json"


def _job_run_args(services: dict[str, Any]) -> argparse.Namespace:
    command = services["sync-job"]["command"]
    assert command[0] == "cdc-sync"
    return build_parser().parse_args(command[1:])


def _mounted_sources(service: dict[str, Any]) -> list[Path]:
    """The service's bind-mounted files and folders, relative to the compose file."""
    sources = [str(volume).split(":")[0] for volume in service.get("volumes", [])]
    return [INFRA / source for source in sources if source.startswith(".")]


def test_prometheus_scrapes_the_jobs_metrics_port(services: dict[str, Any]) -> None:
    args = _job_run_args(services)
    assert args.metrics_port, "the sync job runs without --metrics-port"
    # In its container the job must listen beyond loopback for Prometheus to reach it.
    assert args.metrics_host == "0.0.0.0"
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    targets = [
        t for job in config["scrape_configs"] for s in job["static_configs"] for t in s["targets"]
    ]
    assert f"sync-job:{args.metrics_port}" in targets
    assert PROMETHEUS_CONFIG in _mounted_sources(services["prometheus"])


def test_grafana_provisions_prometheus_and_the_dashboard(services: dict[str, Any]) -> None:
    grafana = services["grafana"]
    mounts = _mounted_sources(grafana)
    assert GRAFANA / "provisioning" in mounts and GRAFANA / "dashboards" in mounts
    assert all(path.exists() for path in mounts), mounts
    sources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    (source,) = sources["datasources"]
    assert source["url"] == "http://prometheus:9090" and "prometheus" in services
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/cdc-sync.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert uids == {source["uid"]}


def _exported_metric_names() -> set[str]:
    """Every sample name the job exports, from a job that saw one of everything."""
    table = TableId("shop", "customers")
    health = SinkHealth(["search"])
    health.waiting("search", "bulk", 1.0, ConnectionError())
    readings = CaptureReadings(
        end_offsets={("cdc.shop.customers", 0): 3},
        slots=[Slot("s", "shop", "pgoutput", True, "reserved", 1, 1)],
        connector=ConnectorState("RUNNING", {"RUNNING": 1}),
        succeeded={"broker": True},
    )
    metrics = JobMetrics(health, lambda: readings)
    batch = BatchMetrics(
        1, records=1, stages={"decode": 0.1}, offsets={("cdc.shop.customers", 0): 1}
    )
    batch.tables[table] = TableProgress(1, 10, 1_700_000_000_000)
    batch.table_sinks[(table, "search")] = WriteResult(applied=1)
    metrics.observe(batch, "search")
    return {s.name for family in metrics.registry.collect() for s in family.samples}


def test_every_dashboard_query_reads_metrics_the_job_exports() -> None:
    exported = _exported_metric_names()
    dashboard = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for panel in dashboard["panels"]:
        exprs = [target["expr"] for target in panel["targets"]]
        names = {name for expr in exprs for name in re.findall(r"\bcdc_sync_\w+", expr)}
        assert names, f"panel {panel['title']!r} queries no cdc-sync metric"
        assert names <= exported, f"panel {panel['title']!r}: unknown {names - exported}"
        used |= names
    wanted = {
        "cdc_sync_lag_seconds",
        "cdc_sync_lag_records",
        "cdc_sync_sink_applied_total",
        "cdc_sync_sink_fenced_total",
        "cdc_sync_sink_failed_total",
        "cdc_sync_batch_stage_seconds_bucket",
        "cdc_sync_dead_lettered_records_total",
        "cdc_sync_slot_retained_wal_bytes",
        "cdc_sync_sink_state",
    }
    assert wanted <= used, f"no panel for {wanted - used}"
