"""Where log lines go: a quiet console by default, everything in `<state dir>/logs/`.

The console (stderr) shows warnings, errors and the job's own concise lines (the `CONSOLE`
logger: one line per batch, start and stop); `-v` shows every logger at DEBUG there, Spark's
JVM output included. The files keep the full story either way: `job.log` (every Python logger,
the detailed per-batch summary among them) and `spark.log` (the driver JVM's output).
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from cdc_sync.core.settings import state_dir

CONSOLE = "cdc_sync.console"  # the logger of lines meant for the console
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
NOISY = ("py4j", "urllib3", "elastic_transport", "opensearch")


@dataclass(frozen=True)
class LogSettings:
    verbose: bool
    directory: Path | None  # None: no log files (commands that do not run the job)

    @property
    def jvm_log(self) -> Path | None:
        """Where the Spark driver JVM's output goes; None keeps it on the console (-v)."""
        return None if self.verbose or self.directory is None else self.directory / "spark.log"


_settings = LogSettings(verbose=True, directory=None)


def log_settings() -> LogSettings:
    return _settings


def default_log_dir() -> Path:
    return state_dir() / "logs"


class ConsoleHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever `sys.stderr` is now, so a live progress view that redirects it
    (rich) prints log lines above itself instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        # Not setStream: it flushes the previous stream first, which may be closed by now.
        self.stream = sys.stderr
        super().emit(record)


def _console_filter(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.name == CONSOLE


def setup_logging(verbose: bool, directory: Path | None = None) -> LogSettings:
    """Console handler (quiet unless `verbose`) and, with `directory`, the job log file."""
    global _settings
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    console = ConsoleHandler()
    if verbose:
        console.setFormatter(logging.Formatter(FORMAT))
    else:
        console.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        console.addFilter(_console_filter)
    root.addHandler(console)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        file = logging.handlers.RotatingFileHandler(
            directory / "job.log", maxBytes=20 * 1024 * 1024, backupCount=3
        )
        file.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(file)
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _settings = LogSettings(verbose, directory)
    return _settings
