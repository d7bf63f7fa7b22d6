"""A frozen search server (SIGSTOP) is waited for, up to the retry horizon (issue 8, item 6).

Each test starts a private osmem-server (as the `search_url` fixture's local recipe does) so it
can freeze that process by PID without disturbing other tests; it is always resumed (SIGCONT) and
stopped at the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_sync.core.retry import RetryPolicy, TransientSinkError
from cdc_sync.job.write.health import SinkHealth, SinkState
from cdc_sync.localstack.process import StackError, Started, stop_pid
from cdc_sync.localstack.services import start_search
from cdc_sync.mapping import TableRoute
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.search import SearchSink
from tests.changes import change, products_route
from tests.envelopes import product

pytestmark = pytest.mark.integration

FREEZE_SECONDS = 8.0
# Short requests, so attempts fail (time out) while the server is frozen.
ATTEMPT_TIMEOUT = 1.5


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Started]:
    try:
        started = start_search(tmp_path)
    except StackError as exc:
        pytest.skip(f"osmem-server could not start: {exc}")
    try:
        yield started
    finally:
        resume(started)
        stop_pid(started.pid)


def freeze(started: Started) -> None:
    os.killpg(started.pid, signal.SIGSTOP)  # spawn() gave it its own process group
    # kill() returns before every thread has stopped: a thread running on the other core can
    # still answer the next request (seen once in a full run). Wait until all of them have.
    deadline = time.monotonic() + 5
    while not all_threads_stopped(started.pid):
        assert time.monotonic() < deadline, "the search server did not stop"
        time.sleep(0.01)


def all_threads_stopped(pid: int) -> bool:
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError):  # a thread that just exited
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state in "Tt" for state in states)


def resume(started: Started) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone: nothing to resume
        os.killpg(started.pid, signal.SIGCONT)


def open_sink(kind: str, started: Started, horizon: float, health: SinkHealth) -> SearchSink:
    policy = RetryPolicy(
        horizon_seconds=horizon,
        max_seconds=1.0,
        attempt_timeout_seconds=ATTEMPT_TIMEOUT,
        observer=health,
    )
    return SearchSink(kind, started.url, tombstone_retention_seconds=3600, retry=policy)


def ready_route(sink: SearchSink) -> TableRoute:
    route = products_route()
    sink.ensure_target(route, change(route, "c", 1, 1, product(1)).schema)
    return route


def alias(route: TableRoute) -> str:
    assert route.search is not None
    return route.search.index


@pytest.mark.parametrize("kind", ["opensearch", "elasticsearch"])
def test_a_write_waits_for_a_frozen_server_and_applies_when_it_returns(
    kind: str, server: Started, caplog: pytest.LogCaptureFixture
) -> None:
    health = SinkHealth(["search"])
    sink = open_sink(kind, server, horizon=60, health=health)
    route = ready_route(sink)
    outcome: list[WriteResult | BaseException] = []

    def write() -> None:
        try:
            outcome.append(sink.apply(route, [change(route, "c", 10, 7, product(7, name="x"))]))
        except BaseException as exc:  # reported to the test thread
            outcome.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="cdc_sync.core.retry"):
            freeze(server)
            writer.start()
            time.sleep(FREEZE_SECONDS)  # several timed-out attempts: more than the old 6
            frozen = health.status()["search"]
            resume(server)
            writer.join(timeout=60)
    finally:
        resume(server)
    assert not writer.is_alive()
    assert frozen.state is SinkState.WAITING and frozen.what == f"search bulk {alias(route)}"
    assert frozen.failures >= 2
    [result] = outcome
    assert isinstance(result, WriteResult), result
    assert (result.applied, result.fenced, result.failures) == (1, 0, [])
    assert health.status()["search"].state is SinkState.OK
    waiting = [
        r.getMessage() for r in caplog.records if "waiting for sink search" in r.getMessage()
    ]
    assert waiting and "retrying until" in waiting[0]
    sink.refresh(alias(route))
    [doc] = sink.backend.mget(alias(route), ["7"])
    assert doc["found"] and doc["_source"]["name"] == "x"
    sink.close()


@pytest.mark.parametrize("kind", ["opensearch", "elasticsearch"])
def test_a_server_frozen_past_the_horizon_fails_the_write_naming_the_wait(
    kind: str, server: Started
) -> None:
    health = SinkHealth(["search"])
    sink = open_sink(kind, server, horizon=3, health=health)
    route = ready_route(sink)
    started = time.monotonic()
    try:
        freeze(server)
        with pytest.raises(TransientSinkError) as raised:
            sink.apply(route, [change(route, "c", 10, 8, product(8))])
    finally:
        resume(server)
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "sink search" in message and "gave up after waiting" in message
    assert f"search bulk {alias(route)}" in message
    # First failure after one request timeout, then the 3 s horizon, then at most one more.
    assert 3 <= elapsed <= 3 + 3 * ATTEMPT_TIMEOUT + 2
    assert health.status()["search"].state is SinkState.FAILED
    sink.close()


# The job's console, as `cdc-sync run` sets it up (quiet, log files in a directory), around one
# write of the search sink in this process, as the driver writes small batches.
CONSOLE_SCRIPT = """
import sys
from pathlib import Path
from cdc_sync.core.logs import setup_logging
from cdc_sync.core.retry import RetryPolicy
from cdc_sync.sinks.search import SearchSink
from tests.changes import change, products_route
from tests.envelopes import product

kind, url, logs, timeout = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
setup_logging(verbose=False, directory=logs)
policy = RetryPolicy(horizon_seconds=60, max_seconds=1.0, attempt_timeout_seconds=timeout)
sink = SearchSink(kind, url, tombstone_retention_seconds=3600, retry=policy)
route = products_route()
sink.ensure_target(route, change(route, "c", 1, 1, product(1)).schema)
print("ready", flush=True)
sys.stdin.readline()
print("applied", sink.apply(route, [change(route, "c", 10, 7, product(7))]).applied, flush=True)
sink.close()
"""
CONSOLE_LINE = re.compile(r"^\d\d:\d\d:\d\d (waiting for sink search|sink search) ")


@pytest.mark.parametrize("kind", ["opensearch", "elasticsearch"])
def test_a_frozen_server_shows_on_the_console_as_the_jobs_own_lines_only(
    kind: str, server: Started, tmp_path: Path
) -> None:
    """Issue 28: each timed-out request printed the client's traceback (urllib3, http.client,
    socket) or its node-pool line between the job's "waiting for sink" lines. Now the console
    has the job's lines only; the client's report, traceback and all, is in the log at DEBUG."""
    logs = tmp_path / "logs"
    argv = [sys.executable, "-c", CONSOLE_SCRIPT, kind, server.url, str(logs), str(ATTEMPT_TIMEOUT)]
    child = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        freeze(server)
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(FREEZE_SECONDS)  # several timed-out attempts
        resume(server)
        out, console = child.communicate(timeout=120)
    finally:
        resume(server)
        if child.poll() is None:
            child.kill()
    assert out.strip() == "applied 1", console
    lines = console.splitlines()
    assert lines and all(CONSOLE_LINE.match(line) for line in lines), console
    assert "waiting for sink search" in lines[0] and "answered again" in lines[-1]
    log = (logs / "job.log").read_text()
    reports = [
        line
        for line in log.splitlines()
        if re.match(r"\S+ \S+ DEBUG (opensearch|elastic_transport)", line)
    ]
    assert len(reports) >= 2, log  # one per failed request
    if kind == "opensearch":
        assert "Traceback (most recent call last)" in log and "ReadTimeoutError" in log
