"""Retry transient failures with jittered exponential backoff ("full jitter"), via tenacity.

The one retry rule of the project: every sink passes its own `is_transient` classifier (on
structured fields: exception types, HTTP status codes, never message text) and gets the same
backoff, the same log line, and `TransientSinkError` when the attempts run out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base_seconds: float = 0.2
    max_seconds: float = 10.0


DEFAULT_POLICY = RetryPolicy()


class TransientSinkError(RuntimeError):
    """A write failed for a reason that may pass (connection, timeout, overload), and kept
    failing for every attempt of the retry policy."""


def retried(
    action: Callable[[], T],
    is_transient: Callable[[BaseException], bool],
    what: str,
    policy: RetryPolicy = DEFAULT_POLICY,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`action()`, retried while it raises what `is_transient` accepts; other errors pass
    through at once; when the attempts run out, `TransientSinkError` names `what`."""

    def log_retry(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "%s failed (%s), retry %d/%d in %.2fs",
            what,
            type(exc).__name__,
            state.attempt_number,
            policy.attempts - 1,
            state.next_action.sleep if state.next_action else 0.0,
        )

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        wait=tenacity.wait_random_exponential(
            multiplier=policy.base_seconds, max=policy.max_seconds
        ),
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=log_retry,
        sleep=sleep,
        reraise=True,
    )
    try:
        return retrying(action)
    except Exception as exc:
        if is_transient(exc):
            raise TransientSinkError(f"{what}: {exc}") from exc
        raise
