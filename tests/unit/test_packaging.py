"""Every package of the source tree is listed in pyproject.toml's `packages`: an unlisted one
works in an editable install (`make install`) and is missing from a wheel (`pip install .`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_listed() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    roots = {name: REPO / folder for name, folder in config["package-dir"].items()}
    found = set()
    for prefix, root in roots.items():
        for init in root.rglob("__init__.py"):
            parts = init.parent.relative_to(root).parts
            found.add(".".join(p for p in (prefix, *parts) if p))
    assert found - listed == set()
