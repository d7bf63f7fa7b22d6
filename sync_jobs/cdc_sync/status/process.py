"""Is the process the job's status file names still the job? A status file says "running" until
its process writes otherwise, which a killed process never does."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from cdc_sync.job.observe.status_file import JobStatus

# /proc gives start times in clock ticks after a boot time in whole seconds.
START_SLACK_SECONDS = 2.0


def job_alive(job: JobStatus, proc: Path = Path("/proc")) -> bool | None:
    """True when the job's pid runs on this host and started before the job did (not a reused
    pid); False when it does not; None when this host cannot tell (the job ran elsewhere)."""
    if job.host != socket.gethostname():
        return None
    try:
        os.kill(job.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    started = process_start(job.pid, proc)
    return started is None or started <= job.started_at + START_SLACK_SECONDS


def process_start(pid: int, proc: Path = Path("/proc")) -> float | None:
    """The process's start, in epoch seconds (None without a readable /proc)."""
    try:
        stat = (proc / str(pid) / "stat").read_text(encoding="utf-8")
        boot = next(
            float(line.split()[1])
            for line in (proc / "stat").read_text(encoding="utf-8").splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    # Field 22 (starttime), counted after the parenthesised command name, which may hold spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
