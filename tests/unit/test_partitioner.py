"""Kafka's murmur2, as its own tests pin it (clients' `UtilsTest.testMurmur2`); the agreement
with librdkafka's partitioner on random keys is checked against a broker in
tests/integration/test_publisher.py."""

from __future__ import annotations

import pytest

from cdc_sync.connectors.partitioner import murmur2, partition_for

pytestmark = pytest.mark.unit

KAFKA_VECTORS = {  # Java's signed results
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


@pytest.mark.parametrize(("text", "signed"), KAFKA_VECTORS.items())
def test_murmur2_is_kafkas(text: str, signed: int) -> None:
    assert murmur2(text.encode()) == signed & 0xFFFFFFFF


def test_a_partition_is_the_positive_hash_modulo_the_count() -> None:
    assert partition_for(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert all(0 <= partition_for(bytes([n]), 3) < 3 for n in range(256))
