"""Rewrite rows that are missing or different in a sink through Debezium's incremental snapshot.

Rows read here and written directly could not be versioned correctly: a version orders a change
by the commit end of the transaction streamed before it, so a transaction committing just after
the read may carry a smaller version than any position taken at the read, and the repaired row
would fence it out forever. An incremental snapshot row is versioned by Debezium's watermarks
against the stream and applied by the running job through the same fenced sinks, so a
concurrent newer change always wins. The snapshot is narrowed to the differing keys with
`additional-conditions`, or reads the whole table when most of it differs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
from psycopg.abc import AdaptContext

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.debezium.notifications import (
    CHANNELS_SETTING,
    TOPIC_SETTING,
    Notification,
    SnapshotOutcome,
    end_offsets,
    follow,
    notification_topic,
    snapshot_outcome,
)
from cdc_sync.debezium.signals import filter_budget, key_filters, request_snapshot

# More than this share of a table's rows to rewrite: read the whole table (one scan in chunks
# is cheaper than key lists, and a lost sink is usually lost whole).
WHOLE_TABLE_SHARE = 0.5
# More key-list signals than this for one table: read the whole table instead.
MAX_SIGNALS_PER_TABLE = 20


@dataclass(frozen=True)
class SnapshotSignal:
    """One `execute-snapshot` signal: its tables, each narrowed by its filter if it has one."""

    tables: tuple[str, ...]
    conditions: Mapping[str, str] = field(default_factory=dict)

    @property
    def whole(self) -> bool:
        return not self.conditions


@dataclass(frozen=True)
class SnapshotChannel:
    """Where the signals go and where Debezium reports on them."""

    config: Mapping[str, str]  # the connector's config as it runs (placeholders resolved)
    conninfo: str  # the database it captures from
    kafka: Mapping[str, Any]  # consumer config, for the notification topic
    timeout_seconds: float = 300.0  # per signal, until Debezium reports it completed

    @property
    def topic(self) -> str:
        topic = notification_topic(self.config)
        if topic is None:
            raise ConfigError(
                self.config.get("name", "connector"),
                f"config.{CHANNELS_SETTING}",
                f"must include `sink` with {TOPIC_SETTING} set: repair waits for Debezium's "
                "notification that each snapshot completed",
            )
        return topic


def table_signals(
    conn: AdaptContext | None,
    table: TableId,
    key_columns: Sequence[str],
    keys: Sequence[Sequence[Any]],
    source_rows: int,
) -> list[SnapshotSignal]:
    """The signals that rewrite the rows with these primary keys (values in `key_columns`
    order); the table whole when most of it differs or the keys need too many signals."""
    if not keys:
        return []
    name = str(table)
    whole = [SnapshotSignal((name,))]
    if len(keys) > WHOLE_TABLE_SHARE * source_rows:
        return whole
    filters = key_filters(conn, key_columns, keys, filter_budget(name))
    if filters is None or len(filters) > MAX_SIGNALS_PER_TABLE:
        return whole
    return [SnapshotSignal((name,), {name: f}) for f in filters]


def merged(signals: Sequence[SnapshotSignal]) -> list[SnapshotSignal]:
    """Whole-table signals as one (a snapshot reads its tables one after another)."""
    whole = tuple(dict.fromkeys(t for s in signals if s.whole for t in s.tables))
    narrowed = [s for s in signals if not s.whole]
    return ([SnapshotSignal(whole)] if whole else []) + narrowed


def run_signals(
    channel: SnapshotChannel,
    signals: Sequence[SnapshotSignal],
    seen: Callable[[SnapshotSignal, Notification], None] = lambda _s, _n: None,
) -> list[tuple[SnapshotSignal, SnapshotOutcome]]:
    """Send each signal and wait for Debezium to report it completed before the next (one
    incremental snapshot runs at a time); stops at the first that does not complete."""
    topic = channel.topic
    outcomes: list[tuple[SnapshotSignal, SnapshotOutcome]] = []
    for signal in signals:
        # Where the notification topic ends before the signal: what follows is this one's.
        start = end_offsets(channel.kafka, topic)
        with psycopg.connect(channel.conninfo, autocommit=True) as conn:
            signal_id = request_snapshot(conn, channel.config, signal.tables, signal.conditions)
        notifications = follow(channel.kafka, topic, start, signal_id, channel.timeout_seconds)
        with contextlib.closing(notifications):
            outcome = snapshot_outcome(notifications, partial(seen, signal))
        outcomes.append((signal, outcome))
        if outcome is not SnapshotOutcome.COMPLETED:
            break
    return outcomes
