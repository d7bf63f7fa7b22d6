"""One finding of `cdc-sync connectors validate`: what to change, and why."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    severity: str  # "error" | "warning" | "note" (how something is handled; counts as neither)
    setting: str  # what to change: a connector key, a Postgres setting, a grant
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.setting}: {self.message}"
