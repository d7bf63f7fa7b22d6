"""A Spark standalone cluster from the installed pyspark, for the cluster e2e scenario.

`spark-class org.apache.spark.deploy.master.Master` and one `...worker.Worker` per worker, each a
process of this test bound to 127.0.0.1 (`SPARK_LOCAL_IP` also binds their web UIs there), with
small heaps and one core per worker, so each executor is a JVM of its own under its worker, with
its own Python workers. `spark-defaults.conf` in `conf_dir` is for the driver (`SPARK_CONF_DIR`):
driver bound to loopback, small executors. Every process is stopped by PID: a worker's executor
JVMs and Python workers are found under it in /proc and remembered, so those a killed worker
leaves behind are stopped too (a PID is only signalled while it still names the same process).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark

from cdc_sync.localstack.process import free_port
from tests.adversarial.child import ChildProcess, wait_for

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
DAEMON_MEMORY = "256m"  # master and worker JVMs
WORKER_MEMORY = "1g"  # what a worker offers; one executor of EXECUTOR_MEMORY fits
EXECUTOR_MEMORY = "512m"
DRIVER_MEMORY = "768m"
START_TIMEOUT_SECONDS = 180.0  # a JVM start takes ~10 s idle, a minute on 2 busy cores
# Master, 2 workers, 2 executors, the driver and their Python workers, with room to spare.
MEMORY_NEEDED_BYTES = 3 * 2**30


def missing() -> str | None:
    """Why this machine cannot run the cluster (None: it can)."""
    if shutil.which("java") is None:
        return "no java on PATH (the Spark JVMs need one)"
    if not SPARK_CLASS.exists():
        return f"{SPARK_CLASS} not found (pyspark without its launch scripts)"
    meminfo = Path("/proc/meminfo").read_text()
    available = next(
        (
            int(line.split()[1]) * 1024
            for line in meminfo.splitlines()
            if line.startswith("MemAvailable:")
        ),
        None,
    )
    if available is not None and available < MEMORY_NEEDED_BYTES:
        needed = MEMORY_NEEDED_BYTES // 2**20
        return f"{available // 2**20} MiB of memory available, the cluster needs {needed} MiB"
    return None


@dataclass(frozen=True)
class Proc:
    """A process by PID and start time (a PID is reused once its process is gone)."""

    pid: int
    started: int
    command: str

    @classmethod
    def of(cls, pid: int) -> Proc | None:
        stat = _stat(pid)
        if stat is None:
            return None
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return None
        return cls(pid, int(stat[19]), command.strip())

    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and int(stat[19]) == self.started and stat[0] != "Z"

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    @property
    def kind(self) -> str:
        if "CoarseGrainedExecutorBackend" in self.command:
            return "executor JVM"
        if "deploy.worker.Worker" in self.command:
            return "worker JVM"
        if "pyspark.daemon" in self.command or "pyspark.worker" in self.command:
            return "Python worker"
        return self.command.split(" ", 1)[0]


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [0] state, [1] ppid, [19] start time."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def descendants(pid: int) -> list[Proc]:
    """Every live process under `pid`, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found: list[Proc] = []
    pending = list(children.get(pid, []))
    while pending:
        child = pending.pop(0)
        if (proc := Proc.of(child)) is not None:
            found.append(proc)
        pending += children.get(child, [])
    return found


def socket_owner(procs: list[Proc], local_port: int) -> Proc | None:
    """Which of `procs` holds the TCP socket whose local port is `local_port` (127.0.0.1)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == local_port:
                inodes.add(fields[9])
    for proc in procs:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{proc.pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return proc
    return None


class Daemon(ChildProcess):
    """A `spark-class` process (it execs the JVM), signalled by its PID alone: never its group,
    which executor JVMs of a killed worker still belong to."""

    def signal(self, sig: signal.Signals, timeout_seconds: float = 30.0) -> None:
        process = self.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        self._close_log()


class SparkCluster:
    def __init__(self, root: Path, workers: int, python_path: str) -> None:
        self.root = root
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.conf_dir = root / "conf"
        self.env = dict(os.environ) | {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_CONF_DIR": str(self.conf_dir),
            # Executors pass it on to their Python workers: they import this checkout's cdc_sync.
            "PYTHONPATH": python_path,
        }
        argv = [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--webui-port", str(self.ui_port)]
        self.master = Daemon("spark master", argv, self.env, root / "master.log")
        self.worker_starts = [0] * workers
        self.workers = [self._worker(index) for index in range(workers)]
        self.seen: dict[tuple[int, int], Proc] = {}  # every process found under a worker

    def _worker(self, index: int) -> Daemon:
        self.worker_starts[index] += 1
        work = self.root / f"worker{index}" / f"start{self.worker_starts[index]}"
        work.mkdir(parents=True, exist_ok=True)
        argv = [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", self.url]
        argv += ["--host", "127.0.0.1", "--cores", "1", "--memory", WORKER_MEMORY]
        argv += ["--webui-port", str(free_port()), "--work-dir", str(work)]
        return Daemon(f"spark worker {index}", argv, self.env, work / "worker.log")

    def write_driver_defaults(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        defaults = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": DRIVER_MEMORY,
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.executor.cores": "1",
        }
        lines = [f"{key} {value}" for key, value in defaults.items()]
        (self.conf_dir / "spark-defaults.conf").write_text("\n".join(lines) + "\n")

    # -- state --------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The master's JSON view: workers (state, cores) and active applications."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=10) as response:
            document: dict[str, Any] = json.loads(response.read())
        return document

    def _state_or_none(self) -> dict[str, Any] | None:
        try:
            return self.state()
        except OSError:
            return None

    def alive_workers(self) -> int:
        state = self._state_or_none()
        return 0 if state is None else int(state["aliveworkers"])

    def app_cores(self) -> int:
        """Cores the master granted the running application (one per live executor here)."""
        state = self._state_or_none()
        apps = [] if state is None else state["activeapps"]
        return sum(int(app["cores"]) for app in apps)

    def wait_workers(self, count: int, timeout_seconds: float = START_TIMEOUT_SECONDS) -> None:
        def ready() -> bool:
            self.raise_if_dead()
            return self.alive_workers() == count

        wait_for(f"{count} alive Spark workers", ready, timeout_seconds, 0.5)

    def wait_app_cores(self, cores: int, timeout_seconds: float = START_TIMEOUT_SECONDS) -> None:
        wait_for(
            f"{cores} executor cores granted",
            lambda: self.app_cores() == cores,
            timeout_seconds,
            0.5,
        )

    def wait_executor_registered(
        self, index: int, timeout_seconds: float = START_TIMEOUT_SECONDS
    ) -> None:
        """Until an executor of worker `index` has joined the application's driver (the
        master counts its cores as soon as it asks the worker to launch it)."""

        def registered() -> bool:
            self.raise_if_dead()
            return any(
                "Successfully registered with driver" in path.read_text(errors="replace")
                for path in self.executor_logs(index)
            )

        wait_for(f"an executor of worker {index} registered", registered, timeout_seconds, 0.5)

    def raise_if_dead(self) -> None:
        self.master.raise_if_dead()
        for worker in self.workers:
            worker.raise_if_dead()

    def worker_processes(self, index: int) -> list[Proc]:
        """The worker's JVM and everything under it (executor JVMs, Python workers), now."""
        pid = self.workers[index].pid
        root = None if pid is None else Proc.of(pid)
        found = [] if root is None else [root, *descendants(root.pid)]
        self.seen.update({(p.pid, p.started): p for p in found})
        return found

    def executor_logs(self, index: int) -> list[Path]:
        """stderr of the executors worker `index` (its current process) launched."""
        work = self.root / f"worker{index}" / f"start{self.worker_starts[index]}"
        return sorted(work.glob("app-*/*/stderr"))

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the master and the workers; `wait_ready()` waits for them (meanwhile the
        caller can start other things: a JVM start takes long on a busy machine)."""
        self.write_driver_defaults()
        self.master.start()
        for worker in self.workers:
            worker.start()  # it retries registering until the master is up

    def wait_ready(self) -> None:
        self.wait_workers(len(self.workers))

    def kill_worker(self, index: int) -> list[Proc]:
        """kill -9 of the worker, its executor JVM and its Python workers (a machine lost)."""
        victims = self.worker_processes(index)
        for proc in victims:
            proc.kill(signal.SIGKILL)
        self.workers[index].signal(signal.SIGKILL)  # reaps it and closes its log
        return victims

    def restart_worker(self, index: int) -> None:
        """A new worker process in place of worker `index` (a fresh work dir and UI port)."""
        assert not self.workers[index].alive(), "the worker still runs"
        self.workers[index] = self._worker(index)
        self.workers[index].start()

    def stop(self) -> None:
        """Workers (and whatever runs under them), then the master, each by PID: SIGTERM, then
        SIGKILL to anything left, including processes a killed worker left behind."""
        for index, worker in enumerate(self.workers):
            self.worker_processes(index)
            worker.signal(signal.SIGTERM)
        self.master.signal(signal.SIGTERM)
        for proc in self.seen.values():
            proc.kill(signal.SIGKILL)
