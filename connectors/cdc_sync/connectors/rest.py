"""Kafka Connect REST API, the calls ops need (https://kafka.apache.org/documentation/#connect_rest)."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any


class ConnectError(RuntimeError):
    """Kafka Connect answered an error: `status` is the HTTP status, the message Connect's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kafka Connect answered {status}: {message}")
        self.status = status


class ConnectClient:
    def __init__(self, url: str, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError):  # not JSON: keep the text
                detail = json.loads(detail).get("message", detail)
            raise ConnectError(exc.code, detail) from exc
        return json.loads(raw) if raw else None

    @staticmethod
    def _name(name: str) -> str:
        return urllib.parse.quote(name, safe="")

    def plugins(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/connector-plugins"))

    def connectors(self) -> list[str]:
        return list(self._call("GET", "/connectors"))

    def validate(self, config: Mapping[str, str]) -> dict[str, Any]:
        plugin = self._name(config["connector.class"])
        return dict(self._call("PUT", f"/connector-plugins/{plugin}/config/validate", dict(config)))

    def config(self, name: str) -> dict[str, str] | None:
        try:
            return dict(self._call("GET", f"/connectors/{self._name(name)}/config"))
        except ConnectError as exc:
            if exc.status == 404:
                return None
            raise

    def put_config(self, name: str, config: Mapping[str, str]) -> dict[str, Any]:
        return dict(self._call("PUT", f"/connectors/{self._name(name)}/config", dict(config)))

    def status(self, name: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/connectors/{self._name(name)}/status"))

    def pause(self, name: str) -> None:
        self._call("PUT", f"/connectors/{self._name(name)}/pause")

    def resume(self, name: str) -> None:
        self._call("PUT", f"/connectors/{self._name(name)}/resume")

    def restart(self, name: str, include_tasks: bool = True, only_failed: bool = False) -> None:
        query = f"includeTasks={str(include_tasks).lower()}&onlyFailed={str(only_failed).lower()}"
        self._call("POST", f"/connectors/{self._name(name)}/restart?{query}")

    def delete(self, name: str) -> None:
        self._call("DELETE", f"/connectors/{self._name(name)}")

    def offsets(self, name: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/connectors/{self._name(name)}/offsets"))
