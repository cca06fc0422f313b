"""Java-compatible murmur2 partitioning, in pure Python.

Contract: `partition_for(key, n)` returns the partition that Kafka's Java producer
(`BuiltInPartitioner.partitionForKey`) and librdkafka's `murmur2_random` partitioner pick
for a non-null `key` on a topic of `n` partitions. The processor writes loopback and
changelog records to explicit partitions, so it must agree byte for byte with every other
producer of the `inputs` topic, in any language; otherwise one thread's inputs would be
split over two partitions and lose their total order.

`murmur2` reproduces `org.apache.kafka.common.utils.Utils.murmur2`: it returns the same
*signed* 32-bit value Java does, so it can be checked against Kafka's own test vectors.
"""

from __future__ import annotations

import functools
from typing import Final

# Constants of Kafka's murmur2 (Utils.murmur2): the seed, the mixing multiplier and shift.
_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_R: Final = 24
# Java ints wrap at 32 bits; Python ints do not, so every product is masked back.
_MASK32: Final = 0xFFFFFFFF
# Utils.toPositive: clears the sign bit (not abs(), which would map MIN_VALUE to itself).
_POSITIVE: Final = 0x7FFFFFFF


def murmur2(data: bytes) -> int:
    """Return Kafka's murmur2 hash of `data` as a signed 32-bit int, exactly as Java does."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        # Little-endian 4-byte chunk, like Java's explicit shifts over `data[i4 + n] & 0xff`.
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> _R  # Java's `>>>`: a logical shift, which is what >> does on a masked int.
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = length % 4
    # Java's switch falls through from case 3 to case 1; the `h *= m` belongs to case 1.
    if tail >= 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


# Every record of a thread hashes the same key again (a turn makes a dozen records), and
# murmur2 in Python costs microseconds; a bounded cache of the busy threads' keys keeps
# the memory constant (larger, it would grow with every idle agent up to its bound).
PARTITION_CACHE_SIZE: Final = 4096


@functools.lru_cache(maxsize=PARTITION_CACHE_SIZE)
def partition_for(key: bytes, num_partitions: int) -> int:
    """Return the partition Java's default partitioner picks for `key` among `num_partitions`.

    Raises ValueError if `num_partitions` is not positive: there is no partition to pick.
    Memoised per `(key, num_partitions)`: the answer is a pure function of both.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    return (murmur2(key) & _POSITIVE) % num_partitions
