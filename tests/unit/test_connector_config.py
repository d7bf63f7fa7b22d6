"""Connector files: validation names the file and key; placeholders resolve from the PG URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_sync.connectors.checks import truncate_checks
from cdc_sync.connectors.engine import engine_properties
from cdc_sync.connectors.publisher import Record, TopicSettings, record_key
from cdc_sync.core.errors import ConfigError
from cdc_sync.debezium.connector import load_connector, pg_env_from_url

pytestmark = pytest.mark.unit
SHOP = Path("connectors/shop.json")


def test_shop_connector_is_what_the_sync_job_expects() -> None:
    connector = load_connector(SHOP)
    config = connector.config
    assert connector.name == "shop" and connector.topic_prefix == "cdc"
    assert config["plugin.name"] == "pgoutput"
    assert config["snapshot.mode"] == "initial"
    assert config["tombstones.on.delete"] == "true"
    assert config["topic.creation.default.cleanup.policy"] == "compact"
    assert int(config["heartbeat.interval.ms"]) > 0
    assert config["slot.name"] and config["publication.name"]
    # `connectors snapshot` follows Debezium's notifications on this topic.
    assert config["notification.enabled.channels"] == "sink"
    assert config["notification.sink.topic.name"] == f"{connector.topic_prefix}.notifications"


def test_placeholders_resolve_from_the_postgres_url(tmp_path: Path) -> None:
    env = pg_env_from_url("postgresql://cdc%40admin:s3cret@127.0.0.1:6543/shop")
    props = engine_properties(load_connector(SHOP), env, tmp_path, {"slot.name": "other"})
    assert props["database.hostname"] == "127.0.0.1"
    assert props["database.port"] == "6543"
    assert props["database.user"] == "cdc@admin"
    assert props["database.password"] == "s3cret"
    assert props["database.dbname"] == "shop"
    assert props["slot.name"] == "other"
    assert props["offset.storage.file.filename"].startswith(str(tmp_path))
    assert props["statistics.metrics.enabled"] == "false"  # nobody reads them: no JMX here
    kept = engine_properties(
        load_connector(SHOP), env, tmp_path, {"statistics.metrics.enabled": "true"}
    )
    assert kept["statistics.metrics.enabled"] == "true"


def test_missing_placeholder_value_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.database\.hostname.*CDC_SYNC_PG_HOST"):
        engine_properties(load_connector(SHOP), {}, tmp_path)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"value.converter.schemas.enable": "false"}, "config.value.converter.schemas.enable"),
        ({"plugin.name": "decoderbufs"}, "config.plugin.name"),
        ({"topic.prefix": ""}, "config.topic.prefix"),
        ({"slot.name": 5}, "config.slot.name"),
    ],
)
def test_invalid_settings_name_the_file_and_key(
    tmp_path: Path, change: dict[str, object], field: str
) -> None:
    doc = json.loads(SHOP.read_text())
    doc["config"].update(change)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as error:
        load_connector(bad)
    assert str(bad) in str(error.value) and field in str(error.value)


def test_topic_creation_settings_follow_kafka_connect() -> None:
    settings = TopicSettings.from_connector(load_connector(SHOP).config)
    assert settings.partitions == 1 and settings.replication_factor == 1
    # Log compaction (docs/internals.md): an hour uncompacted, tombstones 7 days.
    assert settings.config == {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": "3600000",
        "delete.retention.ms": "604800000",
    }


def test_shipped_connectors_emit_truncate_events() -> None:
    for path in (SHOP, Path("tests/adversarial/connector.json")):
        assert load_connector(path).config["skipped.operations"] == "none", path


@pytest.mark.parametrize(
    ("settings", "flagged"),
    [
        ({}, "skipped.operations"),  # Debezium's default skips truncates
        ({"skipped.operations": "t"}, "skipped.operations"),
        ({"skipped.operations": "u, t"}, "skipped.operations"),
        ({"skipped.operations": "none"}, None),
        ({"skipped.operations": "u"}, None),
        (
            {"skipped.operations": "none", "topic.creation.default.cleanup.policy": "compact"},
            "topic.creation.default.cleanup.policy",
        ),
    ],
)
def test_validate_warns_when_truncates_are_skipped_or_cannot_reach_kafka(
    settings: dict[str, str], flagged: str | None
) -> None:
    checks = truncate_checks(settings)
    assert [c.setting for c in checks] == ([flagged] if flagged else [])
    assert all(c.severity == "warning" for c in checks)


def test_keyless_events_get_a_key_naming_their_topic_for_compacted_topics() -> None:
    # Apache Kafka refuses keyless records on a compacted topic: Debezium's truncate events.
    truncate = Record("cdc.shop.orders", None, b'{"payload": {"op": "t"}}')
    key = record_key(truncate)
    assert key is not None and json.loads(key) == {"cdc_sync_keyless_event": "cdc.shop.orders"}
    keyed = Record("cdc.shop.orders", b'{"id": 1}', b"{}")
    assert record_key(keyed) == b'{"id": 1}'
    tombstone = Record("cdc.shop.orders", b'{"id": 1}', None)
    assert record_key(tombstone) == b'{"id": 1}'
