"""Retry transient failures with jittered exponential backoff ("full jitter")."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base_seconds: float = 0.2
    max_seconds: float = 10.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.max_seconds, self.base_seconds * 2**attempt))


DEFAULT_POLICY = RetryPolicy()


def retry_transient(
    action: Callable[[], T],
    is_transient: Callable[[BaseException], bool],
    what: str,
    policy: RetryPolicy = DEFAULT_POLICY,
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    rng = rng or random.Random()
    for attempt in range(policy.attempts):
        try:
            return action()
        except Exception as exc:
            if not is_transient(exc) or attempt == policy.attempts - 1:
                raise
            pause = policy.delay(attempt, rng)
            log.warning(
                "%s failed (%s), retry %d/%d in %.2fs",
                what,
                type(exc).__name__,
                attempt + 1,
                policy.attempts - 1,
                pause,
            )
            sleep(pause)
    raise AssertionError("unreachable")
