"""The one retry rule: transient errors retried with backoff, others at once, exhaustion named."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cdc_sync.core.retry import RetryPolicy, TransientSinkError, retried

pytestmark = pytest.mark.unit
POLICY = RetryPolicy(attempts=3, base_seconds=0.01, max_seconds=0.05)


class Flaky(Exception):
    pass


def failing(times: int, error: Exception) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def action() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "ok"

    return calls, action


def test_transient_failures_are_retried_until_success() -> None:
    calls, action = failing(2, Flaky())
    sleeps: list[float] = []
    assert retried(action, lambda e: isinstance(e, Flaky), "w", POLICY, sleeps.append) == "ok"
    assert len(calls) == 3
    assert len(sleeps) == 2 and all(0 <= s <= 0.05 for s in sleeps)


def test_terminal_errors_are_not_retried() -> None:
    calls, action = failing(5, ValueError("bad"))
    with pytest.raises(ValueError):
        retried(action, lambda e: isinstance(e, Flaky), "w", POLICY, lambda _: None)
    assert len(calls) == 1


def test_exhausted_retries_raise_a_transient_sink_error_naming_the_write() -> None:
    calls, action = failing(9, Flaky("down"))
    with pytest.raises(TransientSinkError, match="search bulk shop: down"):
        retried(action, lambda e: isinstance(e, Flaky), "search bulk shop", POLICY, lambda _: None)
    assert len(calls) == POLICY.attempts
