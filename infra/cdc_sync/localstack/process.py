"""Child processes of the local stack: free ports, start with a log file, wait, stop by PID.

A service that does not come up is named with the line of its log that says why
(`reason_line`), read from this start's part of the log: each start writes a marker line first,
as logs are appended to across restarts of a stack directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

START_MARK = "--- cdc-sync stack: starting "
# A line at a failure level, in the formats of the services' logs: log4j (`ERROR`), Postgres
# (`FATAL:`, `PANIC:`), Go and Rust (`panic:`, `error:`), a Java or Python exception class.
FAILURE = re.compile(r"\b(ERROR|FATAL|PANIC|CRITICAL)\b|\b(panic|error):|\b\w+(Exception|Error): ")
REASON_CHARS = 400  # a reason line longer than this is cut (a JVM line can be a whole trace)


class StackError(RuntimeError):
    """A service did not start; the message says which, why (a line of its log) and where its
    log is."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Started:
    name: str
    pid: int
    url: str
    log: Path


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    user: str | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Start `argv` in its own session (so stopping it stops its children), output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    command = list(argv)
    if user is not None:
        command = ["runuser", "-u", user, "--", *command]
    mark_start(log, name, command)
    with log.open("ab") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )
    return process.pid


def mark_start(log: Path, name: str, command: Sequence[str]) -> None:
    """Open this start's part of `log` (see `reason_line`)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with log.open("a", encoding="utf-8") as out:
        out.write(f"{START_MARK}{name} at {now}: {shlex.join(command)}\n")


def wait_until(
    check: Callable[[], bool],
    what: str,
    log: Path,
    timeout: float = 60.0,
    pid: int | None = None,
) -> None:
    """Until `check()` is true. With `pid` (the service's process), a process that ends first
    fails at once, and one that does not answer in time is stopped: either way the error names
    the line of its log that says why."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # not up yet: keep polling
            last_error = exc
        if pid is not None and not alive(pid):
            raise StackError(f"{what} exited before it answered: {log_reason(log, last_error)}")
        time.sleep(0.2)
    if pid is not None:
        stop_pid(pid)
    raise StackError(f"{what} did not answer within {timeout:g} s: {log_reason(log, last_error)}")


def log_reason(log: Path, last_error: Exception | None = None) -> str:
    """Why a service did not come up, from its log (`reason_line`), and where the log is."""
    text = log.read_text(errors="replace") if log.exists() else ""
    reason = reason_line(text)
    if reason is None:
        reason = f"its log says nothing; last check: {last_error}"
    return f"{reason} (log {log})"


def reason_line(log_text: str) -> str | None:
    """The line of a service's log that says why it did not come up: the first at a failure
    level in this start's part of the log (after the last start marker), else its last line
    (a process that exits says why last: Redis's "Failed listening on port ..., aborting")."""
    lines = log_text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(START_MARK)]
    own = [line.strip() for line in lines[starts[-1] + 1 if starts else 0 :] if line.strip()]
    failures = [line for line in own if FAILURE.search(line)]
    found = failures[0] if failures else own[-1] if own else None
    if found is None or len(found) <= REASON_CHARS:
        return found
    return found[: REASON_CHARS - 3] + "..."


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); look at its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop_pid(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM the process group, wait until none of it is left, then SIGKILL it. The whole
    group: a wrapper that exits at once can leave its child shutting down (noida-db's console
    script and its server, which took 5-20 s and more after a SIGTERM with 180 MB or more)."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pid)
            if not alive(pid) and not group_members(pid):
                return
            time.sleep(0.1)


def group_members(pgid: int) -> list[str]:
    """The command names of process group `pgid`'s live processes, from /proc (zombies
    awaiting their reaper do not count)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, rest = stat.read_text().rsplit(")", 1)
        except OSError:  # gone meanwhile
            continue
        fields = rest.split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(name.split("(", 1)[1])
    return sorted(found)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child: nothing to reap
        os.waitpid(pid, os.WNOHANG)
