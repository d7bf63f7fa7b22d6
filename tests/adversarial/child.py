"""A child process of the adversarial suite in its own process group: started on a log file,
killed with SIGKILL (the whole group: a JVM and its helpers die with it) or stopped with SIGTERM,
and restarted on the same arguments. The sync job, the capture engine and the Connect worker."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from cdc_sync.localstack.process import group_members

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ChildProcess:
    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        assert self.process is None, f"{self.name} is already running"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log.open("ab")
        self.process = subprocess.Popen(
            self.argv,
            cwd=PROJECT_ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the JVM and workers die with it
        )
        self.starts += 1

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def raise_if_dead(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.process.returncode}; log tail:\n{self.tail()}"
            )

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """kill -9: nothing is flushed, closed or committed."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self._close_log()

    def stop(self, timeout_seconds: float = 60.0) -> None:
        """A graceful stop (SIGTERM), SIGKILL when it does not end in time."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self._close_log()

    def stop_timed(self, signum: int, whole_group: bool, timeout_seconds: float = 60.0) -> Stopped:
        """`signum` to the process (an orchestrator's SIGTERM) or to its whole group (a
        terminal's Ctrl-C), then wait: how long until the process exited, its exit code, and how
        long until nothing of its group (the JVM, Python workers) was left. What still runs
        after `timeout_seconds` is killed (SIGKILL); the figures then say so."""
        assert self.process is not None, f"{self.name} is not running"
        pgid = self.process.pid
        started = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            if whole_group:
                os.killpg(pgid, signum)
            else:
                self.process.send_signal(signum)
        try:
            returncode: int | None = self.process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            returncode = None
        exited = time.monotonic() - started
        left = group_members(pgid)
        while group_members(pgid) and time.monotonic() - started < timeout_seconds:
            time.sleep(0.05)
        gone = time.monotonic() - started
        if returncode is None or group_members(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self._close_log()
        return Stopped(exited, returncode, gone, left)

    def _close_log(self) -> None:
        self.process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


@dataclass(frozen=True)
class Stopped:
    """How a signalled child ended (ChildProcess.stop_timed)."""

    seconds: float  # signal -> the process exited
    returncode: int | None  # None: it did not exit in time (then killed)
    group_seconds: float  # signal -> nothing of its process group left
    left: list[str]  # what of its group still ran when it exited (java: Spark's JVM, ...)


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """SIGSTOP a process (it keeps its sockets but answers nothing) and always SIGCONT it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_for(
    what: str, check: Callable[[], bool], timeout_seconds: float, poll: float = 0.2
) -> None:
    """Poll `check()` until true; TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout_seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_seconds}s")
        time.sleep(poll)
