"""Serve the job's metrics over HTTP (`cdc-sync run --metrics-port`): assembly and lifetime.

The endpoint binds 127.0.0.1 unless told otherwise (`--metrics-host`): the numbers name tables
and topics, which a network-wide listener would show to anyone who can reach the port.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from cdc_sync.core.settings import Connections
from cdc_sync.job.observe.capture_probes import (
    BrokerEndOffsets,
    CaptureProbes,
    SourceSlots,
)
from cdc_sync.job.observe.metrics import JobMetrics
from cdc_sync.job.write.health import SinkHealth

log = logging.getLogger(__name__)

DEFAULT_METRICS_HOST = "127.0.0.1"
DEFAULT_PROBE_SECONDS = 10.0  # a typical scrape interval: fresher reads would go unseen

ConnectorStatus = Callable[[], Mapping[str, Any]]


class MetricsEndpoint:
    """`JobMetrics` fed by the job, its background capture reads, and the HTTP server."""

    def __init__(
        self,
        connections: Connections,
        topics: list[str],
        health: SinkHealth,
        connector_status: ConnectorStatus | None = None,
        probe_interval_seconds: float = DEFAULT_PROBE_SECONDS,
        source_conninfo: str | None = None,
    ) -> None:
        """`source_conninfo`: the captured database, whose slots are read (None: not read)."""
        self._broker = BrokerEndOffsets(
            connections.require("kafka_bootstrap"), connections.kafka_flavor, topics
        )
        self.probes = CaptureProbes(
            end_offsets=self._broker,
            slots=SourceSlots(source_conninfo) if source_conninfo else None,
            connector_status=connector_status,
            interval_seconds=probe_interval_seconds,
        )
        self.metrics = JobMetrics(health, self.probes.readings)
        self._server: WSGIServer | None = None

    def serve(self, host: str, port: int) -> int:
        """Start serving `/metrics` and the background reads; the bound port (0 picks one)."""
        self._server, _ = start_http_server(port, addr=host, registry=self.metrics.registry)
        self.probes.start()
        bound = int(self._server.server_port)
        log.info("metrics on http://%s:%d/metrics", host, bound)
        return bound

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) being served, None before `serve`."""
        if self._server is None:
            return None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.probes.stop():
            self._broker.close()
