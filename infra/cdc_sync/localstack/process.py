"""Child processes of the local stack: free ports, start with a log file, wait, stop by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


class StackError(RuntimeError):
    """A service did not start; the message says which and where its log is."""


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


def wait_until(check: Callable[[], bool], what: str, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # not up yet: keep polling
            last_error = exc
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
    raise StackError(f"{what} not ready after {timeout}s ({last_error}); log {log}:\n{tail}")


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
    """SIGTERM the process group, wait, then SIGKILL it."""
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
            if not alive(pid):
                return
            time.sleep(0.1)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child: nothing to reap
        os.waitpid(pid, os.WNOHANG)
