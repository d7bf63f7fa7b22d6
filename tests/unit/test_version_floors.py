"""The per-partition version floor: raised record by record in offset order, kept across
batches beside the checkpoint."""

import json
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_sync.job.decode import decode_batches
from cdc_sync.job.version_floors import (
    FileVersionFloors,
    StoredFloors,
    VersionFloorsCorrupt,
    raised,
)
from tests.envelopes import envelope_bytes, key_bytes, product

pytestmark = pytest.mark.unit
TOPIC = "cdc.shop.products"


def record(key: int, op: str, lsn: int, sequence: str, snapshot: str) -> tuple[bytes, bytes]:
    envelope = json.loads(envelope_bytes("products", op, lsn, product(key)))
    envelope["payload"]["source"].update(sequence=sequence, snapshot=snapshot)
    return key_bytes("products", {"id": key}), json.dumps(envelope).encode()


def batch(records: list[tuple[bytes, bytes]], partition: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "key": [k for k, _ in records],
            "value": [v for _, v in records],
            "topic": [TOPIC] * len(records),
            "partition": [partition] * len(records),
            "offset": list(range(len(records))),
        }
    )


def versions(batches: list[pa.RecordBatch], floors: dict[tuple[str, int], int]) -> list[int]:
    return [
        r["version"] for b in decode_batches(iter(batches), floors=floors) for r in b.to_pylist()
    ]


def test_snapshot_rows_lift_the_first_streamed_transaction_in_the_same_batch() -> None:
    snapshot = [record(k, "r", 1000, '[null,"1000"]', "true") for k in (1, 2)]
    first_after = record(1, "u", 900, '[null,"900"]', "false")  # wrote before S, committed after
    next_tx = record(2, "u", 1300, '["1250","1300"]', "false")
    assert versions([batch(snapshot), batch([first_after, next_tx])], {}) == [
        1000,
        1000,
        1000,
        1250,
    ]


def test_the_floor_of_an_earlier_batch_applies_and_partitions_are_separate() -> None:
    first_after = record(1, "u", 900, '[null,"900"]', "false")
    assert versions([batch([first_after])], {(TOPIC, 0): 1000}) == [1000]
    assert versions([batch([first_after], partition=1)], {(TOPIC, 0): 1000}) == [900]
    assert versions([batch([first_after])], {}) == [900]  # without a floor: its own lsn


def test_floors_survive_a_restart_and_only_grow(tmp_path: Path) -> None:
    store = FileVersionFloors.beside_checkpoint(tmp_path / "checkpoint")
    assert store.load() == StoredFloors()
    floors = raised({(TOPIC, 0): 1000, (TOPIC, 1): 5}, {(TOPIC, 0): 900, ("other", 0): 7})
    assert floors == {(TOPIC, 0): 1000, (TOPIC, 1): 5, ("other", 0): 7}
    store.save(StoredFloors(3, {(TOPIC, 0): 1000}, floors))
    loaded = FileVersionFloors.beside_checkpoint(tmp_path / "checkpoint").load()
    assert loaded == StoredFloors(3, {(TOPIC, 0): 1000}, floors)
    assert loaded.for_batch(4) == floors


def test_a_batch_rerun_after_a_crash_starts_from_the_floors_it_started_from() -> None:
    """Floors are saved before Spark commits the batch's offsets; a crash in between re-runs the
    batch under the same id. From its own floors, its first transaction after the snapshot would
    take the version of the batch's last transaction (1400), above the transaction in between
    (1250): the older change of key 1 would win."""
    snapshot = [record(k, "r", 1000, '[null,"1000"]', "true") for k in (1, 2)]
    first_after = record(1, "u", 900, '[null,"900"]', "false")
    between = record(1, "u", 1300, '["1250","1300"]', "false")
    last = record(2, "u", 1450, '["1400","1450"]', "false")
    records = [batch([*snapshot, first_after, between, last])]
    first_run = versions(records, {})
    assert first_run == [1000, 1000, 1000, 1250, 1400]
    stored = StoredFloors(7, {}, raised({}, {(TOPIC, 0): max(first_run)}))
    assert versions(records, stored.for_batch(7)) == first_run
    assert versions(records, stored.after)[2] == 1400  # the hazard the batch id guards against


def test_an_unreadable_floors_file_names_itself(tmp_path: Path) -> None:
    store = FileVersionFloors(tmp_path / "cdc_sync_versions.json")
    store.path.write_text('{"format": 1, "partitions": [{"topic": "t"}]}')
    with pytest.raises(VersionFloorsCorrupt, match=r"cdc_sync_versions\.json"):
        store.load()
