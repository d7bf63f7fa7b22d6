"""A checkpoint the broker's topics no longer match (issue 28): the job refuses to start on it,
one line per consumer with the command that starts over, and `cdc-sync status` says which.

The quickstart re-run: capture stopped, the topics deleted (a broker reset), and the job started
on its old checkpoint sat idle without a word. Then capture starts over (offsets and slot gone:
a new snapshot) and the re-created topics end below the checkpoint's offsets.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from cdc_sync.core.kafka_clients import admin_config
from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.job.consumers import consumer_names
from cdc_sync.job.stale_checkpoints import StaleCheckpoints
from cdc_sync.status.gather import gather
from cdc_sync.status.verdict import Health, Thresholds, judge
from tests.adversarial.child import wait_for
from tests.e2e.conftest import EmbeddedCapture, Services
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.e2e.sinks_state import clean_sinks
from tests.pg import private_database

pytestmark = pytest.mark.e2e

REDIS_DB = 14  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9-13


@pytest.fixture
def stopped(services: Services, tmp_path: Path) -> Iterator[tuple[SyncHarness, EmbeddedCapture]]:
    """A pipeline that synced the seed rows and a round of updates, then stopped: the job and
    capture."""
    with private_database(services.pg_url, "stale_e2e") as database:
        connections = services.connections(database, REDIS_DB, tmp_path)
        create_demo_schema(database)
        mapping = e2e_mapping(f"stale{uuid.uuid4().hex[:6]}")
        clean_sinks(mapping, connections)
        prefix = mapping.topic_prefix
        capture = EmbeddedCapture(
            connections,
            tmp_path,
            {"topic.prefix": prefix, "slot.name": f"{prefix}_slot", "publication.name": prefix},
        )
        harness = SyncHarness(services.spark, mapping, connections, tmp_path)
        with capture.running():
            harness.start()
            try:
                # More records than a new snapshot has: the old offsets end above its ends.
                harness.run_sql(["UPDATE shop.customers SET updated_at = now()"] * 3)
                harness.wait_converged(timeout_seconds=300)
            finally:
                harness.stop()
        try:
            yield harness, capture
        finally:
            harness.stop()


def delete_topics(harness: SyncHarness) -> None:
    admin = AdminClient(admin_config(harness.connections.require("kafka_bootstrap")))
    topics = harness.mapping.topics()
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        future.result(timeout=60)
    wait_for(
        "topics deleted",
        lambda: not set(topics) & set(admin.list_topics(timeout=10).topics),
        60.0,
        0.5,
    )


def stale_reasons(harness: SyncHarness) -> tuple[Health, list[str]]:
    snapshot = gather(
        harness.mapping, harness.connections, harness.root / "checkpoints" / "main", None
    )
    verdict = judge(snapshot, Thresholds())
    return verdict.health, [r for r in verdict.reasons if "Start over" in r]


def test_a_checkpoint_the_topics_no_longer_match_is_named_per_consumer(
    stopped: tuple[SyncHarness, EmbeddedCapture],
) -> None:
    harness, capture = stopped
    consumers = consumer_names(harness.mapping)
    checkpoint = harness.root / "checkpoints" / "main"
    delete_topics(harness)

    # Topics missing: before, the job started and idled on them without a word.
    with pytest.raises(StaleCheckpoints) as missing:
        harness.start()
    harness.stop()
    lines = str(missing.value).splitlines()
    assert len(lines) == len(consumers)
    for name, line in zip(consumers, lines, strict=True):
        where = checkpoint / name.replace("documents:", "documents/")
        assert f"consumer {name}: checkpoint {where}: it read topics the broker does not" in line
        assert f"Start over: `rm -r {where}`" in line
        assert "`cdc-sync run --checkpoint NEW_DIR`" in line
    health, reasons = stale_reasons(harness)
    assert health is Health.STOPPED and len(reasons) == len(consumers)

    # Capture starts over (new snapshot, new slot): the topics are back, ending below the
    # checkpoint's offsets. Before, the first batch failed with a Spark trace.
    # (the embedded capture of these tests drops its slot when it stops)
    shutil.rmtree(capture.state_dir)
    with capture.running():
        with pytest.raises(StaleCheckpoints) as ahead:
            harness.start()
        harness.stop()
        lines = str(ahead.value).splitlines()
        assert len(lines) == len(consumers)
        ends = f"it is ahead of the topics' ends ({harness.mapping.topic_prefix}.shop."
        assert all(ends in line and "the broker's end" in line for line in lines), lines
        health, reasons = stale_reasons(harness)
        assert health is Health.STOPPED and len(reasons) == len(consumers)
        assert all("ahead of the topics' ends" in reason for reason in reasons)

        # Under failOnDataLoss=false the job says so and goes on, from the new topics' start.
        harness.start(fail_on_data_loss=False)
        harness.wait_converged(timeout_seconds=300)
        harness.stop()
