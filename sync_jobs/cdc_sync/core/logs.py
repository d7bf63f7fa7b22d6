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
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from cdc_sync.core.settings import state_dir

CONSOLE = "cdc_sync.console"  # the logger of lines meant for the console
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
NOISY = ("py4j", "urllib3", "elastic_transport", "opensearch")
# Client libraries that report each failed request themselves: opensearch-py a WARNING with the
# whole traceback (urllib3, http.client, socket), elastic-transport a WARNING per failure. The
# job says the same once, in its own line ("waiting for sink search ... retrying until"), and
# decides what is transient; so their reports go to the log file only, at DEBUG.
CLIENT_REPORTS = ("urllib3", "elastic_transport", "opensearch", "elasticsearch")


# Set by a stop signal (`stopping_now`): from then on Spark's JVM ending under a py4j call is the
# stop itself (a signal to the whole process group reaches the JVM too), not an error.
_stopping = threading.Event()


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


def _demote_client_reports(record: logging.LogRecord) -> bool:
    """A client library's report below ERROR becomes DEBUG (see CLIENT_REPORTS). A handler
    filter: a logger's own filter would miss its children's records (`opensearch.trace`)."""
    if record.levelno < logging.ERROR and record.name.split(".", 1)[0] in CLIENT_REPORTS:
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
    return True


def stopping_now() -> None:
    """The job was asked to stop: py4j's reports of its connection to Spark's JVM ending
    (`Exception while sending command.`, logged at ERROR with a traceback, on the root
    logger) go to the log file at DEBUG from now on, not to the console."""
    _stopping.set()


def _demote_py4j_after_stop(record: logging.LogRecord) -> bool:
    """A handler filter, as `_demote_client_reports`."""
    if _stopping.is_set() and "py4j" in Path(record.pathname).parts:
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
    return True


class OneLineFormatter(logging.Formatter):
    """The quiet console's lines: time and message, and an exception as its class and first
    line only: its traceback is in the log file, which every record reaches too."""

    def __init__(self, log_file: Path) -> None:
        super().__init__("%(asctime)s %(message)s", "%H:%M:%S")
        self.log_file = log_file

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            text = str(error).strip()
            first = text.splitlines()[0] if text else ""
            line += f" ({type(error).__name__}: {first}; traceback in {self.log_file})"
        return line


def setup_logging(verbose: bool, directory: Path | None = None) -> LogSettings:
    """Console handler (quiet unless `verbose`) and, with `directory`, the job log file."""
    global _settings
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    console = ConsoleHandler()
    console.addFilter(_demote_client_reports)
    console.addFilter(_demote_py4j_after_stop)
    if verbose:
        console.setFormatter(logging.Formatter(FORMAT))
    else:
        if directory is not None:
            console.setFormatter(OneLineFormatter(directory / "job.log"))
        else:  # no log file to hold a traceback: the console keeps it
            console.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        console.addFilter(_console_filter)
    root.addHandler(console)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        file = logging.handlers.RotatingFileHandler(
            directory / "job.log", maxBytes=20 * 1024 * 1024, backupCount=3
        )
        file.setFormatter(logging.Formatter(FORMAT))
        file.addFilter(_demote_client_reports)
        file.addFilter(_demote_py4j_after_stop)
        root.addHandler(file)
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _settings = LogSettings(verbose, directory)
    return _settings
