"""CRC-32 (zlib's) of a concatenation from the CRC-32s of its parts, as zlib's ``crc32_combine``.

A context binary stores the CRC-32 of every block of its weights (the block size is the file's:
a power of two from 4 KiB to 1 GiB, 4 MiB as this SDK writes). A reader that checks a run of
blocks with one CRC-32 call over the whole run (one call releases the GIL once, where a call per
block needs it back between blocks) compares the result with the blocks' stored CRC-32s
combined: ``crc(A + B) = crc(A) * x^(8 len(B)) mod P  xor  crc(B)``, in the reflected bit
order zlib uses (the initial and final inversions cancel out). The arithmetic is zlib's
``multmodp`` / ``x2nmodp`` (``crc32.c``, 1.2.12 and later), ``multmodp`` taken four bits at a
time.
"""

from __future__ import annotations

import functools

_POLY = 0xEDB88320  # the CRC-32 polynomial, reflected


def _by_x(b: int) -> int:
    """``b * x mod P``: one step of the CRC register (reflected: x^0 is the top bit)."""
    return (b >> 1) ^ _POLY if b & 1 else b >> 1


def _by_x4(m: int) -> int:
    """``m * x^4 mod P``."""
    return _by_x(_by_x(_by_x(_by_x(m))))


_X4 = tuple(_by_x4(m) for m in range(16))
"""``p * x^4 mod P`` is ``(p >> 4) ^ _X4[p & 15]``: the four low bits (x^28..x^31) are the
ones that wrap around."""


def _multmodp(a: int, b: int) -> int:
    """``a * b mod P`` for polynomials in reflected order: Horner's rule over the eight nibbles
    of ``a`` from x^28..x^31 down to x^0..x^3, with ``t[v]`` the product of ``b`` and nibble
    ``v``'s polynomial (bit 3 is its x^0). A third of the time of zlib's bit-by-bit loop
    (2.0 vs 4.7 us): a model's first load computes one ``_shift`` per new last-block length."""
    b1 = _by_x(b)
    b2 = _by_x(b1)
    b3 = _by_x(b2)
    b23, b01 = b2 ^ b3, b ^ b1
    t = (0, b3, b2, b23, b1, b1 ^ b3, b1 ^ b2, b1 ^ b23,
         b, b ^ b3, b ^ b2, b ^ b23, b01, b01 ^ b3, b01 ^ b2, b01 ^ b23)
    x4 = _X4
    p = t[a & 15]
    for shift in (4, 8, 12, 16, 20, 24, 28):
        p = (p >> 4) ^ x4[p & 15] ^ t[a >> shift & 15]
    return p


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
