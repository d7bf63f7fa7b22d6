"""Connection settings shared by every command: read from the environment or a stack env file.

The local stack (`cdc-sync stack up`) writes its service URLs to an env file of plain
``KEY=VALUE`` lines; every other command reads the same keys from the process environment first,
then from that file, so production deployments just export the variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR_VAR = "CDC_SYNC_STATE_DIR"
DEFAULT_STATE_DIR = ".cdc-sync"
ENV_FILE_NAME = "stack.env"

PG_URL = "CDC_SYNC_PG_URL"
KAFKA_BOOTSTRAP = "CDC_SYNC_KAFKA_BOOTSTRAP"
KAFKA_FLAVOR = "CDC_SYNC_KAFKA_FLAVOR"
SEARCH_URL = "CDC_SYNC_SEARCH_URL"
SEARCH_CLIENT = "CDC_SYNC_SEARCH_CLIENT"
REDIS_URL = "CDC_SYNC_REDIS_URL"
CONNECT_URL = "CDC_SYNC_CONNECT_URL"
WAREHOUSE = "CDC_SYNC_WAREHOUSE"

KAFKA_FLAVORS = ("kafka", "tansu", "noida")
SEARCH_CLIENTS = ("opensearch", "elasticsearch")


class SettingsError(ValueError):
    """A connection setting is missing or invalid; the message names the variable."""


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_VAR, DEFAULT_STATE_DIR)).resolve()


def default_env_file() -> Path:
    return state_dir() / ENV_FILE_NAME


def read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, sep, value = stripped.partition("=")
        if not sep:
            raise SettingsError(f"{path}:{number}: expected KEY=VALUE, got {stripped!r}")
        values[name.strip()] = value.strip()
    return values


def write_env_file(path: Path, values: Mapping[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# written by `cdc-sync stack up`; removed by `cdc-sync stack down`"]
    lines += [f"{name}={value}" for name, value in sorted(values.items())]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class Connections:
    """Where the services are. Built once per command from env vars, then the env file."""

    pg_url: str | None
    kafka_bootstrap: str | None
    kafka_flavor: str
    search_url: str | None
    search_client: str
    redis_url: str | None
    connect_url: str | None
    warehouse: str | None
    # The env file overlaid by the whole process environment: what `${env:NAME}` placeholders
    # of connector files resolve against. Kept out of repr: it holds secrets.
    environment: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def load(cls, env_file: Path | None = None) -> Connections:
        merged: dict[str, str] = {}
        path = env_file or default_env_file()
        if path.exists():
            merged.update(read_env_file(path))
        elif env_file is not None:
            raise SettingsError(f"env file {path} does not exist (run `cdc-sync stack up`)")
        environment = merged | dict(os.environ)
        merged.update({k: v for k, v in os.environ.items() if k.startswith("CDC_SYNC_")})
        flavor = merged.get(KAFKA_FLAVOR, "kafka")
        if flavor not in KAFKA_FLAVORS:
            raise SettingsError(f"{KAFKA_FLAVOR}={flavor!r}: expected one of {KAFKA_FLAVORS}")
        client = merged.get(SEARCH_CLIENT, "opensearch")
        if client not in SEARCH_CLIENTS:
            raise SettingsError(f"{SEARCH_CLIENT}={client!r}: expected one of {SEARCH_CLIENTS}")
        return cls(
            pg_url=merged.get(PG_URL),
            kafka_bootstrap=merged.get(KAFKA_BOOTSTRAP),
            kafka_flavor=flavor,
            search_url=merged.get(SEARCH_URL),
            search_client=client,
            redis_url=merged.get(REDIS_URL),
            connect_url=merged.get(CONNECT_URL),
            warehouse=merged.get(WAREHOUSE),
            environment=environment,
        )

    def require(self, field: str) -> str:
        value = getattr(self, field)
        if not value:
            var = f"CDC_SYNC_{field.upper()}"
            raise SettingsError(f"{var} is not set (export it or run `cdc-sync stack up`)")
        return str(value)
