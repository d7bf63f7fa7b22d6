"""Capture for an adversarial pipeline, in a process of its own so a fault is a real `kill -9`.

- `EngineCapture`: `cdc-sync capture --connector FILE --state-dir DIR` (the embedded Debezium
  engine, offsets in a file under DIR).
- `ConnectCapture`: a Kafka Connect 3.9 distributed worker (the local stack's recipe,
  cdc_sync.localstack.connect) with the same connector registered over REST; offsets in the
  worker's offsets topic. A restart reuses the worker's properties (group, port, topics).

Both keep the replication slot on stop (`slot.drop.on.stop=false` in the pipeline's settings), so
a restart streams what changed meanwhile; ready means the slot is held by the new process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import psycopg

from cdc_sync.connectors.rest import ConnectClient, ConnectError
from cdc_sync.debezium.connector import pg_env_from_url
from cdc_sync.localstack.connect import LOG4J, POSTGRES_CONNECTOR, worker_home, worker_properties
from cdc_sync.localstack.process import free_port
from tests.adversarial.child import ChildProcess, wait_for

READY_TIMEOUT_SECONDS = 180.0  # a restart after kill -9 may wait out Debezium's slot retries


class Capture(Protocol):
    name: str

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...
    def raise_if_dead(self) -> None: ...


def slot_holder(pg_url: str, slot: str) -> int | None:
    """PID of the walsender holding the slot (None: inactive or not created yet)."""
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s AND active",
            (slot,),
        ).fetchone()
    return None if row is None else int(row[0])


class _SlotReadiness:
    """Ready once a walsender other than the previous start's holds the slot (after a kill -9
    the old one lingers until Postgres notices; Debezium retries while it is still active)."""

    def __init__(self, pg_url: str, slot: str) -> None:
        self.pg_url = pg_url
        self.slot = slot
        self.holder: int | None = None

    def wait(self, process: ChildProcess) -> None:
        previous = self.holder

        def held() -> bool:
            process.raise_if_dead()
            holder = slot_holder(self.pg_url, self.slot)
            if holder is None or holder == previous:
                return False
            self.holder = holder
            return True

        wait_for(f"{process.name} holding slot {self.slot}", held, READY_TIMEOUT_SECONDS, 0.5)


class EngineCapture:
    """The embedded engine as `cdc-sync capture` in its own process group."""

    name = "capture (embedded engine)"

    def __init__(
        self, connector: Path, root: Path, env: dict[str, str], pg_url: str, slot: str
    ) -> None:
        self.state_dir = root / "capture"  # its offset file
        argv = [sys.executable, "-m", "cdc_sync.cli", "capture", "--connector", str(connector)]
        argv += ["--state-dir", str(self.state_dir)]
        self.process = ChildProcess(self.name, argv, env, root / "capture.log")
        self.ready = _SlotReadiness(pg_url, slot)

    def start(self) -> None:
        self.process.start()
        self.ready.wait(self.process)

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        self.process.kill()

    def raise_if_dead(self) -> None:
        self.process.raise_if_dead()

    def forget_offsets(self) -> None:
        """Stopped capture's offset file removed: the next start snapshots again."""
        assert not self.process.alive(), "stop capture first"
        shutil.rmtree(self.state_dir, ignore_errors=True)


class ConnectCapture:
    """A Connect worker of its own with the pipeline's connector registered on it."""

    name = "Kafka Connect worker"

    def __init__(
        self,
        connector: Mapping[str, str],
        root: Path,
        bootstrap: str,
        flavor: str,
        pg_url: str,
        worker_overrides: Mapping[str, str] | None = None,
    ) -> None:
        home = worker_home()
        if not (home / ".assembled").exists():
            raise RuntimeError(f"Kafka Connect worker not assembled in {home} (make bootstrap)")
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java not found (make bootstrap)")
        self.connector = dict(connector)
        root.mkdir(parents=True, exist_ok=True)
        port = free_port()
        group = f"adv-connect-{uuid.uuid4().hex[:6]}"
        self.offsets_topic = f"_{group}_offsets"  # worker_properties' offset.storage.topic
        properties = root / "worker.properties"
        lines = "".join(f"{k}={v}\n" for k, v in (worker_overrides or {}).items())
        # Later keys win in a properties file.
        properties.write_text(worker_properties(bootstrap, flavor, port, home, group) + lines)
        log_config = root / "log4j2.properties"
        log_config.write_text(LOG4J)
        argv = [java, "-Xmx768m", f"-Dlog4j2.configurationFile={log_config}"]
        argv += ["-cp", f"{home / 'classpath'}/*"]
        argv += ["org.apache.kafka.connect.cli.ConnectDistributed", str(properties)]
        # ${env:CDC_SYNC_PG_*} in the connector resolve in the worker, to the pipeline's database.
        env = dict(os.environ) | pg_env_from_url(pg_url)
        self.process = ChildProcess(self.name, argv, env, root / "connect.log")
        self.client = ConnectClient(f"http://127.0.0.1:{port}", timeout=30)
        self.ready = _SlotReadiness(pg_url, self.connector["slot.name"])
        self.registered = False

    def start(self) -> None:
        self.process.start()
        wait_for("Kafka Connect REST", self._serves, READY_TIMEOUT_SECONDS, 0.5)
        if not self.registered:  # afterwards the worker reads it back from its config topic
            self.client.put_config(self.connector["name"], self.connector)
            self.registered = True
        wait_for("connector task RUNNING", self._task_running, READY_TIMEOUT_SECONDS, 0.5)
        self.ready.wait(self.process)

    def _serves(self) -> bool:
        self.process.raise_if_dead()
        try:
            return any(p.get("class") == POSTGRES_CONNECTOR for p in self.client.plugins())
        except (OSError, ConnectError):
            return False

    def _task_running(self) -> bool:
        self.process.raise_if_dead()
        try:
            status = self.client.status(self.connector["name"])
        except (OSError, ConnectError):
            return False
        tasks = status.get("tasks", [])
        failed = [t for t in tasks if t.get("state") == "FAILED"]
        if failed:
            raise AssertionError(f"connector task failed: {failed[0].get('trace', '')[:2000]}")
        return bool(tasks) and all(t.get("state") == "RUNNING" for t in tasks)

    def stop(self) -> None:
        if self.process.alive():
            # The slot stays: dropped with the database.
            with contextlib.suppress(OSError, ConnectError):
                self.client.delete(self.connector["name"])
        self.process.stop()

    def kill(self) -> None:
        self.process.kill()

    def raise_if_dead(self) -> None:
        self.process.raise_if_dead()
