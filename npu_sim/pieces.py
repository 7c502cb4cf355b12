"""HBM contents that refer to immutable host memory instead of copying it.

Weights reach HBM by DMA from a mapped context binary or weight file. The simulated HBM holds
real bytes, but copying a gigabyte of weights into freshly faulted host pages costs ten times
reading the file, and doubles the host memory a loaded model needs. So an allocation whose
contents arrive from *immutable* host memory (a read-only file mapping, a ``bytes`` object)
keeps them as :class:`Pieces`: read-only views of that memory (*shared* pieces, no copy) and,
for bytes that came from anywhere else, private copies; never-written bytes read as zeros.

A DMA still moves every chunk with the same cycles, counters and trace records; only the host
byte copy disappears. Reading a shared piece reads the file's pages (the page cache), and the
view keeps the mapping alive: a file is unmapped only after the last allocation referring to
it is freed. Writing such an allocation other than by another DMA from immutable memory
(:meth:`npu_sim.hbm.Hbm.view`, :meth:`~npu_sim.hbm.Hbm.write`, a kernel's output) first gives
it real memory holding the same bytes (copy-on-write); views handed out before keep reading the
file. The firmware never writes a WEIGHTS block (the loader refuses such programs), so loaded
programs never see the difference.
"""

from __future__ import annotations

import dataclasses
import mmap
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

import numpy as np


def immutable(array: np.ndarray) -> bool:
    """Whether the bytes of ``array`` can never change while referenced: it is a read-only view
    of a ``bytes`` object or of a read-only (``ACCESS_READ``) memory map, through read-only
    arrays and memoryviews only (a memoryview of a read-only array of the model's bytes, as a
    session's weights are). Anything else (a writable array, a read-only view of one) may
    change later."""
    base: object = array
    while isinstance(base, (np.ndarray, memoryview)):
        if isinstance(base, memoryview):
            if not base.readonly:
                return False
            base = base.obj
        elif base.flags.writeable or base.base is None:
            return False
        else:
            base = base.base
    if isinstance(base, bytes):
        return True
    if isinstance(base, mmap.mmap):
        try:
            with memoryview(base) as whole:
                return whole.readonly
        except ValueError:  # closed
            return False
    return False


@dataclass(frozen=True)
class _Piece:
    """Bytes ``[start, start + n)`` of the allocation are ``root[at:at + n]``."""

    start: int
    n: int
    root: np.ndarray  # flat uint8: an immutable host buffer (shared) or a private copy
    at: int
    shared: bool

    @property
    def end(self) -> int:
        return self.start + self.n

    def bytes(self, lo: int, hi: int) -> np.ndarray:
        """Allocation bytes ``[lo, hi)`` (inside this piece) as a view of ``root``."""
        return self.root[self.at + lo - self.start:self.at + hi - self.start]


class Pieces:
    """One allocation's contents as address-ordered, non-overlapping pieces; zeros between."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._pieces: dict[int, _Piece] = {}

    def share(self, offset: int, root: np.ndarray, at: int, n: int) -> None:
        """Bytes ``[offset, offset + n)`` are now ``root[at:at + n]`` (immutable; not copied).
        A piece that continues the previous one in both the allocation and ``root`` (the next
        DMA chunk of one transfer) extends it, so a weight never straddles two chunks."""
        self._cut(offset, offset + n)
        i = bisect_left(self._starts, offset)
        prev = self._pieces[self._starts[i - 1]] if i else None
        if prev is not None and prev.root is root and prev.end == offset \
                and prev.at + prev.n == at:
            self._add(_Piece(prev.start, prev.n + n, root, prev.at, True))
        else:
            self._add(_Piece(offset, n, root, at, True))

    def copy(self, offset: int, data: np.ndarray) -> None:
        """Bytes ``[offset, offset + data.size)`` are now a private copy of ``data``."""
        self._cut(offset, offset + data.size)
        self._add(_Piece(offset, data.size, data.copy(), 0, False))

    @property
    def shared(self) -> int:
        """Bytes held as views of host memory (not copied)."""
        return sum(p.n for p in self._pieces.values() if p.shared)

    def inside(self, offset: int, n: int) -> np.ndarray | None:
        """A view of bytes ``[offset, offset + n)`` if one piece holds them all, else None."""
        i = bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        piece = self._pieces[self._starts[i]]
        return piece.bytes(offset, offset + n) if offset + n <= piece.end else None

    def read(self, offset: int, n: int) -> np.ndarray:
        """A copy of bytes ``[offset, offset + n)``."""
        out = np.zeros(n, np.uint8)
        for piece in self._overlapping(offset, offset + n):
            lo, hi = max(piece.start, offset), min(piece.end, offset + n)
            out[lo - offset:hi - offset] = piece.bytes(lo, hi)
        return out

    def materialize(self, size: int) -> np.ndarray:
        """The whole allocation as real memory (``size`` bytes, zeros between pieces)."""
        return self.read(0, size)

    def _overlapping(self, lo: int, hi: int) -> list[_Piece]:
        i = max(bisect_right(self._starts, lo) - 1, 0)
        j = bisect_left(self._starts, hi)
        return [p for p in (self._pieces[s] for s in self._starts[i:j]) if p.end > lo]

    def _cut(self, lo: int, hi: int) -> None:
        """Forget bytes ``[lo, hi)``, keeping what pieces hold on either side."""
        for piece in self._overlapping(lo, hi):
            self._starts.remove(piece.start)
            del self._pieces[piece.start]
            if piece.start < lo:
                self._add(dataclasses.replace(piece, n=lo - piece.start))
            if piece.end > hi:
                self._add(dataclasses.replace(piece, start=hi, n=piece.end - hi,
                                              at=piece.at + hi - piece.start))

    def _add(self, piece: _Piece) -> None:
        if piece.start not in self._pieces:
            insort(self._starts, piece.start)
        self._pieces[piece.start] = piece
