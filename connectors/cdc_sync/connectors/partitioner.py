"""The Java producer's partitioner (Kafka's `Utils.murmur2`), for a publisher that must know
each record's partition before producing it.

librdkafka's `murmur2_random` computes the same partition; this module exists because the
publisher on the Tansu stand-in chooses its records' partitions itself (see `publisher.py`),
and those must be where Kafka Connect would have put them.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data`, as an unsigned 32-bit integer (Java returns it signed)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition the Java producer (and librdkafka's `murmur2_random`) gives `key`. A
    topic of one partition needs no hash (in Python it cost the capture ~13 us a record)."""
    if partitions == 1:
        return 0
    return (murmur2(key) & 0x7FFFFFFF) % partitions
