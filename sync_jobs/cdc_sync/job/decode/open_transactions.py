"""Per Kafka partition, the keys the batch's last transaction created, for the next batch.

A swap of two rows' keys on a DEFERRABLE primary key reads d(1) ts(1) c(2) d(2) ts(2) c(1), and
only Postgres can tell whether key 2's trailing delete leaves the key present (job.decode.fold). A
micro-batch boundary can fall inside that transaction (`maxOffsetsPerTrigger`, or end offsets
read while Debezium was still writing it): between c(2) and d(2), or between d(2) and its
tombstone. So each batch hands on, per partition, its last transaction (the one its last
versioned record belongs to, which may go on in the next batch) with the keys that transaction
created and left present or settled by Postgres (`job.decode.fold.OpenTransaction`); the next batch
settles a delete of such a key in that transaction, or a tombstone that opens the key's changes,
by reading Postgres by key, as within one batch. A partition with no versioned record in a batch
keeps what it had (the transaction may still go on).

Kept in `<checkpoint>/cdc_sync_open_transactions.json` the way every per-partition state is
(job.decode.batch_state): saved with the batch id after the sinks acknowledged the batch, before
Spark commits its offsets; a re-run of the batch starts from the state the batch before it left.
Its size is the keys the last transaction created: a transaction of many inserts that straddles
batches carries all of them for as long as it lasts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdc_sync.job.decode.batch_state import PerBatch, PerBatchFile, Where
from cdc_sync.job.decode.fold import OpenTransaction, Transaction

FILE_NAME = "cdc_sync_open_transactions.json"
FORMAT = 1

OpenTransactions = dict[Where, OpenTransaction]
StoredOpenTransactions = PerBatch[OpenTransaction]


class OpenTransactionsCorrupt(RuntimeError):
    """A stored file of open transactions that cannot be read; the message names the file."""


class FileOpenTransactions(PerBatchFile[OpenTransaction]):
    def __init__(self, path: Path) -> None:
        super().__init__(
            path,
            FORMAT,
            _encode,
            _decode,
            OpenTransactionsCorrupt,
            "open transactions are unreadable ({error}); restore the file, or delete it (a "
            "key swap on a deferrable key that straddled the last batch boundary may then be "
            "applied as a delete: `cdc-sync verify` finds such a row, `cdc-sync repair` "
            "rewrites it)",
        )

    @classmethod
    def beside_checkpoint(cls, checkpoint_dir: Path) -> FileOpenTransactions:
        return cls(checkpoint_dir / FILE_NAME)


def _encode(open_: OpenTransaction) -> dict[str, Any]:
    return {
        "version": open_.transaction.version,
        "txid": open_.transaction.txid,
        "keys": sorted(open_.keys),
    }


def _decode(entry: Mapping[str, Any]) -> OpenTransaction:
    txid = entry["txid"]
    keys = entry["keys"]
    if not isinstance(keys, list):
        raise TypeError("keys: expected a list")
    return OpenTransaction(
        Transaction(int(str(entry["version"])), None if txid is None else int(str(txid))),
        frozenset(str(key) for key in keys),
    )


def carried_on(
    before: Mapping[Where, OpenTransaction], reported: Mapping[Where, OpenTransaction]
) -> OpenTransactions:
    """The state after a batch: each partition the batch reported (it held a versioned record
    there) as reported, the others as they were; partitions left without keys are dropped."""
    after = {**before, **reported}
    return {where: open_ for where, open_ in after.items() if open_.keys}
