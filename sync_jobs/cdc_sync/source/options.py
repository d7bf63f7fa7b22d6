"""Options of the Kafka stream, shared by the built-in and the Python data source.

Option names are those of Spark's built-in kafka source so one options map drives both.
Spark hands a Python data source its option keys lower-cased; lookups here are
case-insensitive so the same parser serves a caller's camel-cased map too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cdc_sync.source.offsets import PartitionOffsets, from_offset_json

SOURCE_NAME = "cdc_kafka"
FLAVORS = ("kafka", "tansu", "noida")

BOOTSTRAP = "kafka.bootstrap.servers"
FLAVOR = "cdc.kafka.flavor"
SUBSCRIBE = "subscribe"
SUBSCRIBE_PATTERN = "subscribePattern"
STARTING_OFFSETS = "startingOffsets"
MAX_OFFSETS_PER_TRIGGER = "maxOffsetsPerTrigger"
# Same name and default (true) as Spark's built-in kafka source.
FAIL_ON_DATA_LOSS = "failOnDataLoss"
FETCH_TIMEOUT = "cdc.kafka.fetchTimeoutMs"
# How old (ms) another planner's high watermarks may be to plan with them (source.shared_highs).
SHARED_HIGHS = "cdc.kafka.sharedHighWatermarksMs"
# By flavor: only the stand-in whose ListOffsets scans the partition's log pays for asking.
SHARED_HIGHS_DEFAULT_MS = {"kafka": 0, "tansu": 250, "noida": 0}
# How a batch capped by maxOffsetsPerTrigger shares the cap among partitions: "proportional"
# to their backlogs (Spark's rule), or "time": the log's oldest records first (offsets.py).
BACKLOG_ORDER = "cdc.kafka.backlogOrder"
BACKLOG_ORDERS = ("proportional", "time")
# "host:port" of the job's task relay (core.relay): the source's own log records, written in
# Spark's worker processes, go there to the job's console and log file.
LOG_RELAY = "cdc.kafka.logRelay"
KNOWN_OPTIONS = (
    BOOTSTRAP,
    FLAVOR,
    SUBSCRIBE,
    SUBSCRIBE_PATTERN,
    STARTING_OFFSETS,
    MAX_OFFSETS_PER_TRIGGER,
    FAIL_ON_DATA_LOSS,
    FETCH_TIMEOUT,
    SHARED_HIGHS,
    BACKLOG_ORDER,
    LOG_RELAY,
)

KAFKA_PREFIX = "kafka."

# Spark's kafka source spells "earliest"/"latest" inside a JSON offset as -2/-1.
EARLIEST = -2
LATEST = -1


@dataclass(frozen=True)
class KafkaSourceOptions:
    bootstrap: str
    flavor: str
    topics: tuple[str, ...] | None
    pattern: str | None
    # "earliest", "latest", or explicit next offsets (values may be EARLIEST/LATEST).
    starting: str | PartitionOffsets
    max_offsets_per_trigger: int | None
    fetch_timeout_ms: int
    # A checkpoint offset outside the broker's [low, high] watermarks: fail (true) or warn and
    # continue from the low watermark (false). See cdc_sync.source.data_loss.
    fail_on_data_loss: bool = True
    shared_highs_ms: int = 0  # SHARED_HIGHS; 0: every planner asks the broker itself
    backlog_order: str = "proportional"  # BACKLOG_ORDER
    log_relay: tuple[str, int] | None = None  # LOG_RELAY
    # Other ``kafka.<setting>`` options, passed to the consumer as ``<setting>`` (like Spark).
    consumer_overrides: tuple[tuple[str, str], ...] = ()

    def matches(self, topic: str) -> bool:
        """Whether a topic is part of this stream (internal ``__`` topics never are)."""
        if self.topics is not None:
            return topic in self.topics
        if topic.startswith("__"):
            return False
        assert self.pattern is not None
        return re.fullmatch(self.pattern, topic) is not None


def parse_options(raw: Mapping[str, str]) -> KafkaSourceOptions:
    options = {key.lower(): value for key, value in raw.items()}
    known = {name.lower() for name in KNOWN_OPTIONS}
    unknown = sorted(
        key for key in options if key not in known and not key.startswith(KAFKA_PREFIX)
    )
    if unknown:
        raise ValueError(
            f"{SOURCE_NAME}: unknown option(s) {unknown}; known options: {list(KNOWN_OPTIONS)}"
        )

    def get(name: str) -> str | None:
        value = options.get(name.lower())
        return value.strip() if value is not None and value.strip() else None

    bootstrap = get(BOOTSTRAP)
    if bootstrap is None:
        raise ValueError(f"{SOURCE_NAME}: option {BOOTSTRAP!r} is required")
    flavor = get(FLAVOR) or "kafka"
    if flavor not in FLAVORS:
        raise ValueError(
            f"{SOURCE_NAME}: option {FLAVOR!r} must be one of {FLAVORS}, got {flavor!r}"
        )

    subscribe, pattern = get(SUBSCRIBE), get(SUBSCRIBE_PATTERN)
    if (subscribe is None) == (pattern is None):
        raise ValueError(
            f"{SOURCE_NAME}: set exactly one of {SUBSCRIBE!r} or {SUBSCRIBE_PATTERN!r}"
        )
    topics = None
    if subscribe is not None:
        topics = tuple(t.strip() for t in subscribe.split(",") if t.strip())
        if not topics:
            raise ValueError(f"{SOURCE_NAME}: option {SUBSCRIBE!r} names no topic")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(
                f"{SOURCE_NAME}: option {SUBSCRIBE_PATTERN!r} is not a valid regex: {error}"
            ) from error

    return KafkaSourceOptions(
        bootstrap=bootstrap,
        flavor=flavor,
        topics=topics,
        pattern=pattern,
        starting=_parse_starting(get(STARTING_OFFSETS)),
        max_offsets_per_trigger=_parse_positive(
            get(MAX_OFFSETS_PER_TRIGGER), MAX_OFFSETS_PER_TRIGGER
        ),
        fetch_timeout_ms=_parse_positive(get(FETCH_TIMEOUT), FETCH_TIMEOUT) or 60_000,
        fail_on_data_loss=_parse_bool(get(FAIL_ON_DATA_LOSS), FAIL_ON_DATA_LOSS, default=True),
        shared_highs_ms=_parse_non_negative(get(SHARED_HIGHS), SHARED_HIGHS)
        if SHARED_HIGHS.lower() in options
        else SHARED_HIGHS_DEFAULT_MS[flavor],
        backlog_order=_parse_choice(get(BACKLOG_ORDER), BACKLOG_ORDER, BACKLOG_ORDERS),
        log_relay=_parse_address(get(LOG_RELAY), LOG_RELAY),
        consumer_overrides=tuple(
            sorted(
                (key.removeprefix(KAFKA_PREFIX), value)
                for key, value in options.items()
                if key.startswith(KAFKA_PREFIX) and key not in known
            )
        ),
    )


def _parse_starting(value: str | None) -> str | PartitionOffsets:
    if value is None or value.lower() == "earliest":
        return "earliest"
    if value.lower() == "latest":
        return "latest"
    try:
        return from_offset_json(json.loads(value))
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(
            f"{SOURCE_NAME}: option {STARTING_OFFSETS!r} must be 'earliest', 'latest' or JSON "
            f'like {{"topic": {{"0": 42}}}} (-2 earliest, -1 latest), got {value!r}'
        ) from error


def _parse_positive(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError as error:
        raise ValueError(
            f"{SOURCE_NAME}: option {name!r} must be an integer, got {value!r}"
        ) from error
    if number <= 0:
        raise ValueError(f"{SOURCE_NAME}: option {name!r} must be positive, got {number}")
    return number


def _parse_non_negative(value: str | None, name: str) -> int:
    if value == "0":
        return 0
    number = _parse_positive(value, name)
    if number is None:
        raise ValueError(f"{SOURCE_NAME}: option {name!r} must be an integer >= 0, got nothing")
    return number


def _parse_choice(value: str | None, name: str, choices: tuple[str, ...]) -> str:
    if value is None:
        return choices[0]
    if value.lower() in choices:
        return value.lower()
    raise ValueError(f"{SOURCE_NAME}: option {name!r} must be one of {choices}, got {value!r}")


def _parse_address(value: str | None, name: str) -> tuple[str, int] | None:
    if value is None:
        return None
    host, _, port = value.rpartition(":")
    if host and port.isdigit() and 0 < int(port) < 65536:
        return host, int(port)
    raise ValueError(f"{SOURCE_NAME}: option {name!r} must be 'host:port', got {value!r}")


def _parse_bool(value: str | None, name: str, *, default: bool) -> bool:
    if value is None:
        return default
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{SOURCE_NAME}: option {name!r} must be 'true' or 'false', got {value!r}")
