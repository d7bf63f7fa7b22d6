"""The local stack: Postgres, a Kafka-protocol broker, the search stand-in and Redis.

`start()` records what it started in `<root>/pids.json`; `stop()` stops exactly those, by PID,
even from another process (`cdc-sync stack down`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from cdc_sync.core import settings
from cdc_sync.core.settings import Connections
from cdc_sync.localstack.connect import start_connect
from cdc_sync.localstack.postgres import start_postgres, stop_postgres
from cdc_sync.localstack.process import Started, alive, stop_pid
from cdc_sync.localstack.services import start_broker, start_redis, start_search

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StackUrls:
    pg_url: str
    kafka_bootstrap: str
    kafka_flavor: str
    search_url: str
    redis_url: str
    connect_url: str | None = None

    def connections(self, warehouse: Path | None = None) -> Connections:
        """The stack's services as the job's settings (search through opensearch-py)."""
        return Connections(
            pg_url=self.pg_url,
            kafka_bootstrap=self.kafka_bootstrap,
            kafka_flavor=self.kafka_flavor,
            search_url=self.search_url,
            search_client="opensearch",
            redis_url=self.redis_url,
            connect_url=self.connect_url,
            warehouse=None if warehouse is None else str(warehouse),
        )

    def env(self, warehouse: Path) -> dict[str, str]:
        connect = {settings.CONNECT_URL: self.connect_url} if self.connect_url else {}
        return connect | {
            settings.PG_URL: self.pg_url,
            settings.KAFKA_BOOTSTRAP: self.kafka_bootstrap,
            settings.KAFKA_FLAVOR: self.kafka_flavor,
            settings.SEARCH_URL: self.search_url,
            settings.SEARCH_CLIENT: "opensearch",
            settings.REDIS_URL: self.redis_url,
            settings.WAREHOUSE: str(warehouse),
        }


class LocalStack:
    def __init__(self, root: Path, broker: str = "tansu", with_connect: bool = True) -> None:
        self.root = root
        self.broker = broker
        self.with_connect = with_connect
        self.record = root / "pids.json"

    def started(self) -> list[Started]:
        if not self.record.exists():
            return []
        entries = json.loads(self.record.read_text())["services"]
        return [Started(e["name"], e["pid"], e["url"], Path(e["log"])) for e in entries]

    def is_up(self) -> bool:
        services = self.started()
        return bool(services) and all(alive(s.pid) for s in services)

    def urls(self) -> StackUrls:
        by_name = {s.name: s for s in self.started()}
        broker = next(s for s in by_name.values() if s.name in ("tansu", "noida"))
        connect = by_name.get("connect")
        return StackUrls(
            by_name["postgres"].url,
            broker.url,
            broker.name,
            by_name["search"].url,
            by_name["redis"].url,
            connect.url if connect else None,
        )

    def start(self) -> StackUrls:
        if self.is_up():
            log.info("local stack already up (%s)", self.record)
            return self.urls()
        self.stop()  # a half-dead earlier stack: clear it first
        self.root.mkdir(parents=True, exist_ok=True)
        started: list[Started] = []
        try:
            steps = [
                lambda: start_postgres(self.root / "postgres"),
                lambda: start_broker(self.root, self.broker),
                lambda: start_search(self.root),
                lambda: start_redis(self.root),
            ]
            if self.with_connect:
                steps.append(
                    lambda: start_connect(
                        self.root / "connect", started[1].url, self.broker, started[0].url
                    )
                )
            for start in steps:
                started.append(start())
                self._save(started)
        except BaseException:
            self.stop()
            raise
        return self.urls()

    def stop(self) -> None:
        for service in reversed(self.started()):
            try:
                if service.name == "postgres":
                    stop_postgres(service)
                if alive(service.pid):
                    stop_pid(service.pid)
            except Exception:  # keep stopping the others
                log.exception("stopping %s (pid %d) failed", service.name, service.pid)
        self.record.unlink(missing_ok=True)

    def _save(self, started: list[Started]) -> None:
        services = [asdict(s) | {"log": str(s.log)} for s in started]
        self.record.write_text(json.dumps({"broker": self.broker, "services": services}, indent=2))
