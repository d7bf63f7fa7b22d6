"""`cdc-sync capture --connector connectors/<name>.json`: the connector in the embedded engine."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from cdc_sync.connectors.engine import CaptureEngine
from cdc_sync.core.logs import CONSOLE
from cdc_sync.core.settings import Connections, state_dir

console = logging.getLogger(CONSOLE)  # shown on the quiet console (core.logs)


def capture_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cdc-sync capture", description=__doc__)
    parser.add_argument("--connector", required=True, help="Kafka Connect JSON (name + config)")
    parser.add_argument("--env-file", help="connection settings (default .cdc-sync/stack.env)")
    parser.add_argument(
        "--state-dir", help="offset store directory (default .cdc-sync/capture/<connector>)"
    )
    args = parser.parse_args(argv)
    connections = Connections.load(Path(args.env_file) if args.env_file else None)
    connector = Path(args.connector)
    state = Path(args.state_dir) if args.state_dir else state_dir() / "capture" / connector.stem
    engine = CaptureEngine.from_file(connector, connections, state)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine.start()
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
