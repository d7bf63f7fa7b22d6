"""confluent-kafka client settings per broker flavour.

The local stack's Kafka-protocol stand-ins have known quirks (see docs/stacks.md):
Tansu reports a wrong LATEST offset when one produce batch holds several records, and its group
joins take about half the session timeout; noida ignores fetch size limits. Every producer and
consumer in the project takes its config from here so the workarounds live in one place.
"""

from __future__ import annotations

from typing import Any

NOIDA_RECEIVE_MAX_BYTES = 2_147_483_647  # librdkafka's largest receive.message.max.bytes


def producer_config(
    bootstrap: str, flavor: str, *, single_record_batches: bool = True, **overrides: Any
) -> dict[str, Any]:
    """Every producer's settings. Without idempotence (the stand-ins), a retried produce request
    could land after the next one and reorder a key's records (a transaction's delete after its
    create, say): one request in flight per connection keeps the order.

    `single_record_batches=False`: on Tansu, a producer that keeps its end offsets right itself
    (the capture's publisher sends each partition's last record alone): batches of records
    produce ~30x faster there (one a batch: ~3.3k msg/s; batched: ~95k, 2 kB records)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": flavor == "kafka",
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "none",
    }
    if flavor == "tansu" and single_record_batches:
        # One record per produce batch keeps Tansu's ListOffsets(LATEST) right.
        config.update({"batch.num.messages": 1, "linger.ms": 0})
    config.update(overrides)
    if not config["enable.idempotence"]:
        config["max.in.flight.requests.per.connection"] = 1
    return config


def consumer_config(
    bootstrap: str, flavor: str, group_id: str | None = None, **overrides: Any
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "session.timeout.ms": 6000,
        # The stand-ins do not bound fetch sizes themselves; keep one fetch modest.
        "fetch.max.bytes": 8 * 1024 * 1024,
        "max.partition.fetch.bytes": 4 * 1024 * 1024,
    }
    if flavor == "noida":
        # noida answers a fetch with the partition's whole rest, whatever the fetch limits say;
        # above librdkafka's default response limit (100 MB) every fetch failed and a read of
        # a snapshot's backlog got nothing until its timeout. Take any response it sends.
        config["receive.message.max.bytes"] = NOIDA_RECEIVE_MAX_BYTES
    config["group.id"] = group_id or "cdc-sync-reader"
    config.update(overrides)
    return config


def admin_config(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap}
