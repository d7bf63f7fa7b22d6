"""The per-partition version floor (the highest snapshot point): raised record by record in
offset order, kept across batches beside the checkpoint."""

import json
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_sync.job.decode.partition import (
    KIND_CHANGE,
    decode_and_fold,
    decode_batches,
    load_change,
)
from cdc_sync.job.decode.version_floors import (
    FileVersionFloors,
    Floors,
    StoredFloors,
    VersionFloorsCorrupt,
    raised,
)
from tests.envelopes import envelope_bytes, key_bytes, product

pytestmark = pytest.mark.unit
TOPIC = "cdc.shop.products"


def record(
    key: int, op: str, lsn: int, sequence: str, snapshot: str, name: str = "n"
) -> tuple[bytes, bytes]:
    envelope = json.loads(envelope_bytes("products", op, lsn, product(key, name=name)))
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


def versions(batches: list[pa.RecordBatch], floors: Floors) -> list[int]:
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


def test_a_batch_that_left_the_floors_as_it_found_them_is_not_written_yet_read_right(
    tmp_path: Path,
) -> None:
    """A batch that changed no floor spares its two fsyncs; what the file then tells a re-run of
    that batch, and the batches after it, is what it would have told them written."""
    path = tmp_path / "cdc_sync_versions.json"
    store = FileVersionFloors(path)
    assert store.load() == StoredFloors()
    store.save(StoredFloors(1, {}, {}))  # nothing held, nothing to hold: no file
    assert not path.exists()
    floors = {(TOPIC, 0): 1000}
    store.save(StoredFloors(2, {}, floors))
    written = path.stat().st_mtime_ns, path.read_text()
    store.save(StoredFloors(3, floors, floors))  # unchanged: not written
    store.save(StoredFloors(4, floors, floors))
    assert (path.stat().st_mtime_ns, path.read_text()) == written
    loaded = FileVersionFloors(path).load()
    assert loaded.for_batch(4) == loaded.for_batch(5) == floors  # a re-run of 4, and 5
    raised_again = {(TOPIC, 0): 2000}
    store.save(StoredFloors(5, floors, raised_again))  # changed: written
    again = FileVersionFloors(path)
    assert again.load() == StoredFloors(5, floors, raised_again)
    again.save(StoredFloors(6, raised_again, raised_again))  # as loaded: not written
    assert again.load() == StoredFloors(5, floors, raised_again)


def test_a_batch_rerun_after_a_crash_starts_from_the_floors_it_started_from() -> None:
    """Floors are saved before Spark commits the batch's offsets; a crash in between re-runs the
    batch under the same id. From its own floors, its first transaction after the snapshot would
    take the point of a later snapshot in the batch (2000, taken after key 1 was deleted at
    1250): the older update of key 1 would win over its delete."""
    snapshot = [record(k, "r", 1000, '[null,"1000"]', "true") for k in (1, 2)]
    first_after = record(1, "u", 900, '[null,"900"]', "false")
    deleted = record(1, "d", 1300, '["1250","1300"]', "false")
    resnapshot = record(2, "r", 2000, '[null,"2000"]', "true")
    records = [batch([*snapshot, first_after, deleted, resnapshot])]
    first_run = versions(records, {})
    assert first_run == [1000, 1000, 1000, 1250, 2000]
    stored = StoredFloors(7, {}, raised({}, {(TOPIC, 0): 2000}))
    assert versions(records, stored.for_batch(7)) == first_run
    assert versions(records, stored.after)[2] == 2000  # the hazard the batch id guards against


def test_an_unreadable_floors_file_names_itself(tmp_path: Path) -> None:
    store = FileVersionFloors(tmp_path / "cdc_sync_versions.json")
    store.path.write_text('{"format": 2, "partitions": [{"topic": "t"}]}')
    with pytest.raises(VersionFloorsCorrupt, match=r"cdc_sync_versions\.json"):
        store.load()


def test_floors_of_the_earlier_format_are_dropped(tmp_path: Path) -> None:
    """Format 1 held the highest version of any record, which would lift a re-sent first
    transaction above later ones: it is not read as snapshot points."""
    store = FileVersionFloors(tmp_path / "cdc_sync_versions.json")
    entries = [{"topic": TOPIC, "partition": 0, "version": 30875040}]
    old = {"format": 1, "batch": 3, "before": entries, "after": entries}
    store.path.write_text(json.dumps(old))
    assert store.load() == StoredFloors()


# Observed (tests/integration/test_debezium_ordering.py): capture restarted from the offsets
# stored at the end of the snapshot (the worker killed before its first flush after it) sends
# T1, T2, T3 again, T1 byte for byte as before: `[null, lsn]`, same lsn and txId.
S = 30874648
T1 = record(1, "u", 30874688, '[null,"30874688"]', "false", name="A")
T2 = record(1, "u", 30874864, '["30874864","30874864"]', "false", name="B")
T3 = record(2, "u", 30875040, '["30875040","30875040"]', "false", name="C")
SNAPSHOT = [record(k, "r", S, f'[null,"{S}"]', "true") for k in (1, 2)]


def folded(batches: list[pa.RecordBatch], floors: Floors) -> list[dict[str, object]]:
    return [r for b in decode_and_fold(iter(batches), floors=floors) for r in b.to_pylist()]


def newest_names(batches: list[pa.RecordBatch], floors: Floors) -> dict[str, object]:
    changes = [load_change(r) for r in folded(batches, floors) if r["kind"] == KIND_CHANGE]
    return {c.doc_id: (c.row or {}).get("name") for c in changes}


def kept_floors(batches: list[pa.RecordBatch]) -> Floors:
    """What the driver keeps after the batch: the side rows' snapshot points (job.stream)."""
    from cdc_sync.job.stream import SideRows

    return raised({}, SideRows(folded(batches, {})).floors)


def test_a_re_sent_first_transaction_is_not_lifted_above_the_transactions_after_it() -> None:
    """T1 sets key 1 to A, T2 sets it to B; both are sent again after T3. The re-sent T1 keeps
    T1's version (it needs lifting to the snapshot's point only, not to T3's version), below
    T2's: the key ends with B, in one batch or across batches."""
    once = [*SNAPSHOT, T1, T2, T3]
    again = [T1, T2, T3]
    assert versions([batch([*once, *again])], {}) == [
        S, S, 30874688, 30874864, 30875040, 30874688, 30874864, 30875040
    ]  # fmt: skip
    assert newest_names([batch([*once, *again])], {}) == {"1": "B", "2": "C"}
    # Across batches: the floors kept after the first batch do not lift the re-sent T1 either.
    kept = kept_floors([batch(once)])
    assert kept == {(TOPIC, 0): S}
    assert versions([batch(again)], kept) == [30874688, 30874864, 30875040]
    assert newest_names([batch(again)], kept) == {"1": "B", "2": "C"}


def test_the_first_transaction_after_a_snapshot_still_wins_when_it_wrote_before_the_point() -> None:
    """The snapshot case the floor is for, unchanged: a transaction written before S and
    committed after it streams as `[null, lsn < S]` and is lifted to S (the snapshot rows
    are read at S and do not hold it), in the batch and from the floors of earlier batches."""
    early = record(1, "u", S - 40, f'[null,"{S - 40}"]', "false", name="early")
    assert versions([batch([*SNAPSHOT, early])], {}) == [S, S, S]
    assert newest_names([batch([*SNAPSHOT, early])], {}) == {"1": "early", "2": "n"}
    assert versions([batch([early])], {(TOPIC, 0): S}) == [S]


def test_only_snapshot_reads_without_a_last_commit_raise_the_floor() -> None:
    """Streamed changes and incremental-snapshot rows (read while capture had a last commit)
    leave the floor where it is: lifting past them is what fenced out later transactions."""
    key, value = record(2, "r", 0, '["30875300","30875344"]', "incremental")
    envelope = json.loads(value)
    envelope["payload"]["source"]["lsn"] = None  # incremental rows carry no lsn
    incremental = (key, json.dumps(envelope).encode())
    rows = [*SNAPSHOT, T1, T2, T3, incremental]
    assert kept_floors([batch(rows)]) == {(TOPIC, 0): S}
    # A re-sent T1 after that chunk stays below T2.
    assert versions([batch([*rows, T1])], {})[-1] == 30874688
