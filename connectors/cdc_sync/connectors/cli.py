"""`cdc-sync capture --connector connectors/<name>.json`: the connector in the embedded engine."""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading
from pathlib import Path

from cdc_sync.connectors.engine import CaptureEngine, default_state_dir
from cdc_sync.connectors.stored_offsets import StaleOffsets
from cdc_sync.core.logs import CONSOLE
from cdc_sync.core.settings import Connections

console = logging.getLogger(CONSOLE)  # shown on the quiet console (core.logs)


def capture_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cdc-sync capture", description=__doc__)
    parser.add_argument("--connector", required=True, help="Kafka Connect JSON (name + config)")
    parser.add_argument("--env-file", help="connection settings (default .cdc-sync/stack.env)")
    parser.add_argument(
        "--state-dir", help="offset store directory (default .cdc-sync/capture/<connector>)"
    )
    parser.add_argument(
        "--reset",
        action="store_true",
        help="forget the stored offsets first: start over with a new snapshot",
    )
    args = parser.parse_args(argv)
    connections = Connections.load(Path(args.env_file) if args.env_file else None)
    connector = Path(args.connector)
    state = Path(args.state_dir) if args.state_dir else default_state_dir(connector)
    engine = CaptureEngine.from_file(connector, connections, state)
    if args.reset and engine.reset_offsets():
        console.info("capture offsets removed: a new snapshot follows")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        engine.start()
    except StaleOffsets as stale:
        print(f"cdc-sync capture: {stale.with_way_out(_reset_command(args))}", file=sys.stderr)
        engine.publisher.close()
        return 2
    console.info("capture running: connector %s; Ctrl-C stops it", connector)
    try:
        while not stop.wait(1.0):
            engine.raise_if_failed()
    except RuntimeError as exc:
        print(f"cdc-sync capture: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.stop()
        console.info("capture stopped after publishing %d records", engine.published)
    return 0


def _reset_command(args: argparse.Namespace) -> str:
    """This command again, with --reset."""
    command = ["cdc-sync"]
    if args.env_file:
        command += ["--env-file", args.env_file]
    command += ["capture", "--connector", args.connector]
    if args.state_dir:
        command += ["--state-dir", args.state_dir]
    return shlex.join([*command, "--reset"])
