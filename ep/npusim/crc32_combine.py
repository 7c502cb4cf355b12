"""CRC-32 (zlib's) of a concatenation from the CRC-32s of its parts, as zlib's ``crc32_combine``.

A context binary stores the CRC-32 of every block of its weights (the block size is the file's:
a power of two from 4 KiB to 1 GiB, 4 MiB as this SDK writes). A reader that checks a run of
blocks with one CRC-32 call over the whole run (one call releases the GIL once, where a call per
block needs it back between blocks) compares the result with the blocks' stored CRC-32s
combined: ``crc(A + B) = crc(A) * x^(8 len(B)) mod P  xor  crc(B)``, in the reflected bit
order zlib uses (the initial and final inversions cancel out). The arithmetic is zlib's
``multmodp`` / ``x2nmodp`` (``crc32.c``, 1.2.12 and later).
"""

from __future__ import annotations

import functools

_POLY = 0xEDB88320  # the CRC-32 polynomial, reflected


def _multmodp(a: int, b: int) -> int:
    """``a * b mod P`` for polynomials in reflected order (``a`` nonzero)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


@functools.cache
def _x2n(k: int) -> int:
    """``x^(2^k) mod P``."""
    return 1 << 30 if k == 0 else _multmodp(_x2n(k - 1), _x2n(k - 1))


@functools.lru_cache(maxsize=64)  # a file's blocks have one length, but for its last
def _shift(nbytes: int) -> int:
    """``x^(8 nbytes) mod P``: what appending ``nbytes`` bytes multiplies a CRC-32 by."""
    p, n, k = 1 << 31, nbytes, 3
    while n:
        if n & 1:
            p = _multmodp(_x2n(k & 31), p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1 = crc32(A)``, ``crc2 = crc32(B)`` and ``len(B)``."""
    return _multmodp(_shift(len2), crc1) ^ crc2
