"""Versioned bulk writes: fill unchanged TOAST fields, send, classify every item.

Per item (bulk answers are in request order): 2xx applied; 404 on a delete applied (the document
was already gone, and the versioned delete still records the tombstone); 409 fenced (the index
holds a newer or equal-and-newer version); 429/5xx transient (only those items are re-sent, with
backoff); any other status terminal -> RecordFailure named by the item's `error.type`.

A bulk that got no answer (a timeout, a dropped connection) may still be applied by the server,
which can take longer than the client waits. It is not re-sent blindly: the next attempt first
reads the chunk's documents back (`_mget`, which the server answers once it is done with what it
was applying) and re-sends only the items the index does not hold yet. Safe either way, since
every write is versioned; cheap, since a server that was merely slow is not given the same work
twice.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from cdc_sync.core.retry import DEFAULT_POLICY, RetryPolicy, retried
from cdc_sync.sinks.base import RecordFailure, WriteResult
from cdc_sync.sinks.search.actions import BulkAction, SearchActions, bulk_operations
from cdc_sync.sinks.search.backends import SearchBackend, is_transient, is_transient_status

T = TypeVar("T")
log = logging.getLogger(__name__)

# Actions per `_bulk` request. Large on purpose: a snapshot written in small bulks leaves an
# index in many small segments, and on the local stack's search server the first later write to
# each of those documents costs a stall that grows with the index (4-11 s at 10,000 documents,
# about one per 30 documents touched); loaded 2,000 or more at a time, the same updates take
# milliseconds (`benchmarks/probe_search_pattern.py`). Real servers index large bulks faster too.
BULK_CHUNK = 5_000
# ...and bytes of documents per request: rows with large columns (TOASTed text, JSON) make a
# bulk tens of MB, which a server can take longer to index than a request may last.
BULK_BYTES = 5_000_000


class SearchWriter:
    def __init__(
        self,
        backend: SearchBackend,
        policy: RetryPolicy = DEFAULT_POLICY,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.sleep = sleep

    def write_batch(self, actions: SearchActions) -> WriteResult:
        result = WriteResult()
        for chunk in bulk_chunks(actions.actions):
            versioned, absent = self._version_unversioned_deletes(actions.alias, chunk)
            result = result.merge(WriteResult(applied=absent))
            if not versioned:
                continue
            filled = self._over_stored(actions.alias, versioned)
            result = result.merge(self._bulk_with_item_retries(actions.alias, filled))
        return result

    def _version_unversioned_deletes(
        self, alias: str, chunk: Sequence[BulkAction]
    ) -> tuple[list[BulkAction], int]:
        """A tombstone without a version deletes the stored document at the stored version
        (which also leaves the index's delete tombstone at it); an absent one is done already."""
        ids = sorted({a.doc_id for a in chunk if a.version < 0})
        if not ids:
            return list(chunk), 0
        docs = self._call(lambda: self.backend.mget(alias, ids), f"search mget {alias}")
        stored = {d["_id"]: d["_version"] for d in docs if d.get("found")}
        kept = [
            replace(a, version=stored[a.doc_id]) if a.version < 0 else a
            for a in chunk
            if a.version >= 0 or a.doc_id in stored
        ]
        return kept, len(chunk) - len(kept)

    def _over_stored(self, alias: str, chunk: Sequence[BulkAction]) -> list[BulkAction]:
        """What the stored documents settle, read in one `_mget`: unchanged TOAST columns
        (absent from the change) take the stored value, and a soft delete's mark is written
        over the stored document, or as a delete when there is none (`BulkAction.over_stored`).
        A later write between the read and the bulk has a newer version: it fences these."""
        ids = sorted({a.doc_id for a in chunk if a.unavailable_fields or a.mark})
        if not ids:
            return list(chunk)
        docs = self._call(lambda: self.backend.mget(alias, ids), f"search mget {alias}")
        stored = {d["_id"]: d.get("_source", {}) for d in docs if d.get("found")}
        return [
            a.over_stored(stored.get(a.doc_id))
            if a.mark
            else a.with_stored_fields(stored[a.doc_id])
            if a.unavailable_fields and a.doc_id in stored
            else a
            for a in chunk
        ]

    def _bulk_with_item_retries(self, alias: str, chunk: list[BulkAction]) -> WriteResult:
        """Items answered 429/5xx are re-sent (only those) under the same retry policy as a
        failed request; the other items' outcomes are kept from the attempt that answered. After
        a request without an answer, only the items the index does not hold yet are re-sent."""
        result = WriteResult()
        pending = chunk
        unanswered = False

        def attempt() -> WriteResult:
            nonlocal result, pending, unanswered
            if unanswered:
                pending, held = self._not_yet_held(alias, pending)
                result = result.merge(WriteResult(applied=held))
                unanswered = False
                if not pending:
                    return result
            try:
                answer = self.backend.bulk(bulk_operations(alias, pending))
            except Exception:
                unanswered = True  # it may have reached the server, which may still apply it
                raise
            done, pending = classify_items(pending, answer.get("items", []))
            result = result.merge(done)
            if pending:
                raise ItemsToRetry(len(pending))
            return result

        return self._call(attempt, f"search bulk {alias}")

    def _not_yet_held(
        self, alias: str, actions: Sequence[BulkAction]
    ) -> tuple[list[BulkAction], int]:
        """The actions still to send, and how many the index already holds: an index action
        whose document is stored at a newer version, or at its version with its content (an
        equal version alone may be another change of the same transaction). Deletes are always
        re-sent: an absent document does not tell whether the versioned tombstone was kept."""
        ids = sorted({a.doc_id for a in actions if a.op == "index"})
        docs = self.backend.mget(alias, ids) if ids else []
        stored = {d["_id"]: d for d in docs if d.get("found")}
        left = [a for a in actions if not _held(a, stored.get(a.doc_id))]
        return left, len(actions) - len(left)

    def _call(self, action: Callable[[], T], what: str) -> T:
        return retried(action, is_retryable, what, self.policy, self.sleep)


def bulk_chunks(
    actions: Sequence[BulkAction], count: int = BULK_CHUNK, size: int = BULK_BYTES
) -> Iterator[Sequence[BulkAction]]:
    """Consecutive runs of at most `count` actions, in the fewest runs that allows, of equal
    length but the last (5,100 actions go as two of 2,550, not as 5,000 and a rest of 100: see
    BULK_CHUNK), and of about `size` bytes of documents (a single larger one goes alone)."""
    runs = -(-len(actions) // count) if actions else 0
    even = -(-len(actions) // runs) if runs else count
    start, used = 0, 0
    for index, action in enumerate(actions):
        weight = len(json.dumps(action.document, default=str)) if action.document else 0
        if index > start and (index - start >= even or used + weight > size):
            yield actions[start:index]
            start, used = index, 0
        used += weight
    if start < len(actions):
        yield actions[start:]


def _held(action: BulkAction, stored: dict[str, Any] | None) -> bool:
    if action.op != "index" or stored is None:
        return False
    version = stored.get("_version")
    if not isinstance(version, int):
        return False
    return version > action.version or (
        version == action.version and stored.get("_source") == action.document
    )


class ItemsToRetry(Exception):
    """Some bulk items answered 429/5xx: the request is retried for those items."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} items answered 429/5xx")


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, ItemsToRetry) or is_transient(exc)


def classify_items(
    actions: Sequence[BulkAction], items: Sequence[dict[str, Any]]
) -> tuple[WriteResult, list[BulkAction]]:
    """Sort bulk answer items into applied / fenced / failures, and the actions to re-send."""
    if len(items) != len(actions):
        raise RuntimeError(f"search bulk answered {len(items)} items for {len(actions)} actions")
    result = WriteResult()
    retry: list[BulkAction] = []
    for action, item in zip(actions, items, strict=True):
        outcome: dict[str, Any] = item.get(action.op) or next(iter(item.values()), {})
        status = outcome.get("status")
        if (isinstance(status, int) and 200 <= status < 300) or (
            status == 404 and action.op == "delete"
        ):
            result.applied += 1
        elif status == 409:
            result.fenced += 1
        elif is_transient_status(status):
            retry.append(action)
        else:
            result.failures.append(_failure(action, status, outcome.get("error")))
    return result, retry


def _failure(action: BulkAction, status: object, error: object) -> RecordFailure:
    # The error's `reason` can quote field values (a payload): only types go into the message.
    error_class = "unknown_error"
    caused_by = ""
    if isinstance(error, dict):
        error_class = str(error.get("type", error_class))
        cause = error.get("caused_by")
        if isinstance(cause, dict) and cause.get("type"):
            caused_by = f", caused by {cause['type']}"
    return RecordFailure(
        change=action.change,
        error_class=error_class,
        message=f"search {action.op} answered {status}: {error_class}{caused_by}",
    )
