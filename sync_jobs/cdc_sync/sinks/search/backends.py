"""One small interface over the two search clients (opensearch-py, elasticsearch 9.x).

Both return plain dicts; error classification reads structured fields only (exception class and
HTTP status), never messages. The clients' own retries are off: `core.retry.retried` owns
retrying, so backoff and the outage horizon are in one place; each request is bounded by an
explicit timeout.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import elastic_transport
import elasticsearch
import opensearchpy
from elastic_transport import Transport

from cdc_sync.core.retry import DEFAULT_ATTEMPT_TIMEOUT_SECONDS

# How long the server keeps a read-back scroll between two pages.
SCROLL_KEEP_ALIVE = "2m"

ClientKind = Literal["opensearch", "elasticsearch"]
CLIENT_KINDS: tuple[ClientKind, ...] = ("opensearch", "elasticsearch")


class SearchBackend(Protocol):
    def alias_exists(self, alias: str) -> bool: ...
    def index_exists(self, index: str) -> bool: ...
    def create_index(
        self,
        index: str,
        mappings: Mapping[str, Any],
        settings: Mapping[str, Any],
        alias: str | None,
    ) -> None: ...
    def put_alias(self, index: str, alias: str) -> None: ...
    def move_alias(self, alias: str, index: str, old: Sequence[str]) -> None:
        """Point `alias` at `index` instead of `old`, atomically (one aliases request)."""

    def delete_index(self, index: str) -> None: ...
    def mappings(self, alias: str) -> dict[str, dict[str, Any]]:
        """Concrete index name -> its `mappings` object, for every index behind `alias`."""

    def put_mapping(self, index: str, properties: Mapping[str, Any]) -> None: ...
    def put_settings(self, index: str, settings: Mapping[str, Any]) -> None: ...
    def settings(self, alias: str) -> dict[str, dict[str, Any]]:
        """Concrete index name -> its `settings` object, for every index behind `alias`."""

    def mget(self, alias: str, ids: Sequence[str]) -> list[dict[str, Any]]: ...
    def bulk(self, operations: Sequence[Mapping[str, Any]]) -> dict[str, Any]: ...
    def refresh(self, alias: str) -> None: ...
    def scan(
        self, alias: str, size: int, source: bool | Sequence[str] = True
    ) -> Iterator[list[dict[str, Any]]]:
        """Every document behind `alias`, `size` hits at a time, with `_version` (and `_source`
        unless `source` is False; only the fields named, when it names some): a scroll, since
        from/size paging stops at `index.max_result_window` (10,000 by default)."""

    def close(self) -> None: ...


def scroll_pages(
    first: Callable[[], Mapping[str, Any]],
    following: Callable[[str], Mapping[str, Any]],
    clear: Callable[[str], object],
) -> Iterator[list[dict[str, Any]]]:
    """The hits of a scrolled search, page by page; the scroll is cleared however it ends."""
    answer = first()
    scroll_id = answer.get("_scroll_id")
    try:
        while hits := list(answer["hits"]["hits"]):
            yield hits
            answer = following(str(scroll_id))
            scroll_id = answer.get("_scroll_id", scroll_id)
    finally:
        if scroll_id:
            clear(str(scroll_id))


def _source_filter(source: bool | Sequence[str]) -> bool | dict[str, list[str]]:
    """`_source` of a search: all of it, none, or only the fields named."""
    return source if isinstance(source, bool) else {"includes": list(source)}


def is_transient(exc: BaseException) -> bool:
    """Connection trouble, timeouts, 429 and 5xx may pass; other errors (TLS included) will not."""
    if isinstance(exc, opensearchpy.SSLError | elastic_transport.TlsError):
        return False
    if isinstance(
        exc,
        opensearchpy.ConnectionError  # covers ConnectionTimeout
        | elastic_transport.ConnectionError
        | elastic_transport.ConnectionTimeout,
    ):
        return True
    if isinstance(exc, opensearchpy.TransportError):
        return is_transient_status(exc.status_code)
    if isinstance(exc, elasticsearch.ApiError):
        return is_transient_status(exc.meta.status)
    return False


def is_transient_status(status: object) -> bool:
    return isinstance(status, int) and (status == 429 or status >= 500)


def server_distribution(url: str) -> str:
    """`opensearch` for OpenSearch-API servers, else `elasticsearch` (from `GET /`)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            version = json.loads(response.read()).get("version", {})
    except (OSError, ValueError):
        return "elasticsearch"  # unreachable now: the client reports it on first use
    return "opensearch" if version.get("distribution") == "opensearch" else "elasticsearch"


def open_backend(
    kind: str,
    url: str,
    compat_headers: bool | None = None,
    timeout_seconds: float = DEFAULT_ATTEMPT_TIMEOUT_SECONDS,
) -> SearchBackend:
    """`compat_headers` (elasticsearch client only): Elasticsearch's `compatible-with=N` media
    types, which OpenSearch-API servers (the local stack's osmem-server) reject with HTTP 406.
    None = ask the server: on for Elasticsearch, off for an OpenSearch API.
    `timeout_seconds`: per request, so a server that answers nothing fails the attempt."""
    if compat_headers is None:
        compat_headers = kind == "elasticsearch" and server_distribution(url) != "opensearch"
    return connect(kind, url, compat_headers, timeout_seconds)


def connect(
    kind: str,
    url: str,
    compat_headers: bool = True,
    timeout_seconds: float = DEFAULT_ATTEMPT_TIMEOUT_SECONDS,
) -> SearchBackend:
    if kind == "opensearch":
        return OpenSearchBackend(url, timeout_seconds)
    if kind == "elasticsearch":
        return ElasticsearchBackend(url, compat_headers, timeout_seconds)
    raise ValueError(f"search client_kind must be one of {', '.join(CLIENT_KINDS)}, got {kind!r}")


# One backend serves the driver's parallel table commits and the watermark writer at once:
# opensearch-py's pool otherwise keeps one connection, and every concurrent request opened and
# then discarded one of its own ("Connection pool is full"), each batch. Elasticsearch's
# client keeps 10 per node by default.
CONNECTIONS_PER_NODE = 10


class OpenSearchBackend:
    def __init__(self, url: str, timeout_seconds: float = DEFAULT_ATTEMPT_TIMEOUT_SECONDS) -> None:
        # Explicit per-request timeout (the client's default is 10 s): a timeout is transient.
        self.client = opensearchpy.OpenSearch(
            hosts=[url],
            timeout=timeout_seconds,
            max_retries=0,
            retry_on_timeout=False,
            pool_maxsize=CONNECTIONS_PER_NODE,
        )

    def alias_exists(self, alias: str) -> bool:
        return bool(self.client.indices.exists_alias(name=alias))

    def index_exists(self, index: str) -> bool:
        return bool(self.client.indices.exists(index=index))

    def create_index(
        self,
        index: str,
        mappings: Mapping[str, Any],
        settings: Mapping[str, Any],
        alias: str | None,
    ) -> None:
        aliases: dict[str, Any] = {alias: {}} if alias else {}
        body = {"mappings": dict(mappings), "settings": dict(settings), "aliases": aliases}
        self.client.indices.create(index=index, body=body)

    def put_alias(self, index: str, alias: str) -> None:
        self.client.indices.put_alias(index=index, name=alias)

    def move_alias(self, alias: str, index: str, old: Sequence[str]) -> None:
        actions = [{"remove": {"index": name, "alias": alias}} for name in old]
        actions.append({"add": {"index": index, "alias": alias}})
        self.client.indices.update_aliases(body={"actions": actions})

    def delete_index(self, index: str) -> None:
        self.client.indices.delete(index=index)

    def mappings(self, alias: str) -> dict[str, dict[str, Any]]:
        answer = self.client.indices.get_mapping(index=alias)
        return {name: dict(body.get("mappings", {})) for name, body in answer.items()}

    def put_mapping(self, index: str, properties: Mapping[str, Any]) -> None:
        self.client.indices.put_mapping(index=index, body={"properties": dict(properties)})

    def put_settings(self, index: str, settings: Mapping[str, Any]) -> None:
        self.client.indices.put_settings(index=index, body=dict(settings))

    def settings(self, alias: str) -> dict[str, dict[str, Any]]:
        answer = self.client.indices.get_settings(index=alias)
        return {name: dict(body.get("settings", {})) for name, body in answer.items()}

    def mget(self, alias: str, ids: Sequence[str]) -> list[dict[str, Any]]:
        answer = self.client.mget(index=alias, body={"ids": list(ids)})
        return list(answer["docs"])

    def bulk(self, operations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return dict(self.client.bulk(body=list(operations)))

    def refresh(self, alias: str) -> None:
        self.client.indices.refresh(index=alias)

    def scan(
        self, alias: str, size: int, source: bool | Sequence[str] = True
    ) -> Iterator[list[dict[str, Any]]]:
        body = {
            "query": {"match_all": {}},
            "size": size,
            "sort": ["_doc"],
            "_source": _source_filter(source),
        }
        return scroll_pages(
            lambda: self.client.search(
                index=alias, body=body, version=True, scroll=SCROLL_KEEP_ALIVE
            ),
            lambda scroll_id: self.client.scroll(scroll_id=scroll_id, scroll=SCROLL_KEEP_ALIVE),
            lambda scroll_id: self.client.clear_scroll(scroll_id=scroll_id),
        )

    def close(self) -> None:
        self.client.close()


# elasticsearch-py 8+/9 rewrites Accept/Content-Type to `application/vnd.elasticsearch+json;
# compatible-with=9` on every request. Elasticsearch understands that; OpenSearch-API servers
# (the local stack's osmem-server, OpenSearch itself) answer HTTP 406. With compat_headers=False
# the transport turns them back into plain `application/json` / `application/x-ndjson`.
_COMPAT_MIMETYPE = re.compile(r"application/vnd\.elasticsearch\+([\w-]+); ?compatible-with=\d+")


class PlainJsonTransport(Transport):
    def perform_request(self, method: str, target: str, **kwargs: Any) -> Any:
        headers = kwargs.get("headers")
        if isinstance(headers, Mapping):
            kwargs["headers"] = {
                name: _COMPAT_MIMETYPE.sub(r"application/\1", value)
                if name.lower() in ("accept", "content-type")
                else value
                for name, value in headers.items()
            }
        return super().perform_request(method, target, **kwargs)


class ElasticsearchBackend:
    def __init__(
        self,
        url: str,
        compat_headers: bool = True,
        timeout_seconds: float = DEFAULT_ATTEMPT_TIMEOUT_SECONDS,
    ) -> None:
        self.client = elasticsearch.Elasticsearch(
            url,
            request_timeout=timeout_seconds,
            max_retries=0,
            retry_on_timeout=False,
            transport_class=Transport if compat_headers else PlainJsonTransport,
        )

    def alias_exists(self, alias: str) -> bool:
        return bool(self.client.indices.exists_alias(name=alias))

    def index_exists(self, index: str) -> bool:
        return bool(self.client.indices.exists(index=index))

    def create_index(
        self,
        index: str,
        mappings: Mapping[str, Any],
        settings: Mapping[str, Any],
        alias: str | None,
    ) -> None:
        self.client.indices.create(
            index=index,
            mappings=dict(mappings),
            settings=dict(settings),
            aliases={alias: {}} if alias else {},
        )

    def put_alias(self, index: str, alias: str) -> None:
        self.client.indices.put_alias(index=index, name=alias)

    def move_alias(self, alias: str, index: str, old: Sequence[str]) -> None:
        actions: list[Mapping[str, Any]] = [
            {"remove": {"index": name, "alias": alias}} for name in old
        ]
        actions.append({"add": {"index": index, "alias": alias}})
        self.client.indices.update_aliases(actions=actions)

    def delete_index(self, index: str) -> None:
        self.client.indices.delete(index=index)

    def mappings(self, alias: str) -> dict[str, dict[str, Any]]:
        answer = self.client.indices.get_mapping(index=alias).body
        return {name: dict(body.get("mappings", {})) for name, body in answer.items()}

    def put_mapping(self, index: str, properties: Mapping[str, Any]) -> None:
        self.client.indices.put_mapping(index=index, properties=dict(properties))

    def put_settings(self, index: str, settings: Mapping[str, Any]) -> None:
        self.client.indices.put_settings(index=index, settings=dict(settings))

    def settings(self, alias: str) -> dict[str, dict[str, Any]]:
        answer = self.client.indices.get_settings(index=alias).body
        return {name: dict(body.get("settings", {})) for name, body in answer.items()}

    def mget(self, alias: str, ids: Sequence[str]) -> list[dict[str, Any]]:
        return list(self.client.mget(index=alias, ids=list(ids)).body["docs"])

    def bulk(self, operations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return dict(self.client.bulk(operations=list(operations)).body)

    def refresh(self, alias: str) -> None:
        self.client.indices.refresh(index=alias)

    def scan(
        self, alias: str, size: int, source: bool | Sequence[str] = True
    ) -> Iterator[list[dict[str, Any]]]:
        return scroll_pages(
            lambda: (
                self.client.search(
                    index=alias,
                    query={"match_all": {}},
                    size=size,
                    sort=["_doc"],
                    source=_source_filter(source),
                    version=True,
                    scroll=SCROLL_KEEP_ALIVE,
                ).body
            ),
            lambda scroll_id: (
                self.client.scroll(scroll_id=scroll_id, scroll=SCROLL_KEEP_ALIVE).body
            ),
            lambda scroll_id: self.client.clear_scroll(scroll_id=scroll_id),
        )

    def close(self) -> None:
        self.client.close()
