"""A Kafka tombstone is the compacted log's delete (log-compaction semantics)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from cdc_sync.core.model import (
    UNVERSIONED,
    Change,
    Coordinates,
    Op,
    TableId,
    Tombstone,
    tombstone_delete,
)
from cdc_sync.job.decode.fold import fold_key
from cdc_sync.job.decode.partition import KIND_CHANGE, decode_and_fold, load_change
from tests.envelopes import envelope_bytes, key_bytes, product

pytestmark = pytest.mark.unit
TABLE = TableId("shop", "products")


def change(version: int, offset: int, op: Op = Op.UPDATE) -> Change:
    row = None if op is Op.DELETE else {"id": 1, "v": version}
    return Change(TABLE, (("id", 1),), op, version, row, Coordinates("t", 0, offset))


def tombstone(offset: int) -> Change:
    return tombstone_delete(Tombstone(TABLE, (("id", 1),), Coordinates("t", 0, offset)))


def test_a_tombstone_alone_is_an_unversioned_delete() -> None:
    state = fold_key([tombstone(9)])
    assert state.is_delete and state.version == UNVERSIONED and state.is_unversioned


def test_a_tombstone_after_its_delete_event_is_that_delete() -> None:
    state = fold_key([change(10, 0), change(20, 1, Op.DELETE), tombstone(2)])
    assert state.is_delete and state.version == 20


def test_a_tombstone_whose_delete_event_was_compacted_deletes_at_the_last_version() -> None:
    # The log cleaner kept the key's update and tombstone but not the delete event between them.
    state = fold_key([change(10, 0), tombstone(5)])
    assert state.is_delete and state.version == 10


def test_a_change_after_the_tombstone_in_the_log_wins() -> None:
    state = fold_key([tombstone(3), change(40, 4, Op.CREATE)])
    assert not state.is_delete and state.version == 40
    state = fold_key([change(10, 0), change(20, 1, Op.DELETE), tombstone(2), change(30, 3)])
    assert not state.is_delete and state.version == 30


def test_a_delete_after_a_create_in_one_transaction_is_settled_by_postgres() -> None:
    """Two rows swapping keys (deferrable keys) reads, for key b: create(b) then delete(b), both
    at the transaction's version, though Postgres holds b: the fold asks for Postgres."""
    state = fold_key([change(10, 0), change(50, 1, Op.CREATE), change(50, 2, Op.DELETE)])
    assert state.is_delete and state.resolve_from_source


def test_a_delete_in_a_later_transaction_is_just_a_delete() -> None:
    state = fold_key([change(50, 1, Op.CREATE), change(60, 2, Op.DELETE)])
    assert state.is_delete and not state.resolve_from_source


def test_a_swap_that_is_the_first_transaction_after_a_snapshot_is_settled_by_postgres() -> None:
    """Streamed as `[null, lsn]`, its changes are versioned by their own lsns: key 2's create and
    delete differ in version (tests/e2e/test_key_swaps.py observes it); their txId tells they
    are one transaction."""

    def record(key: int, op: str, lsn: int) -> tuple[bytes, bytes | None]:
        if op == "ts":
            return key_bytes("products", {"id": key}), None
        after, before = (None, product(key)) if op == "d" else (product(key), None)
        envelope = json.loads(envelope_bytes("products", op, lsn, after, before=before))
        snapshot = "true" if op == "r" else "false"
        sequence = json.dumps([None, str(lsn)])
        envelope["payload"]["source"].update(sequence=sequence, txId=77, snapshot=snapshot)
        return key_bytes("products", {"id": key}), json.dumps(envelope).encode()

    records = [record(1, "r", 1000), record(2, "r", 1000)]
    records += [record(1, "d", 1200), record(1, "ts", 0), record(2, "c", 1200)]
    records += [record(2, "d", 1300), record(2, "ts", 0), record(1, "c", 1300)]
    batch = pa.RecordBatch.from_pydict(
        {
            "key": [k for k, _ in records],
            "value": [v for _, v in records],
            "topic": ["cdc.shop.products"] * len(records),
            "partition": [0] * len(records),
            "offset": list(range(len(records))),
        }
    )
    rows = decode_and_fold(iter([batch]), tombstone_deletes=frozenset({"shop.products"}))
    folded = [load_change(r) for out in rows for r in out.to_pylist() if r["kind"] == KIND_CHANGE]
    state = {c.doc_id: c for c in folded}
    assert state["2"].is_delete and state["2"].resolve_from_source
    assert state["1"].op is Op.CREATE
