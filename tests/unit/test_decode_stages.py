"""The executor-side stages run as plain functions over Arrow batches (no Spark needed)."""

import pyarrow as pa
import pytest

from cdc_sync.job.decode.fold import fold_key
from cdc_sync.job.decode.partition import (
    KIND_CHANGE,
    KIND_MALFORMED,
    KIND_OPEN,
    KIND_STATS,
    KIND_TABLE,
    KIND_TOMBSTONE,
    decode_and_fold,
    decode_batches,
    fold_batches,
    load_change,
)
from tests.envelopes import UNAVAILABLE, envelope_bytes, key_bytes, product

pytestmark = pytest.mark.unit


def kafka_batch(records: list[tuple[bytes | None, bytes | None]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "key": [k for k, _ in records],
            "value": [v for _, v in records],
            "topic": ["cdc.shop.products"] * len(records),
            "partition": [0] * len(records),
            "offset": list(range(len(records))),
        }
    )


def test_decode_classifies_changes_tombstones_and_malformed_records() -> None:
    key = key_bytes("products", {"id": 1})
    batch = kafka_batch(
        [
            (key, envelope_bytes("products", "c", 10, product(1))),
            (key, None),
            (key, b"{broken"),
        ]
    )
    (decoded,) = list(decode_batches(iter([batch])))
    rows = decoded.to_pylist()
    assert [r["kind"] for r in rows] == [KIND_CHANGE, KIND_TOMBSTONE, KIND_MALFORMED]
    assert rows[0]["doc_id"] == "1" and rows[0]["version"] == 10
    assert rows[0]["schema_blob"] is not None  # first occurrence of this schema carries it
    assert rows[2]["error_field"] == "value" and rows[2]["value"] == b"{broken"
    assert rows[2]["table"] == "shop.products"


def test_schema_travels_once_per_partition() -> None:
    key = key_bytes("products", {"id": 1})
    batch = kafka_batch([(key, envelope_bytes("products", "u", v, product(1))) for v in (1, 2, 3)])
    (decoded,) = list(decode_batches(iter([batch])))
    blobs = [r["schema_blob"] for r in decoded.to_pylist()]
    assert blobs[0] is not None and blobs[1:] == [None, None]


def test_fold_keeps_the_newest_change_per_key_across_arrow_batches() -> None:
    key = key_bytes("products", {"id": 1})
    first = kafka_batch([(key, envelope_bytes("products", "c", 1, product(1, description="d1")))])
    second = kafka_batch(
        [
            (
                key,
                envelope_bytes(
                    "products", "u", 2, product(1, name="n2") | {"description": UNAVAILABLE}
                ),
            )
        ]
    )
    decoded = list(decode_batches(iter([first, second])))
    (folded,) = list(fold_batches(iter(decoded)))
    (row,) = folded.to_pylist()
    change = load_change(row)
    assert change.version == 2
    assert change.row is not None
    assert change.row["name"] == "n2" and change.row["description"] == "d1"
    assert row["schema_fp"] is not None


def test_decode_and_fold_folds_a_whole_partition_in_the_task_and_reports_its_side_rows() -> None:
    """No shuffle: a partition's records, keys interleaved, fold per key in Kafka order; the
    side rows carry counts, the last offset, rejected records and each table's newest schema."""
    one, two = key_bytes("products", {"id": 1}), key_bytes("products", {"id": 2})
    batch = kafka_batch(
        [
            (one, envelope_bytes("products", "c", 5, product(1, name="first"))),
            (two, envelope_bytes("products", "c", 5, product(2))),
            (one, envelope_bytes("products", "u", 7, product(1, name="same-tx-1"))),
            (two, envelope_bytes("products", "d", 8, None, before=product(2))),
            (one, envelope_bytes("products", "u", 7, product(1, name="same-tx-2"))),
            (two, None),
            (one, b"{broken"),
        ]
    )
    rows = [r for out in decode_and_fold(iter([batch])) for r in out.to_pylist()]
    changes = [r for r in rows if r["kind"] == KIND_CHANGE]
    assert [(r["doc_id"], r["version"]) for r in changes] == [("1", 7), ("2", 8)]
    first = load_change(changes[0])
    assert first.row is not None and first.row["name"] == "same-tx-2"  # Kafka order in a tx
    assert changes[0]["schema_blob"] is not None  # the partition's first row of that schema
    stats = {r["counted"]: (r["count"], r["offset"]) for r in rows if r["kind"] == KIND_STATS}
    assert stats == {KIND_CHANGE: (5, 4), KIND_TOMBSTONE: (1, 5), KIND_MALFORMED: (1, 6)}
    (table,) = [r for r in rows if r["kind"] == KIND_TABLE]
    assert (table["table"], table["count"], table["version"]) == ("shop.products", 2, 7)
    assert table["schema_blob"] is not None
    # The partition's last transaction (version 7) created no key: nothing left open.
    (open_,) = [r for r in rows if r["kind"] == KIND_OPEN]
    assert (open_["version"], open_["keys"]) == (7, b"[]")
    assert {r["kind"] for r in rows} == {
        KIND_CHANGE,
        KIND_STATS,
        KIND_TABLE,
        KIND_TOMBSTONE,
        KIND_MALFORMED,
        KIND_OPEN,
    }


def test_the_read_your_writes_candidate_comes_back_from_the_tasks() -> None:
    """The watermark candidate (the highest commit bound among the changes read) reaches the
    driver from the executor tasks through the stats rows."""
    from cdc_sync.job.stream import SideRows

    one = key_bytes("products", {"id": 1})
    batch = kafka_batch(
        [
            (one, envelope_bytes("products", "u", 900, product(1))),
            (one, envelope_bytes("products", "u", 700, product(1, name="older"))),
        ]
    )
    rows = [r for out in decode_and_fold(iter([batch])) for r in out.to_pylist()]
    side = SideRows([r for r in rows if r["kind"] != KIND_CHANGE])
    assert side.commit_bound == 900


def test_a_key_changed_once_folds_to_its_decoded_change_as_fold_key_would() -> None:
    # Keys changed once skip the unpickle/pickle of the fold: the row must be what folding it
    # gives, for an upsert with an unchanged TOAST column, a delete and a tombstone delete.
    toasted = product(1) | {"description": UNAVAILABLE}
    records: list[tuple[bytes | None, bytes | None]] = [
        (key_bytes("products", {"id": 1}), envelope_bytes("products", "u", 4, toasted)),
        (key_bytes("products", {"id": 2}), envelope_bytes("products", "d", 5, None, product(2))),
        (key_bytes("products", {"id": 3}), None),
        (key_bytes("products", {"id": 4}), envelope_bytes("products", "c", 6, product(4))),
        (key_bytes("products", {"id": 4}), envelope_bytes("products", "u", 7, product(4, "n"))),
    ]
    deletes = frozenset({"shop.products"})
    decoded = [
        row
        for out in decode_batches(iter([kafka_batch(records)]), tombstone_deletes=deletes)
        for row in out.to_pylist()
    ]
    folded = [
        row
        for out in decode_and_fold(iter([kafka_batch(records)]), tombstone_deletes=deletes)
        for row in out.to_pylist()
        if row["kind"] == KIND_CHANGE
    ]
    by_id = {row["doc_id"]: row for row in folded}
    assert sorted(by_id) == ["1", "2", "3", "4"]
    for doc_id in by_id:
        changes = [load_change(r) for r in decoded if r["doc_id"] == doc_id]
        expected = fold_key(changes)
        got = load_change(by_id[doc_id])
        assert got == expected
        assert (by_id[doc_id]["version"], by_id[doc_id]["bound"]) == (
            expected.version,
            expected.commit_bound,
        )
    assert load_change(by_id["1"]).unavailable_columns == {"description"}
    assert load_change(by_id["4"]).row["name"] == "n"  # type: ignore[index]


def _side_rows_of(partition: int, ids: list[int]) -> list[dict[str, object]]:
    batch = kafka_batch(
        [
            (key_bytes("products", {"id": i}), envelope_bytes("products", "u", 10 + i, product(i)))
            for i in ids
        ]
    )
    batch = batch.set_column(3, "partition", pa.array([partition] * len(ids), pa.int32()))
    rows = [r for out in decode_and_fold(iter([batch])) for r in out.to_pylist()]
    return [r for r in rows if r["kind"] != KIND_CHANGE]


def test_a_key_in_two_partitions_of_one_batch_fails_naming_topic_and_partitions() -> None:
    """After a partition count change a key's newer records hash to another partition: folded
    apart, they would be applied out of order, so the driver refuses the batch first."""
    from cdc_sync.job.stream import KeyAcrossPartitions, SideRows

    apart = _side_rows_of(0, [1, 2, 3]) + _side_rows_of(1, [4, 5])
    assert SideRows(apart).compacted == 5  # distinct keys: fine
    crossing = _side_rows_of(0, [1, 2, 3]) + _side_rows_of(3, [4, 2])
    with pytest.raises(
        KeyAcrossPartitions,
        match=r"topic 'cdc.shop.products': a key has changes in partitions 0 and 3 .*"
        r"partition count changed.*after the job drained it.*recreate the topic",
    ):
        SideRows(crossing)


def test_history_tables_keep_each_keys_earlier_versions_beside_the_folded_one() -> None:
    key = key_bytes("products", {"id": 1})
    records: list[tuple[bytes | None, bytes | None]] = [
        (key, envelope_bytes("products", "c", 10, product(1, price="1.00"))),
        (key, envelope_bytes("products", "u", 20, product(1, price="2.00"))),
        (key, envelope_bytes("products", "u", 30, product(1, price="3.00"))),
    ]

    def folded(history: frozenset[str]) -> list[object]:
        outputs = decode_and_fold(iter([kafka_batch(records)]), history_tables=history)
        rows = [r for out in outputs for r in out.to_pylist() if r["kind"] == KIND_CHANGE]
        (row,) = rows
        change = load_change(row)
        assert change.version == 30
        return [c.version for c in change.earlier]

    assert folded(frozenset({"shop.products"})) == [10, 20]
    assert folded(frozenset()) == []  # other tables: the fold alone, as before
