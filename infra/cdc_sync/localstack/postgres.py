"""A private PostgreSQL cluster: initdb as the `postgres` user, logical WAL, loopback only."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from cdc_sync.localstack.process import (
    StackError,
    Started,
    free_port,
    log_reason,
    mark_start,
    wait_until,
)

ADMIN_ROLE = "cdc_admin"
DATABASE = "shop"
SERVICE_USER = "postgres"  # initdb refuses to run as root


def pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or (
        [p] if (p := shutil.which(name)) else []
    )
    if not found:
        raise StackError(f"PostgreSQL server binary {name!r} not found (run `make bootstrap`)")
    return found[-1]


def _as_service_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", SERVICE_USER, "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str], log: Path) -> None:
    name = Path(argv[0]).name
    mark_start(log, name, argv)
    with log.open("ab") as out:
        result = subprocess.run(_as_service_user(argv), stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise StackError(f"{name} failed (exit {result.returncode}): {log_reason(log)}")


def cluster_dir(wanted: Path) -> Path:
    """`wanted`, unless the service user cannot reach it (e.g. under a 0700 home or pytest
    tmp dir when running as root): then a fresh directory under the system temp dir."""
    wanted.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return wanted
    shutil.chown(wanted, SERVICE_USER)
    reachable = subprocess.run(_as_service_user(["test", "-w", str(wanted)])).returncode == 0
    if reachable:
        return wanted
    fallback = Path(tempfile.mkdtemp(prefix="cdc-sync-pg-"))
    fallback.chmod(0o755)
    shutil.chown(fallback, SERVICE_USER)
    return fallback


def start_postgres(root: Path) -> Started:
    """Start (initdb on first use) a cluster under `root` (see cluster_dir); the URL's
    database is `shop`, the role `cdc_admin` is a superuser with REPLICATION."""
    root = cluster_dir(root)
    data, log = root / "data", root / "postgres.log"
    log.touch()
    if os.geteuid() == 0:
        shutil.chown(log, SERVICE_USER)  # the server appends to it too
    port = free_port()
    if not (data / "PG_VERSION").exists():
        _run(
            [pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", SERVICE_USER, "-E", "UTF8"],
            log,
        )
    options = " ".join(
        [
            "-c wal_level=logical",
            "-c max_replication_slots=20",
            "-c max_wal_senders=20",
            "-c listen_addresses=127.0.0.1",
            f"-c port={port}",
            f"-c unix_socket_directories={root}",
            "-c fsync=off",  # a throwaway cluster: durability is not the point here
        ]
    )
    _run(
        [
            pg_bin("pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        ],
        log,
    )
    admin_url = f"postgresql://{SERVICE_USER}@127.0.0.1:{port}/postgres"
    wait_until(lambda: _answers(admin_url), "postgres", log)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if (
            conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ADMIN_ROLE,)).fetchone()
            is None
        ):
            conn.execute(f"CREATE ROLE {ADMIN_ROLE} LOGIN SUPERUSER REPLICATION".encode())
        if (
            conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
            is None
        ):
            conn.execute(f"CREATE DATABASE {DATABASE} OWNER {ADMIN_ROLE}".encode())
    pid = int((data / "postmaster.pid").read_text().split()[0])
    return Started("postgres", pid, f"postgresql://{ADMIN_ROLE}@127.0.0.1:{port}/{DATABASE}", log)


def _answers(url: str) -> bool:
    with psycopg.connect(url, connect_timeout=2) as conn:
        return conn.execute("SELECT 1").fetchone() is not None


def stop_postgres(started: Started) -> None:
    root = started.log.parent
    data = root / "data"
    if (data / "postmaster.pid").exists():
        _run([pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], root / "postgres.log")
