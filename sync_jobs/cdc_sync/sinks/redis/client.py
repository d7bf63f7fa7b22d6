"""Pipelined, fenced writes: one `apply.lua` call per change, chunks of 500 per round trip.

The script is registered once (SCRIPT LOAD; a pipeline re-loads it if the server lost it) and
runs atomically per key. A ResponseError answer concerns one key (wrong type, a stored row that is
not JSON): that record fails terminally, the others in the chunk stand. Connection errors and
timeouts fail the whole chunk; re-sending it is harmless because every call is fenced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from importlib import resources
from typing import Any

import redis
from redis.exceptions import ResponseError

from cdc_sync.core.retry import DEFAULT_POLICY, RetryPolicy, retried
from cdc_sync.sinks.base import RecordFailure, WriteResult
from cdc_sync.sinks.redis.actions import CacheAction

PIPELINE_CHUNK = 500
APPLIED, FENCED = 1, 0


def apply_script_source() -> str:
    return resources.files("cdc_sync.sinks.redis").joinpath("apply.lua").read_text()


def is_transient(exc: BaseException) -> bool:
    # redis-py: ConnectionError covers BusyLoadingError (a server still loading its dataset).
    return isinstance(exc, redis.ConnectionError | redis.TimeoutError)


class RedisWriter:
    def __init__(
        self,
        client: redis.Redis,
        tombstone_retention_seconds: int,
        policy: RetryPolicy = DEFAULT_POLICY,
    ) -> None:
        self.client = client
        self.tombstone_retention_seconds = tombstone_retention_seconds
        self.policy = policy
        self.script = client.register_script(apply_script_source())

    def load_script(self) -> None:
        """SCRIPT LOAD now, so a broken script or server shows up before the first batch."""
        self.script.sha = retried(
            lambda: self.client.script_load(self.script.script),
            is_transient,
            "redis script load",
            self.policy,
        )

    def write_batch(self, actions: Sequence[CacheAction]) -> WriteResult:
        result = WriteResult()
        for start in range(0, len(actions), PIPELINE_CHUNK):
            chunk = actions[start : start + PIPELINE_CHUNK]
            answers = retried(
                partial(self._send, chunk), is_transient, "redis apply pipeline", self.policy
            )
            result = result.merge(classify_answers(chunk, answers))
        return result

    def drop_foreign(self, keys: Mapping[str, bytes | None]) -> set[str]:
        """Delete each row key (-> the version field read from it, None for none) that still
        holds that field: a foreign key (`apply.lua`). A key the pipeline wrote since is kept.
        Returns the keys deleted."""
        items = sorted(keys.items())
        dropped: set[str] = set()
        for start in range(0, len(items), PIPELINE_CHUNK):
            chunk = items[start : start + PIPELINE_CHUNK]
            answers = retried(
                partial(self._send_drops, chunk), is_transient, "redis drop foreign", self.policy
            )
            dropped.update(key for (key, _), answer in zip(chunk, answers, strict=True) if answer)
        return dropped

    def _send_drops(self, chunk: Sequence[tuple[str, bytes | None]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for key, field in chunk:
            # The tombstone key is not read by this op; the script takes two keys.
            self.script(keys=[key, key], args=["drop_foreign", field or b""], client=pipe)
        return list(pipe.execute())

    def _send(self, chunk: Sequence[CacheAction]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for action in chunk:
            self.script(
                keys=action.script_keys(),
                args=action.script_args(self.tombstone_retention_seconds),
                client=pipe,
            )
        answers = pipe.execute(raise_on_error=False)
        for answer in answers:
            if is_transient(answer):
                raise answer
        return list(answers)


def classify_answers(actions: Sequence[CacheAction], answers: Sequence[Any]) -> WriteResult:
    result = WriteResult()
    for action, answer in zip(actions, answers, strict=True):
        if isinstance(answer, ResponseError):
            # The message is the server's (script line, WRONGTYPE...): it never echoes values.
            result.failures.append(
                RecordFailure(
                    change=action.change,
                    error_class=type(answer).__name__,
                    message=f"redis {action.op} failed: {type(answer).__name__}",
                )
            )
        elif answer == APPLIED:
            result.applied += 1
        elif answer == FENCED:
            result.fenced += 1
        else:
            raise RuntimeError(f"apply.lua answered {answer!r}, expected {APPLIED} or {FENCED}")
    return result
