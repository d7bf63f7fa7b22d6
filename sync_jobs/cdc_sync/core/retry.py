"""Retry transient failures with jittered exponential backoff ("full jitter"), via tenacity.

The one retry rule of the project: every sink passes its own `is_transient` classifier (on
structured fields: exception types, HTTP status codes, never message text) and gets the same
backoff, the same waiting report, and `TransientSinkError` when the policy gives up.

A sink that is down for minutes (a restart, a frozen JVM, a long GC) is waited for: the policy
retries until its *horizon* has passed since the write's first failure, not for a fixed number
of attempts, because failing the micro-batch ends the streaming query. While it waits it logs
one WARNING at the first failure and then at most every `report_every_seconds`, and tells the
policy's `observer` (the job's sink-health state) on every failure, on recovery and on giving up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol, TypeVar

import tenacity

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_HORIZON_SECONDS = 600.0
# Set when the process is stopping (SIGTERM, Ctrl-C): retries end at once rather than wait up
# to their horizon, so that a stop never waits for a sink that is down (the abandoned write's
# batch is not committed and re-runs on restart; every write is fenced).
_STOPPING = threading.Event()


def abandon_retries() -> None:
    """This process is stopping: every retry loop gives up now (`TransientSinkError`)."""
    _STOPPING.set()


# One attempt of a client may not block longer than this (a hung server answers nothing).
DEFAULT_ATTEMPT_TIMEOUT_SECONDS = 30.0


class RetryObserver(Protocol):
    """Told about one target's retries; the job keeps its sink-health state through this."""

    def waiting(self, target: str, what: str, since: float, error: BaseException) -> None:
        """A write to `target` failed transiently (every failure); `since`: wall-clock time of
        the write's first failure."""

    def recovered(self, target: str, what: str) -> None:
        """A write that had failed succeeded."""

    def gave_up(self, target: str, what: str, since: float, error: BaseException) -> None:
        """The horizon (or attempt cap) passed: the write fails with `TransientSinkError`."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying one write, and how often to say so.

    `horizon_seconds` counts from the write's first failure; None: no time limit. `attempts`
    caps the attempts as well (None: no cap); tests use it for small, fast policies.
    """

    horizon_seconds: float | None = DEFAULT_HORIZON_SECONDS
    attempts: int | None = None
    base_seconds: float = 0.2
    max_seconds: float = 30.0  # longest single backoff sleep
    report_every_seconds: float = 30.0
    attempt_timeout_seconds: float = DEFAULT_ATTEMPT_TIMEOUT_SECONDS  # clients read this
    target: str = "unnamed"  # the sink (or service) the log lines and the observer name
    observer: RetryObserver | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.horizon_seconds is None and self.attempts is None:
            raise ValueError("a retry policy needs horizon_seconds or attempts (or both)")
        if self.horizon_seconds is not None and self.horizon_seconds < 0:
            raise ValueError(f"horizon_seconds must be >= 0, got {self.horizon_seconds}")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.attempt_timeout_seconds <= 0:
            raise ValueError(
                f"attempt_timeout_seconds must be > 0, got {self.attempt_timeout_seconds}"
            )

    def for_target(self, target: str) -> RetryPolicy:
        """This policy, reporting as `target` (a sink names its own)."""
        return replace(self, target=target)


DEFAULT_POLICY = RetryPolicy()


class TransientSinkError(RuntimeError):
    """A write failed for a reason that may pass (connection, timeout, overload), and kept
    failing until the retry policy's horizon (or attempt cap) passed."""


class _Waiting:
    """The state of one `retried` call's failures: when they began, what to report when.

    Measured on `clock` (monotonic); `since_wall` is only for humans (logs, status)."""

    def __init__(
        self, what: str, policy: RetryPolicy, clock: Callable[[], float], wall: Callable[[], float]
    ) -> None:
        self.what = what
        self.policy = policy
        self.clock = clock
        self.wall = wall
        self.first: float | None = None  # clock() at the first failure
        self.since_wall = 0.0
        self.next_report = 0.0
        self.failures = 0

    def failed(self, error: BaseException) -> None:
        now = self.clock()
        self.failures += 1
        if self.first is None:
            self.first, self.since_wall, self.next_report = now, self.wall(), now
        if now >= self.next_report:
            self.next_report = now + self.policy.report_every_seconds
            log.warning("%s", self.message(error))
        if self.policy.observer is not None:
            self.policy.observer.waiting(self.policy.target, self.what, self.since_wall, error)

    def message(self, error: BaseException) -> str:
        horizon = self.policy.horizon_seconds
        until = (
            f"{_clock_time(self.since_wall + horizon)} ({horizon:g} s)"
            if horizon is not None
            else f"{self.policy.attempts} attempts"
        )
        return (
            f"waiting for sink {self.policy.target} ({self.what}) since "
            f"{_clock_time(self.since_wall)}: {type(error).__name__}; retrying until {until}"
        )

    def waited(self) -> float:
        return 0.0 if self.first is None else self.clock() - self.first

    def remaining(self) -> float:
        horizon = self.policy.horizon_seconds
        return float("inf") if horizon is None else max(0.0, horizon - self.waited())

    def horizon_passed(self) -> bool:
        # Within a millisecond: the last sleep is cut to the remaining time, and float sums of
        # sleeps can stop a hair short of the horizon, which would then never be reached.
        return self.remaining() <= 1e-3


def _clock_time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def retried(
    action: Callable[[], T],
    is_transient: Callable[[BaseException], bool],
    what: str,
    policy: RetryPolicy = DEFAULT_POLICY,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`action()`, retried while it raises what `is_transient` accepts; other errors pass
    through at once; when the policy gives up, `TransientSinkError` names `what`, the target
    and how long it waited. `sleep` and `clock` are injectable for tests (a fake clock)."""
    waiting = _Waiting(what, policy, clock, time.time)
    jitter = tenacity.wait_random_exponential(
        multiplier=policy.base_seconds, max=policy.max_seconds
    )

    def on_failure(state: tenacity.RetryCallState) -> None:
        # `after` runs only for failures `retry` accepted, before `wait` and `stop`.
        if state.outcome is not None and (error := state.outcome.exception()) is not None:
            waiting.failed(error)

    def wait(state: tenacity.RetryCallState) -> float:
        # Never sleep past the horizon: the last attempt happens right at it.
        return min(jitter(state), waiting.remaining())

    def stop(state: tenacity.RetryCallState) -> bool:
        capped = policy.attempts is not None and state.attempt_number >= policy.attempts
        return capped or waiting.horizon_passed() or _STOPPING.is_set()

    retrying = tenacity.Retrying(
        stop=stop,
        wait=wait,
        retry=tenacity.retry_if_exception(is_transient),
        after=on_failure,
        sleep=sleep or _interruptible_sleep,
        reraise=True,
    )
    try:
        result = retrying(action)
    except Exception as exc:
        if not is_transient(exc):
            raise
        raise _gave_up(waiting, exc) from exc
    if waiting.failures:
        log.warning(
            "sink %s (%s) answered again after %.1f s", policy.target, what, waiting.waited()
        )
        if policy.observer is not None:
            policy.observer.recovered(policy.target, what)
    return result


def _interruptible_sleep(seconds: float) -> None:
    """A backoff sleep that ends when the process starts stopping (`abandon_retries`)."""
    _STOPPING.wait(seconds)


def _gave_up(waiting: _Waiting, error: BaseException) -> TransientSinkError:
    policy = waiting.policy
    if _STOPPING.is_set():
        return TransientSinkError(f"sink {policy.target}: {waiting.what}: abandoned, stopping")
    if policy.observer is not None:
        policy.observer.gave_up(policy.target, waiting.what, waiting.since_wall, error)
    return TransientSinkError(
        f"sink {policy.target}: {waiting.what}: gave up after waiting {waiting.waited():.1f} s "
        f"({waiting.failures} failed attempts, horizon "
        f"{'none' if policy.horizon_seconds is None else f'{policy.horizon_seconds:g} s'}): "
        f"{type(error).__name__}: {error}"
    )
