"""pgsync (PyPI `pgsync`, 7.x) as a comparison tool: its own virtualenv, a schema.json built from
the shop mapping's search routes (flat, `schema_document`) or from one of its document specs
(nested, `nested_schema_document`), `bootstrap`, then its daemon as a subprocess.

pgsync is never a dependency of the project: `ensure_venv` installs it on first use into
`.cdc-sync/pgsync-venv` (ignored by git). Its settings are environment variables read by
`pgsync/settings.py`; the daemon runs in a directory of its own (it reads `./.env` and writes its
checkpoint files there).

Its daemon (trigger mode, the default): `pull()` does the initial sync (a query per root table,
bulks of `ELASTICSEARCH_CHUNK_SIZE` documents through opensearch-py's `parallel_bulk`), then
per-row triggers NOTIFY, a producer thread queues the notifications in Redis (once
`REDIS_WRITE_CHUNK_SIZE` have gathered or none came for `POLL_TIMEOUT`: what its freshness hangs
on, see bench_pgsync.TUNED) and consumer threads pop them (`REDIS_READ_CHUNK_SIZE`), re-read the
rows and bulk them into the index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opensearchpy import OpenSearch

from cdc_sync.core.model import TableId
from cdc_sync.localstack.process import alive, stop_pid
from cdc_sync.mapping import MappingFile
from cdc_sync.relations import DocumentSpec, Kind, Level, Relation

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".cdc-sync" / "pgsync-venv"
REQUIREMENT = "pgsync>=7,<8"
TABLES = (TableId("shop", "customers"), TableId("shop", "orders"))
INDEX_PREFIX = "pgsync_"


def index_name(table: TableId) -> str:
    """pgsync's index for `table`: beside cdc-sync's names, never one of them."""
    return f"{INDEX_PREFIX}{table.schema}_{table.table}"


def document_index_name(spec: DocumentSpec) -> str:
    """pgsync's index for a document spec (cdc-sync's is the spec's alias)."""
    return f"{INDEX_PREFIX}{spec.name}"


def ensure_venv(venv: Path = VENV) -> Path:
    """The venv's bin directory; created, and pgsync installed, on first use."""
    marker = venv / ".installed"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
             REQUIREMENT],
            check=True,
        )  # fmt: skip
        marker.write_text(REQUIREMENT + "\n")
    return venv / "bin"


def installed_version(bin_dir: Path) -> str:
    found = subprocess.run(
        [str(bin_dir / "python"), "-c", "import pgsync; print(pgsync.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return found.stdout.strip()


def schema_document(mapping: MappingFile, database: str) -> list[dict[str, Any]]:
    """One pgsync index per table, a root node only (flat documents), with the fields and field
    mapping of the mapping file's search route (orders: its projection; customers: every column)."""
    documents = []
    for table in TABLES:
        route = mapping.tables[table]
        if route.search is None:
            raise ValueError(f"{mapping.path}: {table} has no search route to compare with")
        properties = dict(route.search.mapping.get("properties", {}))
        documents.append({
            "database": database,
            "index": index_name(table),
            "nodes": {"table": table.table, "schema": table.schema, "columns": list(properties)},
            "mapping": properties,
        })  # fmt: skip
    return documents


def nested_schema_document(
    spec: DocumentSpec, database: str, properties: dict[str, Any]
) -> list[dict[str, Any]]:
    """One pgsync index for a document spec: a node per level (its columns, its renames as a
    `rename` transform, labelled with the relation's field name) and the relation as pgsync's
    `relationship` (kind one: `one_to_one`, many: `one_to_many`; both `object`; the join's pairs
    as the explicit foreign key, parent columns on the parent's table). `properties`: the index
    mapping, cdc-sync's own for the spec, so both indices type every field alike.

    What pgsync's schema has no words for is refused or left out: a join table (`through`) is
    refused (not needed here); the root `filter` and the arrays' `order_by` are left out, and
    the caller says so (pgsync indexes every root row; its arrays come in JSON_AGG's order)."""
    return [{
        "database": database,
        "index": document_index_name(spec),
        "nodes": _node(spec, None),
        "mapping": properties,
    }]  # fmt: skip


def _node(level: Level, via: Relation | None) -> dict[str, Any]:
    node: dict[str, Any] = {"table": level.table.table, "schema": level.table.schema}
    if level.columns is not None:
        node["columns"] = list(level.columns)
    if level.rename:
        node["transform"] = {"rename": dict(level.rename)}
    if via is not None:
        if via.through is not None:
            raise ValueError(f"relation {via.name!r}: a join table is not written for pgsync")
        node["label"] = via.name
        node["relationship"] = {
            "variant": "object",
            "type": "one_to_one" if via.kind is Kind.ONE else "one_to_many",
            "foreign_key": {
                "parent": [parent for parent, _ in via.on],
                "child": [child for _, child in via.on],
            },
        }
    if level.relations:
        node["children"] = [_node(relation, relation) for relation in level.relations]
    return node


def environment(
    pg_url: str, search_url: str, redis_url: str, workdir: Path, tuning: dict[str, str]
) -> dict[str, str]:
    """pgsync's settings for the local stack (names from pgsync/settings.py), plus `tuning`."""
    pg, search, cache = urlsplit(pg_url), urlsplit(search_url), urlsplit(redis_url)
    settings = {
        "PG_HOST": pg.hostname or "127.0.0.1",
        "PG_PORT": str(pg.port or 5432),
        "PG_USER": pg.username or "postgres",
        "PG_DATABASE": pg.path.lstrip("/"),
        "ELASTICSEARCH_SCHEME": search.scheme,
        "ELASTICSEARCH_HOST": search.hostname or "127.0.0.1",
        "ELASTICSEARCH_PORT": str(search.port or 9200),
        "OPENSEARCH": "true",
        "REDIS_HOST": cache.hostname or "127.0.0.1",
        "REDIS_PORT": str(cache.port or 6379),
        "REDIS_DB": cache.path.lstrip("/") or "0",
        "CHECKPOINT_PATH": str(workdir),
        # A request timeout, not a tuning: pgsync's 10 s default times out its own initial
        # bulks (5,000 nested documents) on the local search server at 50,000 orders.
        "ELASTICSEARCH_TIMEOUT": "120",
    }
    if pg.password:
        settings["PG_PASSWORD"] = pg.password
    # Only what the process needs: no PG*/REDIS*/ELASTICSEARCH* of the caller's shell leaks in.
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TZ") if k in os.environ}
    return base | settings | tuning


@dataclass
class PgSync:
    """One pgsync deployment: its schema file, bootstrap, and its daemon (stop() by PID)."""

    bin_dir: Path
    workdir: Path
    env: dict[str, str]
    search_url: str
    # The indices its documents go to (counted by `documents`): by default the flat ones.
    indices: tuple[str, ...] = tuple(index_name(table) for table in TABLES)
    pid: int | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.schema = self.workdir / "schema.json"
        self.log = self.workdir / "pgsync.log"
        self.search = OpenSearch(hosts=[self.search_url], timeout=30)

    def write_schema(self, documents: list[dict[str, Any]]) -> None:
        self.schema.write_text(json.dumps(documents, indent=2))

    def bootstrap(self) -> float:
        """Triggers, functions and replication slots; returns its seconds."""
        started = time.monotonic()
        with (self.workdir / "bootstrap.log").open("ab") as out:
            done = subprocess.run(
                [str(self.bin_dir / "bootstrap"), "--config", str(self.schema)],
                cwd=self.workdir,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=600,
            )
        if done.returncode != 0:
            tail = (self.workdir / "bootstrap.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"pgsync bootstrap failed (exit {done.returncode}):\n{tail}")
        return time.monotonic() - started

    def start_daemon(self) -> None:
        """`pgsync --config schema.json --daemon`, in its own session (stop() stops it whole)."""
        with self.log.open("ab") as out:
            process = subprocess.Popen(
                [str(self.bin_dir / "pgsync"), "--config", str(self.schema), "--daemon"],
                cwd=self.workdir,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid = process.pid

    def documents(self) -> int:
        """Documents in pgsync's indices (0 for one not created yet)."""
        total = 0
        for name in self.indices:
            if self.search.indices.exists(index=name):
                total += int(self.search.count(index=name)["count"])
        return total

    def wait_documents(self, expected: int, timeout: float) -> float:
        """Seconds until pgsync's indices hold `expected` documents (from now)."""
        started = time.monotonic()
        while (count := self.documents()) < expected:
            if self.pid is not None and not alive(self.pid):
                tail = self.log.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"pgsync exited in its initial sync; log {self.log}:\n{tail}")
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"pgsync: {count} of {expected} documents after {timeout}s")
            time.sleep(0.2)
        return time.monotonic() - started

    def stop(self) -> None:
        if self.pid is not None and alive(self.pid):
            stop_pid(self.pid)
        self.pid = None
        self.search.close()
