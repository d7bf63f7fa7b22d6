"""Dead letters on a real broker: a batch that re-runs after its dead letters were written does
not write them again."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest

from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.job.settle.applier import BatchApplier, BatchMetrics
from cdc_sync.job.settle.dead_letter import DeadLetterLedger, DeadLetterWriter
from cdc_sync.mapping import OnMalformed, Policies
from cdc_sync.status.broker import record_count
from tests.changes import change, mapping_of, products_route
from tests.fixtures.services import KafkaEndpoint
from tests.unit.test_applier_policies import RefusingSink

pytestmark = pytest.mark.integration


class FailOnce:
    """An observer that fails the first batch it sees (after the dead letters were written)."""

    def __init__(self) -> None:
        self.failed = False

    def __call__(self, metrics: BatchMetrics) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("observer failed after the dead letters were written")


def test_a_re_run_batch_writes_its_dead_letters_once(kafka: KafkaEndpoint, tmp_path: Path) -> None:
    topic = f"dead-letters-{uuid.uuid4().hex[:8]}"
    route = dataclasses.replace(
        products_route(), policies=Policies(on_malformed=OnMalformed.DEAD_LETTER)
    )
    mapping = mapping_of(route)
    row = {"id": 1, "sku": "s1", "name": "n", "description": None, "price": None, "in_stock": True}
    refused = [change(route, "c", 100, 1, row), change(route, "u", 200, 2, row)]
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()

    def run(batch_id: int, *observers: FailOnce) -> None:
        # A new writer and applier each time: the re-run happens in a restarted job.
        letters = DeadLetterWriter(
            kafka.bootstrap, kafka.flavor, topic, DeadLetterLedger.beside_checkpoint(checkpoint)
        )
        applier = BatchApplier(mapping, [RefusingSink()], letters, observers=observers)
        try:
            applier.apply(
                batch_id,
                records=2,
                changes=2,
                compacted=[refused[batch_id % 2]],
                rejected=[],
                schemas={},
                schema_fps=[None],
            )
        finally:
            letters.close()

    with pytest.raises(RuntimeError, match="observer failed"):
        run(4, FailOnce())
    config = consumer_config(kafka.bootstrap, kafka.flavor, "dead-letter-count")
    assert record_count(config, topic) == 1
    run(4)  # the re-run, under the same batch id
    assert record_count(config, topic) == 1
    run(5)  # the next batch writes its own
    assert record_count(config, topic) == 2
