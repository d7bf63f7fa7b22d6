"""Producer settings: records keep their order on every broker flavour."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_sync.connectors.publisher import KafkaPublisher, TopicSettings
from cdc_sync.core.kafka_clients import producer_config

pytestmark = pytest.mark.unit

IN_FLIGHT = "max.in.flight.requests.per.connection"


@pytest.mark.parametrize("flavor", ["tansu", "noida"])
def test_without_idempotence_one_request_is_in_flight(flavor: str) -> None:
    config = producer_config("127.0.0.1:1", flavor)
    assert config["enable.idempotence"] is False  # the stand-ins' setting, kept
    assert config[IN_FLIGHT] == 1
    if flavor == "tansu":  # its ListOffsets workaround stays for every producer but one
        assert config["batch.num.messages"] == 1


def test_an_override_cannot_reopen_reordering() -> None:
    overrides: dict[str, Any] = {IN_FLIGHT: 5}
    config = producer_config("127.0.0.1:1", "tansu", **overrides)
    assert config[IN_FLIGHT] == 1


def test_idempotent_producers_keep_the_client_default() -> None:
    config = producer_config("127.0.0.1:1", "kafka")
    assert config["enable.idempotence"] is True
    assert IN_FLIGHT not in config  # idempotence keeps order with up to 5 in flight


def test_the_embedded_publisher_orders_its_records_on_the_stand_ins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[dict[str, object]] = []

    class Recording:
        def __init__(self, config: dict[str, object]) -> None:
            seen.append(config)

    monkeypatch.setattr("cdc_sync.connectors.publisher.Producer", Recording)
    monkeypatch.setattr("cdc_sync.connectors.publisher.AdminClient", Recording)
    KafkaPublisher("127.0.0.1:1", "tansu", TopicSettings.from_connector({}))
    producer = seen[0]
    assert producer["enable.idempotence"] is False
    assert producer[IN_FLIGHT] == 1
    assert producer["acks"] == "all"
    assert "batch.num.messages" not in producer  # it keeps Tansu's end offsets right itself
    assert producer["linger.ms"] == 5
