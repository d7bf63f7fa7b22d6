"""The one retry rule: transient errors retried with backoff until the outage horizon passes
(measured from the write's first failure), others at once; the wait is reported, throttled,
and giving up names the write, the sink and how long it waited."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from cdc_sync.core.retry import (
    DEFAULT_POLICY,
    RetryPolicy,
    TransientSinkError,
    retried,
)
from cdc_sync.job.write.health import SinkHealth, SinkState

pytestmark = pytest.mark.unit
POLICY = RetryPolicy(attempts=3, base_seconds=0.01, max_seconds=0.05)


class Flaky(Exception):
    pass


def is_flaky(exc: BaseException) -> bool:
    return isinstance(exc, Flaky)


class FakeClock:
    """Monotonic time that only `sleep` (and slow attempts) advance."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(
    times: int, error: Exception, clock: FakeClock | None = None, attempt_seconds: float = 0.0
) -> tuple[list[int], Callable[[], str]]:
    """An action failing `times` times, each attempt taking `attempt_seconds` of `clock`."""
    calls: list[int] = []

    def action() -> str:
        calls.append(1)
        if clock is not None:
            clock.now += attempt_seconds
        if len(calls) <= times:
            raise error
        return "ok"

    return calls, action


def test_transient_failures_are_retried_until_success() -> None:
    calls, action = failing(2, Flaky())
    sleeps: list[float] = []
    assert retried(action, is_flaky, "w", POLICY, sleeps.append) == "ok"
    assert len(calls) == 3
    assert len(sleeps) == 2 and all(0 <= s <= 0.05 for s in sleeps)


def test_terminal_errors_are_not_retried() -> None:
    calls, action = failing(5, ValueError("bad"))
    with pytest.raises(ValueError):
        retried(action, is_flaky, "w", POLICY, lambda _: None)
    assert len(calls) == 1


def test_an_attempt_capped_policy_gives_up_naming_the_write() -> None:
    calls, action = failing(9, Flaky("down"))
    with pytest.raises(TransientSinkError, match=r"search bulk shop: gave up .*Flaky: down"):
        retried(action, is_flaky, "search bulk shop", POLICY, lambda _: None)
    assert len(calls) == POLICY.attempts


def test_the_default_policy_waits_ten_minutes_for_a_sink() -> None:
    assert DEFAULT_POLICY.horizon_seconds == 600
    assert DEFAULT_POLICY.attempts is None
    assert DEFAULT_POLICY.attempt_timeout_seconds == 30


def test_a_sink_down_for_minutes_is_retried_far_past_six_attempts() -> None:
    """Issue 8: 6 attempts (~10 s) ended the query while the server was frozen for 75 s."""
    clock = FakeClock()
    policy = RetryPolicy(horizon_seconds=600, max_seconds=30, target="search")
    # Down for ~5 minutes: every attempt fails until the clock passes 300 s of outage.
    start = clock.now
    calls: list[int] = []

    def action() -> str:
        calls.append(1)
        if clock.now - start < 300:
            raise Flaky("connection refused")
        return "applied"

    assert retried(action, is_flaky, "search bulk products", policy, clock.sleep, clock) == (
        "applied"
    )
    assert len(calls) > 6
    assert all(0 <= s <= 30 for s in clock.sleeps)
    assert clock.now - start >= 300


def test_giving_up_after_the_horizon_names_the_sink_the_write_and_the_wait() -> None:
    clock = FakeClock()
    policy = RetryPolicy(horizon_seconds=600, max_seconds=30, target="search")
    calls, action = failing(10_000, Flaky("down"), clock)
    with pytest.raises(TransientSinkError) as raised:
        retried(action, is_flaky, "search bulk products", policy, clock.sleep, clock)
    message = str(raised.value)
    assert "sink search" in message and "search bulk products" in message
    assert "waiting 600.0 s" in message and "Flaky: down" in message
    assert isinstance(raised.value.__cause__, Flaky)
    # The last sleep is cut at the horizon: the last attempt happens right at it, not after.
    assert sum(clock.sleeps) == pytest.approx(600)
    assert len(calls) > 6


def test_the_horizon_counts_from_the_first_failure_not_from_the_first_attempt() -> None:
    clock = FakeClock()
    policy = RetryPolicy(horizon_seconds=60, max_seconds=5, target="search")
    # Each attempt hangs 30 s (a frozen server, the request timeout): the first one fails at 30 s.
    calls, action = failing(10_000, Flaky("timeout"), clock, attempt_seconds=30)
    with pytest.raises(TransientSinkError, match=r"waiting (6\d|[7-9]\d)\.\d s"):
        retried(action, is_flaky, "search bulk products", policy, clock.sleep, clock)
    # First failure at +30 s; the write keeps trying until >= 60 s after it.
    assert len(calls) >= 3


def test_the_waiting_line_is_logged_at_the_first_failure_then_throttled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    policy = RetryPolicy(horizon_seconds=600, base_seconds=1, max_seconds=2, target="redis")
    calls, action = failing(10_000, Flaky(), clock)
    with (
        caplog.at_level(logging.WARNING, logger="cdc_sync.core.retry"),
        pytest.raises(TransientSinkError),
    ):
        retried(action, is_flaky, "redis apply pipeline", policy, clock.sleep, clock)
    waiting = [r.getMessage() for r in caplog.records if "waiting for sink" in r.getMessage()]
    assert waiting[0].startswith("waiting for sink redis (redis apply pipeline) since ")
    assert ": Flaky; retrying until " in waiting[0] and "(600 s)" in waiting[0]
    # Hundreds of attempts in 600 s, one line at the first failure and then one per 30 s.
    assert len(calls) > 200
    assert 600 / 30 <= len(waiting) <= 600 / 30 + 1


def test_recovery_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    _, action = failing(3, Flaky(), clock)
    with caplog.at_level(logging.WARNING, logger="cdc_sync.core.retry"):
        retried(action, is_flaky, "w", RetryPolicy(target="search"), clock.sleep, clock)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "waiting for sink search" in m]) == 1
    assert len([m for m in messages if "answered again" in m]) == 1


def test_the_observer_sees_waiting_recovered_and_failed() -> None:
    clock = FakeClock()
    health = SinkHealth(["search", "redis"])
    states: list[SinkState] = []

    def action() -> str:
        states.append(health.status()["search"].state)
        if len(states) <= 3:
            raise Flaky()
        return "ok"

    policy = RetryPolicy(horizon_seconds=60, target="search", observer=health)
    retried(action, is_flaky, "search bulk products", policy, clock.sleep, clock)
    assert states == [SinkState.OK, SinkState.WAITING, SinkState.WAITING, SinkState.WAITING]
    assert health.status()["search"].state is SinkState.OK

    _, down = failing(10_000, Flaky(), clock)
    with pytest.raises(TransientSinkError):
        retried(down, is_flaky, "search bulk products", policy, clock.sleep, clock)
    failed = health.status()["search"]
    assert failed.state is SinkState.FAILED
    assert (failed.what, failed.error_class) == ("search bulk products", "Flaky")
    assert failed.failures > 3 and failed.since is not None
    assert health.status()["redis"].state is SinkState.OK


def test_a_policy_needs_a_limit() -> None:
    with pytest.raises(ValueError, match="horizon_seconds or attempts"):
        RetryPolicy(horizon_seconds=None)


def test_the_horizon_is_a_job_option_and_a_run_flag(tmp_path: Path) -> None:
    from cdc_sync.cli import build_parser, job_options
    from cdc_sync.job.runner import JobOptions

    defaults = JobOptions(checkpoint_dir=tmp_path / "c", warehouse=tmp_path / "w")
    assert defaults.sink_retry_horizon_seconds == 600

    def parsed(*argv: str) -> JobOptions:
        args: argparse.Namespace = build_parser().parse_args(["run", "--mapping", "m", *argv])
        return job_options(args, defaults)

    assert parsed().sink_retry_horizon_seconds == 600
    options = parsed("--sink-retry-horizon", "1800")
    assert options.sink_retry_horizon_seconds == 1800
    health = SinkHealth()
    policy = options.sink_retry(health)
    assert (policy.horizon_seconds, policy.attempts, policy.observer) == (1800, None, health)
    with pytest.raises(SystemExit):
        parsed("--sink-retry-horizon", "0")
