"""The job's metrics endpoint during a live sync: scraped over HTTP, checked against the writes.

Runs after test_sync.py on the session's pipeline (embedded capture, then a Kafka Connect worker):
the job is restarted on its checkpoint with a metrics port, and put back as it was afterwards.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from functools import partial

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdc_sync.connectors.rest import ConnectClient
from tests.e2e.harness import SyncHarness

pytestmark = pytest.mark.e2e

CUSTOMERS = "shop.customers"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> tuple[str, Samples]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return text, samples


def get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def wait_for(port: int, ready: Callable[[Samples], bool], timeout: float = 60) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        _, samples = scrape(port)
        if ready(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics not as expected within {timeout}s: {samples}")
        time.sleep(0.5)


@pytest.fixture
def metered(pipeline: SyncHarness, request: pytest.FixtureRequest) -> Iterator[SyncHarness]:
    """The session's job restarted with metrics on any free port; restarted plain afterwards."""
    status = None
    if request.node.callspec.params.get("pipeline") == "connect":
        client = ConnectClient(request.getfixturevalue("connect_url"), timeout=5)
        status = partial(client.status, pipeline.mapping.topic_prefix)
    # The running job has started its source (a Python worker) before it is replaced: two
    # source workers spawned back to back can miss Spark's connect-back window on a busy machine.
    pipeline.wait_converged(timeout_seconds=300)
    pipeline.stop()
    pipeline.start(connector_status=status, metrics_port=0, metrics_probe_seconds=1.0)
    try:
        yield pipeline
    finally:
        pipeline.stop()
        pipeline.start()


def test_metrics_count_what_was_written(
    metered: SyncHarness, request: pytest.FixtureRequest
) -> None:
    assert metered.job is not None and metered.job.metrics_port
    port = metered.job.metrics_port
    assert metered.job.metrics is not None
    assert metered.job.metrics.address == ("127.0.0.1", port), "binds loopback by default"
    metered.wait_converged()  # a batch cut short by the restart has re-run by now
    _, before = scrape(port)
    sinks = [sink.name for sink in metered.job.sinks]
    tag = uuid.uuid4().hex[:8]
    emails = [f"metrics-{tag}-{n}@example.com" for n in range(5)]
    values = ", ".join(f"('{email}', 'Metrics Probe {tag}')" for email in emails)
    # One change per key per step, so compaction cannot merge them: 5 inserts, then 2 updates
    # and 1 delete of other keys.
    metered.run_sql([f"INSERT INTO shop.customers (email, full_name) VALUES {values}"])
    metered.wait_converged()
    metered.run_sql(
        [
            f"UPDATE shop.customers SET tier = 'gold' WHERE email IN ('{emails[0]}','{emails[1]}')",
            f"DELETE FROM shop.customers WHERE email = '{emails[4]}'",
        ]
    )
    metered.wait_converged()

    def applied(samples: Samples, sink: str) -> float:
        return get(samples, "cdc_sync_sink_applied_total", table=CUSTOMERS, sink=sink)

    after = wait_for(port, lambda s: all(applied(s, k) - applied(before, k) >= 8 for k in sinks))
    for sink in sinks:
        assert applied(after, sink) - applied(before, sink) == 8, sink
        for outcome in ("fenced", "failed"):
            name = f"cdc_sync_sink_{outcome}_total"
            labels = {"table": CUSTOMERS, "sink": sink}
            assert get(after, name, **labels) == get(before, name, **labels), (sink, outcome)
        assert get(after, "cdc_sync_sink_state", sink=sink, state="ok") == 1
    changes = "cdc_sync_table_changes_total"
    # Each consumer of the log (one per sink, job.consumers) reports its own progress.
    for consumer in ("search", "redis", "delta"):
        mine = {"consumer": consumer, "table": CUSTOMERS}
        assert get(after, changes, **mine) - get(before, changes, **mine) == 8, consumer
        assert get(after, "cdc_sync_dead_lettered_records_total", consumer=consumer) == get(
            before, "cdc_sync_dead_lettered_records_total", consumer=consumer
        )
        assert 0 <= get(after, "cdc_sync_lag_seconds", **mine) < 300
        assert get(after, "cdc_sync_applied_version", **mine) > 0
        assert get(after, "cdc_sync_batch_stage_seconds_count", consumer=consumer, stage="decode")

    topic = f"{metered.mapping.topic_prefix}.{CUSTOMERS}"
    prefix = metered.mapping.topic_prefix

    def caught_up(samples: Samples) -> bool:
        where = {("consumer", "search"), ("topic", topic), ("partition", "0")}
        lag = ("cdc_sync_lag_records", frozenset(where))
        slot = ("cdc_sync_slot_retained_wal_bytes", frozenset({("slot", f"{prefix}_slot")}))
        return samples.get(lag) == 0 and slot in samples

    settled = wait_for(port, caught_up, timeout=30)
    assert get(settled, "cdc_sync_probe_success", probe="broker") == 1
    assert get(settled, "cdc_sync_probe_success", probe="slot") == 1
    if request.node.callspec.params.get("pipeline") == "connect":
        settled = wait_for(port, lambda s: get(s, "cdc_sync_probe_success", probe="connector") == 1)
        assert get(settled, "cdc_sync_connector_state", state="RUNNING") == 1
        assert get(settled, "cdc_sync_connector_tasks", state="RUNNING") >= 1

    text, _ = scrape(port)
    assert tag not in text, "a row value reached the metrics"
