"""Log-compaction semantics inside one micro-batch: the newest change per key wins.

"Newest" is the highest (commit-order) version, ties broken by Kafka offset: the changes of one
transaction share a version and keep their Kafka order. Unchanged TOAST columns of the winner are
filled from older changes of the same key in the batch, so dropping the older changes never drops
a value the sinks have not seen yet; uncertain ones (a null that may be real) are left to Postgres.

A Kafka tombstone is the compacted log's delete. It carries no version: it takes the version of the
change just before it in the log (the delete event it follows, normally), or, when the batch holds
none (the log cleaner removed it, or it sits in an earlier batch), stays UNVERSIONED: the sinks
then delete whatever they hold, and every change after it in the log still wins.

A delete keeps the row it removes when the batch holds it whole (`Change.deleted_row`): the
newest change wins, but a soft-delete sink with a filter must know whether the row still matched
when it was deleted (docs/mappings.md "Soft deletes").

Deferrable-key swaps. Keyed by primary key, a transaction that swaps two rows' keys (`UPDATE t
SET id = 3 - id` on a DEFERRABLE key) reads d(1) ts(1) c(2) d(2) ts(2) c(1): key 2's last change
is a delete though Postgres holds key 2. A chain 5 -> 6 -> 5 in one transaction emits the same
events for key 6 and leaves it absent, so the events cannot tell; a delete that follows a create
of the same key in the same transaction is settled by reading Postgres by key
(`resolve_from_source`, job.write.unavailable). The transaction may straddle a batch boundary: the
batch that holds c(2) then hands the keys its last transaction created to the next batch
(`OpenTransaction`, kept per partition by job.decode.open_transactions), where a delete of such a
key in that transaction, or a tombstone that opens the key's changes (it follows that delete), is
settled the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from cdc_sync.core.model import Change, Op


@dataclass(frozen=True)
class Transaction:
    """The transaction a change belongs to, as its record tells: its version (the commit before
    it: one per transaction), and for the first transaction streamed after a snapshot, whose
    changes are versioned by their own positions, Debezium's txId (`Change.transaction`)."""

    version: int
    txid: int | None = None

    @classmethod
    def of(cls, change: Change) -> Transaction:
        return cls(change.version, change.transaction)

    def holds(self, change: Change) -> bool:
        """`change` belongs to this transaction. A delete known only from a tombstone does not
        (nothing tells its transaction). Equal versions of different transactions (a snapshot
        row and a first transaction lifted to the snapshot's point) may be taken for one: that
        only costs a read from Postgres, never a wrong row."""
        return not change.is_unversioned and self.matches(change.version, change.transaction)

    def matches(self, version: int, txid: int | None) -> bool:
        """A change of `version` and `txid` (`Change.transaction`) belongs to this transaction."""
        return version == self.version or (self.txid is not None and txid == self.txid)

    def same_as(self, other: Transaction) -> bool:
        return self.version == other.version or (self.txid is not None and self.txid == other.txid)


@dataclass(frozen=True)
class OpenTransaction:
    """A partition's last transaction in a batch, which may go on in the next batch: the keys
    (doc ids) it created there whose state it left present, or settled by Postgres. The next
    batch settles a delete of such a key in this transaction (and a tombstone that opens the
    key's changes) by reading Postgres too."""

    transaction: Transaction
    keys: frozenset[str] = frozenset()

    def carried(self, doc_id: str) -> Transaction | None:
        """The transaction that created `doc_id` in an earlier batch, if it did."""
        return self.transaction if doc_id in self.keys else None


def order_key(change: Change) -> tuple[int, int, int]:
    return (change.version, change.coordinates.partition, change.coordinates.offset)


def fold(older: Change, newer: Change) -> Change:
    """The state after applying `newer` on top of `older` (same table and key)."""
    if newer.is_delete:
        return _deleting(older, newer)
    if not newer.unavailable_columns or older.is_delete or older.row is None:
        return newer
    assert newer.row is not None
    # An uncertain placeholder may be a real null that replaced the older value: not filled.
    recovered = {
        column: older.row[column]
        for column in newer.unavailable_columns - newer.uncertain_columns
        if column in older.row
    }
    if not recovered:
        return newer
    return dataclasses.replace(
        newer,
        row={**newer.row, **recovered},
        unavailable_columns=newer.unavailable_columns - recovered.keys(),
    )


def _deleting(older: Change, delete: Change) -> Change:
    """`delete` with the row it removes when the batch holds it whole (`Change.deleted_row`:
    what a soft-delete sink's filter reads): dropping the older change must not drop the
    fact that the row had left a filter before it was deleted."""
    if older.is_delete:
        row = older.deleted_row  # a tombstone after its delete event
    elif older.row is not None and not older.unavailable_columns:
        row = older.row
    else:
        row = None  # partly unknown: the sink's stored row decides (`Change.marks_deleted`)
    return delete if row is None else dataclasses.replace(delete, deleted_row=row)


def version_tombstones(
    changes: Sequence[Change], carried: Transaction | None = None
) -> list[Change]:
    """One key's changes of a batch, with each tombstone delete versioned by the change before it
    in Kafka order (if any; else by `carried`, the transaction of the key's last change in the
    batch before, when the batch before handed it on), sorted in fold order."""
    in_log_order = sorted(changes, key=lambda c: c.coordinates.position)
    versioned: list[Change] = []
    for change in in_log_order:
        if change.is_unversioned:
            if versioned:
                # ... and dated by it: the commit time of the delete it stands for (soft deletes).
                before = versioned[-1]
                change = dataclasses.replace(
                    change,
                    version=before.version,
                    transaction=before.transaction,
                    source_ts_ms=before.source_ts_ms,
                )
            elif carried is not None:
                change = dataclasses.replace(
                    change, version=carried.version, transaction=carried.txid
                )
        versioned.append(change)
    return sorted(versioned, key=order_key)


def fold_key(
    changes: Sequence[Change], carried: Transaction | None = None, keep_earlier: bool = False
) -> Change:
    """The state one key's changes of a batch leave. `carried`: the open transaction of the batch
    before, when it created this key (`OpenTransaction.carried`). `keep_earlier` (tables with a
    Delta history): the state also carries the earlier states it passed through, the last one of
    each older version (`Change.earlier`)."""
    ordered = version_tombstones(changes, carried)
    state = ordered[0]
    states = [state]
    for change in ordered[1:]:
        state = fold(state, change)
        states.append(state)
    if keep_earlier:
        last_per_version = {s.version: s for s in states}  # a transaction's last change wins
        earlier = tuple(s for v, s in last_per_version.items() if v != state.version)
        state = dataclasses.replace(state, earlier=earlier)
    if state.is_delete and (
        created_in_the_same_transaction(state, ordered)
        or (carried is not None and carried.holds(state))
    ):
        # A delete after a create of the same key in the same transaction: a swap of two rows'
        # keys (Postgres holds the key) or a chain through it (it does not). Postgres settles it.
        state = dataclasses.replace(state, resolve_from_source=True)
    return state


def created_in_the_same_transaction(delete: Change, changes: Sequence[Change]) -> bool:
    transaction = Transaction.of(delete)
    return not delete.is_unversioned and any(
        not c.is_delete and transaction.holds(c) for c in changes
    )


def left_open(
    state: Change, changes: Sequence[Change], tail: Transaction, carried: Transaction | None
) -> bool:
    """Whether the next batch must know this key as created by `tail`, the partition's last
    transaction in this batch: the key's state is `tail`'s and present (or settled by Postgres),
    and `tail` created the key (a create in this batch, or `carried` from the batch before).
    Snapshot rows are never a transaction's creates."""
    if state.op is Op.READ or not tail.holds(state):
        return False
    if state.is_delete and not state.resolve_from_source:
        return False
    if carried is not None and carried.same_as(tail):
        return True
    return any(c.op is Op.CREATE and tail.holds(c) for c in changes)
