"""Deferrable-key swaps settled by Postgres within a batch and across batch boundaries.

`UPDATE t SET id = 3 - id` reaches Kafka as d(1) ts(1) c(2) d(2) ts(2) c(1) in one transaction
(tests/integration/test_debezium_key_swaps.py). A delete after a create of the same key in the
same transaction is settled by reading Postgres (job.decode.fold); the batch holding the create
hands the key to the next batch (job.decode.open_transactions) when the boundary falls inside the
swap.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
from cdc_sync.job.decode.batch_state import Where
from cdc_sync.job.decode.fold import OpenTransaction, Transaction, fold_key, left_open
from cdc_sync.job.decode.open_transactions import (
    FileOpenTransactions,
    OpenTransactionsCorrupt,
    StoredOpenTransactions,
    carried_on,
)
from cdc_sync.job.decode.partition import (
    KIND_CHANGE,
    KIND_OPEN,
    decode_and_fold,
    load_change,
)
from tests.envelopes import envelope_bytes, key_bytes, product

pytestmark = pytest.mark.unit
TABLE = TableId("shop", "products")
TOPIC = "cdc.shop.products"
WHERE = (TOPIC, 0)


# -- the fold rule ---------------------------------------------------------------------------


def change(key: int, op: Op, version: int, offset: int, transaction: int | None = None) -> Change:
    row = None if op is Op.DELETE else {"id": key, "v": version}
    return Change(
        TABLE, (("id", key),), op, version, row, Coordinates(TOPIC, 0, offset),
        transaction=transaction,
    )  # fmt: skip


def tombstone(key: int, offset: int) -> Change:
    return tombstone_delete(Tombstone(TABLE, (("id", key),), Coordinates(TOPIC, 0, offset)))


def test_a_delete_of_a_key_the_last_transaction_of_the_batch_before_created_is_settled() -> None:
    """Boundary between c(2) and d(2): the next batch holds d(2) ts(2) of the same transaction."""
    carried = Transaction(50)
    state = fold_key([change(2, Op.DELETE, 50, 3), tombstone(2, 4)], carried)
    assert state.is_delete and state.resolve_from_source and state.version == 50
    # Without what the batch before handed on, the same records are a plain delete.
    assert not fold_key([change(2, Op.DELETE, 50, 3), tombstone(2, 4)]).resolve_from_source


def test_a_tombstone_opening_a_carried_keys_changes_takes_its_transaction() -> None:
    """Boundary between d(2) and ts(2): the lone tombstone follows the settled delete."""
    state = fold_key([tombstone(2, 4)], Transaction(50))
    assert state.version == 50 and not state.is_unversioned and state.resolve_from_source
    alone = fold_key([tombstone(2, 4)])
    assert alone.is_unversioned and not alone.resolve_from_source  # deletes whatever is held


def test_a_carried_key_deleted_by_a_later_transaction_is_just_deleted() -> None:
    state = fold_key([change(2, Op.DELETE, 60, 3), tombstone(2, 4)], Transaction(50))
    assert state.is_delete and not state.resolve_from_source and state.version == 60


def test_the_first_transaction_after_a_snapshot_is_one_transaction_by_its_txid() -> None:
    """Its changes are versioned by their own positions: create and delete differ in version."""
    state = fold_key([change(2, Op.CREATE, 103, 2, 9), change(2, Op.DELETE, 104, 3, 9)])
    assert state.resolve_from_source
    carried = Transaction(103, 9)
    assert fold_key([change(2, Op.DELETE, 104, 3, 9)], carried).resolve_from_source
    other = fold_key([change(2, Op.CREATE, 103, 2, 9), change(2, Op.DELETE, 104, 3, 10)])
    assert not other.resolve_from_source


def test_which_keys_the_last_transaction_leaves_open() -> None:
    tail = Transaction(50)
    created = [change(2, Op.CREATE, 50, 2)]
    assert left_open(created[0], created, tail, None)
    settled = fold_key([*created, change(2, Op.DELETE, 50, 3)])
    assert left_open(settled, [*created, change(2, Op.DELETE, 50, 3)], tail, None)
    updated = [change(3, Op.CREATE, 40, 0), change(3, Op.UPDATE, 50, 1)]
    assert not left_open(updated[1], updated, tail, None)  # not created by the tail
    assert left_open(updated[1], updated[1:], tail, Transaction(50))  # created before: carried
    deleted = [change(4, Op.CREATE, 40, 0), change(4, Op.DELETE, 50, 1)]
    assert not left_open(fold_key(deleted), deleted, tail, None)
    assert not left_open(created[0], created, Transaction(60), None)  # an older transaction
    snapshot = [change(5, Op.READ, 50, 0)]
    assert not left_open(snapshot[0], snapshot, tail, None)


# -- across batches, through the decode stage, with a stand-in for the sinks and Postgres -------


def record(
    key: int, op: str, lsn: int, commit: int | None, txid: int, name: str = "n"
) -> tuple[bytes, bytes | None]:
    """A record as Debezium writes it (`op` "ts": the tombstone after a delete)."""
    if op == "ts":
        return key_bytes("products", {"id": key}), None
    after = None if op == "d" else product(key, name=name)
    before = product(key) if op == "d" else None
    envelope = json.loads(envelope_bytes("products", op, lsn, after, before=before))
    sequence = json.dumps([None if commit is None else str(commit), str(lsn)])
    snapshot = "true" if op == "r" else "false"
    envelope["payload"]["source"].update(sequence=sequence, txId=txid, snapshot=snapshot)
    return key_bytes("products", {"id": key}), json.dumps(envelope).encode()


def swap(
    a: int, b: int, commit: int | None, lsn: int, txid: int
) -> list[tuple[bytes, bytes | None]]:
    """Keys a and b swapped in one transaction: d(a) ts(a) c(b) d(b) ts(b) c(a)."""
    return [
        record(a, "d", lsn, commit, txid),
        record(a, "ts", 0, None, 0),
        record(b, "c", lsn + 1, commit, txid, name=f"was {a}"),
        record(b, "d", lsn + 2, commit, txid),
        record(b, "ts", 0, None, 0),
        record(a, "c", lsn + 3, commit, txid, name=f"was {b}"),
    ]


def arrow(records: Sequence[tuple[bytes, bytes | None]], start: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "key": [k for k, _ in records],
            "value": [v for _, v in records],
            "topic": [TOPIC] * len(records),
            "partition": [0] * len(records),
            "offset": list(range(start, start + len(records))),
        }
    )


Sink = dict[str, tuple[int, Mapping[str, Any] | None]]


def apply(sink: Sink, changes: list[Change], postgres: Mapping[str, Mapping[str, Any]]) -> None:
    """Version-fenced writes (>=), as every sink does; a change the fold hands to Postgres is
    settled from `postgres` (job.write.unavailable); an unversioned delete removes whatever is
    held."""
    for c in changes:
        row = c.row
        if c.resolve_from_source:
            row = postgres.get(c.doc_id)
        elif c.is_delete:
            row = None
        if c.is_unversioned:
            sink.pop(c.doc_id, None)
            continue
        held = sink.get(c.doc_id)
        if held is None or c.version >= held[0]:
            sink[c.doc_id] = (c.version, row)


def run_batches(
    records: Sequence[tuple[bytes, bytes | None]],
    per_batch: int,
    postgres: Mapping[str, Mapping[str, Any]],
    store: FileOpenTransactions | None = None,
    rerun: bool = False,
) -> Sink:
    """The records in batches of `per_batch` (maxOffsetsPerTrigger), each decoded and folded
    from the open transactions the batch before left (kept in `store` when given: a restart
    between every two batches), each applied to a stand-in sink; `rerun`: every batch runs
    twice under its id (a crash after the sinks acknowledged, before the offsets commit)."""
    sink: Sink = {}
    stored = StoredOpenTransactions()
    for batch_id, start in enumerate(range(0, len(records), per_batch)):
        for _ in range(2 if rerun else 1):
            if store is not None:
                stored = store.load()
            before = stored.for_batch(batch_id)
            rows = [
                r
                for out in decode_and_fold(
                    iter([arrow(records[start : start + per_batch], start)]),
                    tombstone_deletes=frozenset({str(TABLE)}),
                    open_transactions=before,
                )
                for r in out.to_pylist()
            ]
            apply(sink, [load_change(r) for r in rows if r["kind"] == KIND_CHANGE], postgres)
            reported = {
                (r["topic"], r["partition"]): _open(r) for r in rows if r["kind"] == KIND_OPEN
            }
            stored = StoredOpenTransactions(batch_id, before, carried_on(before, reported))
            if store is not None:
                store.save(stored)
    return sink


def _open(row: dict[str, object]) -> OpenTransaction:
    from cdc_sync.job.decode.partition import open_transaction

    return open_transaction(row)


def held(sink: Sink) -> dict[str, object]:
    return {key: (row or {}).get("name") for key, (_, row) in sink.items() if row is not None}


SNAPSHOT = [record(1, "r", 1000, None, 5, name="one"), record(2, "r", 1000, None, 5, name="two")]
# Postgres after the swap: key 1 holds the row that was key 2 and the other way round.
SWAPPED = {"1": {"name": "was 2"}, "2": {"name": "was 1"}}


@pytest.mark.parametrize("per_batch", [1, 2, 3, 4, 5, 6, 7, 100])
@pytest.mark.parametrize("first_after_snapshot", [False, True])
def test_a_swap_converges_wherever_batch_boundaries_fall(
    per_batch: int, first_after_snapshot: bool
) -> None:
    """Every maxOffsetsPerTrigger puts the boundaries at other points of the swap (and of a
    second one after it): each settles from Postgres. The first transaction after a snapshot
    (`[null, lsn]`, versioned by its own lsn) included."""
    commit = None if first_after_snapshot else 1100
    records = [*SNAPSHOT, *swap(1, 2, commit, 1200, 77), *swap(2, 1, 1300, 1400, 78)]
    postgres = {"1": {"name": "was 2"}, "2": {"name": "was 1"}}  # both rows' final places
    assert held(run_batches(records, per_batch, postgres)) == {"1": "was 2", "2": "was 1"}


@pytest.mark.parametrize("per_batch", [1, 2, 3, 4, 5])
def test_a_chain_through_a_key_leaves_it_deleted_across_boundaries(per_batch: int) -> None:
    """5 -> 6 -> 5 in one transaction emits a swap's events; Postgres does not hold 6."""
    records = [record(5, "c", 900, 800, 4, name="five"), *swap(5, 6, 1100, 1200, 77)]
    postgres = {"5": {"name": "was 6"}}  # the row back at 5 (what c(5) carries)
    sink = run_batches(records, per_batch, postgres)
    assert held(sink) == {"5": "was 6"}


@pytest.mark.parametrize("per_batch", [1, 2, 3, 4])
def test_a_restart_or_a_re_run_batch_between_the_halves_of_a_swap_is_harmless(
    per_batch: int, tmp_path: Path
) -> None:
    records = [*SNAPSHOT, *swap(1, 2, 1100, 1200, 77)]
    store = FileOpenTransactions.beside_checkpoint(tmp_path)
    assert held(run_batches(records, per_batch, SWAPPED, store)) == {"1": "was 2", "2": "was 1"}
    rerun_store = FileOpenTransactions.beside_checkpoint(tmp_path / "rerun")
    sink = run_batches(records, per_batch, SWAPPED, rerun_store, rerun=True)
    assert held(sink) == {"1": "was 2", "2": "was 1"}


def test_a_long_transaction_keeps_its_created_keys_open_through_batches_without_them() -> None:
    """c(2), then records of other keys of the same transaction, then d(2) batches later."""
    tx = [record(2, "c", 1201, 1100, 77, name="was 1")]
    tx += [record(k, "c", 1202 + k, 1100, 77) for k in range(10, 16)]
    tx += [record(2, "d", 1300, 1100, 77), record(2, "ts", 0, None, 0)]
    tx += [record(2, "c", 1301, 1100, 77, name="back")]  # d(2) is settled; then 2 returns
    postgres = {"2": {"name": "back"}} | {str(k): {"name": "n"} for k in range(10, 16)}
    for per_batch in (1, 2, 3):
        assert held(run_batches(tx, per_batch, postgres))["2"] == "back"
    tx_ends = [*tx[:-1]]  # the transaction ends with d(2) ts(2): Postgres holds 2 (a swap)
    postgres["2"] = {"name": "swapped in"}
    for per_batch in (1, 2, 3):
        assert held(run_batches(tx_ends, per_batch, postgres))["2"] == "swapped in"


# -- the state beside the checkpoint -----------------------------------------------------------


def test_open_transactions_survive_a_restart_and_a_rerun_starts_from_the_batch_before(
    tmp_path: Path,
) -> None:
    store = FileOpenTransactions.beside_checkpoint(tmp_path / "checkpoint")
    assert store.load() == StoredOpenTransactions()
    before: dict[Where, OpenTransaction] = {
        WHERE: OpenTransaction(Transaction(50), frozenset({"2"}))
    }
    after = carried_on(
        before, {(TOPIC, 1): OpenTransaction(Transaction(70, 9), frozenset({"a|b"}))}
    )
    assert after == {**before, (TOPIC, 1): OpenTransaction(Transaction(70, 9), frozenset({"a|b"}))}
    store.save(StoredOpenTransactions(4, before, after))
    loaded = FileOpenTransactions.beside_checkpoint(tmp_path / "checkpoint").load()
    assert loaded.for_batch(4) == before  # the re-run of batch 4
    assert loaded.for_batch(5) == after
    # A partition whose last transaction left nothing open is dropped.
    assert carried_on(after, {WHERE: OpenTransaction(Transaction(60))}) == {
        (TOPIC, 1): after[(TOPIC, 1)]
    }


def test_an_unreadable_open_transactions_file_names_itself(tmp_path: Path) -> None:
    store = FileOpenTransactions.beside_checkpoint(tmp_path)
    store.path.write_text('{"format": 1, "batch": 1, "before": [{"topic": "t"}], "after": []}')
    with pytest.raises(OpenTransactionsCorrupt, match=r"cdc_sync_open_transactions\.json"):
        store.load()


def test_unversioned_is_what_a_lone_tombstone_keeps_without_a_carried_transaction() -> None:
    assert fold_key([tombstone(2, 0)], None).version == UNVERSIONED
