"""Config validation errors that name the file and the field path."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    def __init__(self, source: Path | str, path: str, message: str) -> None:
        super().__init__(f"{source}: {path}: {message}")
        self.source = str(source)
        self.path = path
        self.message = message


class FieldReader:
    """Reads one YAML mapping, tracking the path; rejects unknown keys with the known ones."""

    def __init__(self, source: Path | str, path: str, data: Any) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(
                source, path or "<root>", f"expected a mapping, got {type(data).__name__}"
            )
        self.source = source
        self.path = path
        self.data: Mapping[str, Any] = data

    def child_path(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, message: str) -> ConfigError:
        return ConfigError(self.source, self.child_path(name), message)

    def reject_unknown(self, known: Iterable[str]) -> None:
        allowed = sorted(known)
        for name in self.data:
            if name not in allowed:
                raise self.error(str(name), f"unknown key; known keys: {', '.join(allowed)}")

    def child(self, name: str, default: Any = None) -> FieldReader:
        value = self.data.get(name, default if default is not None else {})
        return FieldReader(self.source, self.child_path(name), value)

    def str_(self, name: str, default: str | None = None) -> str:
        value = self.data.get(name, default)
        if not isinstance(value, str) or not value:
            raise self.error(name, "expected a non-empty string")
        return value

    def optional_str(self, name: str) -> str | None:
        return None if self.data.get(name) is None else self.str_(name)

    def int_(self, name: str, default: int) -> int:
        value = self.data.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.error(name, "expected a non-negative integer")
        return value

    def bool_(self, name: str, default: bool) -> bool:
        value = self.data.get(name, default)
        if not isinstance(value, bool):
            raise self.error(name, "expected true or false")
        return value

    def str_list(self, name: str) -> tuple[str, ...] | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.error(name, "expected a list of names")
        return tuple(value)

    def str_map(self, name: str) -> dict[str, str]:
        value = self.data.get(name) or {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise self.error(name, "expected a mapping of name: name")
        return dict(value)

    def choice(self, name: str, options: Iterable[str], default: str) -> str:
        allowed = list(options)
        value = self.data.get(name, default)
        if value not in allowed:
            raise self.error(name, f"{value!r} is not one of {', '.join(allowed)}")
        return str(value)
