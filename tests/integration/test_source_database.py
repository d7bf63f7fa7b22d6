"""One database per connector, everywhere (DESIGN.md invariant 7), on a real Postgres.

The issue's setup: a copy of connectors/shop.json with a `database.dbname` of its own (B) and a
mapping naming it, while CDC_SYNC_PG_URL names another database of the same server (A, without
the shop schema). Every command that reads Postgres refuses at start, naming the setting, the
connector file and both databases; with the URL unset it reads B.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from cdc_sync.cli import main
from cdc_sync.core.settings import SettingsError, write_env_file
from cdc_sync.debezium.connector import pg_env_from_url
from cdc_sync.debezium.database import Identity, identity
from cdc_sync.demo.workload import create_demo_schema
from tests.pg import private_database

pytestmark = pytest.mark.integration
SHOP_CONNECTOR = Path("connectors/shop.json")
SHOP_MAPPING = Path("mappings/shop.yaml")


@dataclass(frozen=True)
class Setup:
    url_db: str  # A: what CDC_SYNC_PG_URL names
    captured: str  # B: what the connector captures
    connector: Path
    mapping: Path
    url_env: Path  # CDC_SYNC_PG_URL = A
    parts_env: Path  # no URL; the connector's placeholders from CDC_SYNC_PG_HOST/...


def dbname(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


@pytest.fixture
def setup(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    for name in [k for k in __import__("os").environ if k.startswith("CDC_SYNC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CDC_SYNC_STATE_DIR", str(tmp_path / "state"))
    with private_database(pg_url, "url_db") as url_db, private_database(pg_url, "b") as captured:
        create_demo_schema(captured)
        doc = json.loads(SHOP_CONNECTOR.read_text())
        doc["config"]["database.dbname"] = dbname(captured)
        connector = tmp_path / "orders.json"
        connector.write_text(json.dumps(doc))
        mapping = tmp_path / "orders.yaml"
        mapping.write_text(
            SHOP_MAPPING.read_text().replace(
                "connector: ../connectors/shop.json", f"connector: {connector}"
            )
        )
        common = {"CDC_SYNC_WAREHOUSE": str(tmp_path / "warehouse")}
        url_env, parts_env = tmp_path / "url.env", tmp_path / "parts.env"
        write_env_file(url_env, common | {"CDC_SYNC_PG_URL": url_db})
        parts = {k: v for k, v in pg_env_from_url(pg_url).items() if k != "CDC_SYNC_PG_DB"}
        write_env_file(parts_env, common | parts)
        yield Setup(url_db, captured, connector, mapping, url_env, parts_env)


def commands(setup: Setup) -> list[list[str]]:
    mapping, connector = str(setup.mapping), str(setup.connector)
    return [
        ["run", "--mapping", mapping, "--available-now"],
        ["verify", "--mapping", mapping],
        ["repair", "--mapping", mapping],
        ["status", "--mapping", mapping],
        ["wait", "--lsn", "0/0", "--mapping", mapping],
        ["mappings", "validate", "--mapping", mapping],
        ["connectors", "validate", "--connector", connector],
        ["connectors", "snapshot", "--connector", connector, "--table", "shop.products"],
        ["connectors", "slots", "--connector", connector],
        ["capture", "--connector", connector],
    ]


def test_every_command_refuses_a_url_on_another_database_naming_both(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in commands(setup):
        code = main(["--env-file", str(setup.url_env), *argv])
        captured = capsys.readouterr()
        assert code == 2, (argv, captured.out, captured.err)
        error = captured.err
        assert str(setup.connector) in error, (argv, error)
        assert f"CDC_SYNC_PG_URL names {_described(setup.url_db)}" in error, (argv, error)
        assert f"captures {_described(setup.captured)}" in error, (argv, error)
        assert f"(database {dbname(setup.captured)} on server" in error, (argv, error)
        assert f"(database {dbname(setup.url_db)} on server" in error, (argv, error)


def test_without_the_url_commands_read_the_connectors_database(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    env = ["--env-file", str(setup.parts_env)]
    with psycopg.connect(setup.captured) as conn:
        row = conn.execute("SELECT count(*) FROM shop.products").fetchone()
    assert row is not None and row[0] > 0
    # verify: the source column counts B's rows (A has no shop schema at all).
    assert main([*env, "verify", "--mapping", str(setup.mapping), "--sink", "delta"]) == 1
    out = capsys.readouterr().out
    assert re.search(rf"^shop\.products\s+{row[0]}\s", out, re.M), out
    # mappings validate: B's catalog has every routed table.
    assert main([*env, "mappings", "validate", "--mapping", str(setup.mapping)]) == 0, (
        capsys.readouterr().err
    )
    capsys.readouterr()
    assert main([*env, "connectors", "slots", "--connector", str(setup.connector)]) == 0
    out = capsys.readouterr().out
    assert f"/{dbname(setup.captured)} (connector shop)\n" in out, out


def test_the_url_naming_the_captured_database_is_accepted_and_read(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another spelling of the same server ("localhost" for 127.0.0.1): the identity decides."""
    parts = urlsplit(setup.captured)
    other = parts._replace(netloc=parts.netloc.replace("127.0.0.1", "localhost"))
    assert other != parts
    env = setup.url_env.parent / "same.env"
    write_env_file(env, {"CDC_SYNC_PG_URL": urlunsplit(other), "CDC_SYNC_WAREHOUSE": "w"})
    assert (
        main(["--env-file", str(env), "mappings", "validate", "--mapping", str(setup.mapping)]) == 0
    )
    assert identity(setup.captured, "B") == identity(urlunsplit(other), "B again")


def test_identity_is_the_database_and_its_server(setup: Setup, pg_url: str) -> None:
    a, b = identity(setup.url_db, "A"), identity(setup.captured, "B")
    assert (a.database, b.database) == (dbname(setup.url_db), dbname(setup.captured))
    assert a.system == b.system and a.system.isdigit()  # one server, two databases
    assert a != b and isinstance(a, Identity)
    gone = urlunsplit(urlsplit(pg_url)._replace(path="/no_such_database"))
    with pytest.raises(SettingsError, match=r"^X: cannot read which database .*/no_such_database"):
        identity(gone, "X")


def _described(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.username}@{parts.hostname}:{parts.port}/{dbname(url)}"
