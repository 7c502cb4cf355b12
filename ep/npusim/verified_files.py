"""Context binary files whose weights were checked whole, known by their file's identity.

Checking a binary's weight blocks (:mod:`~ep.npusim.weight_checks`) reads every byte of its
weights: BERT-base's 420 MiB made an EPContext load 30 ms where everything else took 4 ms
(medians of 12 alternating loads in one process). A process that loads the same unchanged file
again (sessions of one compiled model, instances sharing it, a CI job's many properties) need not
read it again, as Python trusts a ``.pyc`` and git its index: by the file's status.

:data:`VERIFIED` keeps, for each file whose weight blocks all matched, its :class:`FileIdentity`
(device, inode, size, modification and status-change times, from ``fstat`` of the descriptor
that was mapped) and the clock when that status was read. A later load skips the check when its
own file has the same identity *and* that identity is settled: both times lie more than
:func:`margin` before the clock of the check. Any write, truncation, ``utime``, ``chmod`` or
rename onto the path gives the file another status-change time (or another inode), which no
system call sets back (only moving the system clock back could repeat one); the margin covers
the file system's timestamp granularity, within which a write just after the status was read
could keep the same times (git's "racy" entries). A file checked while its times were that
recent is checked again on every load until they are not.

What this trusts that a check on every load did not: that bytes do not change under an
unchanged status. Writes through another process's shared writable mapping of the file update
its times only when a clean page is first dirtied, and storage corrupted below the page cache
keeps its status; a load checking every time catches either only if it happens before the load
(the mapping is the file's, so a change after a load reaches the session either way). Binaries
given as bytes (embed mode) have no identity and are checked on every load.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from ep.framework.lru import MISSING, BoundedLru

FINE_MARGIN_NS = 100_000_000
"""The margin on a file system with sub-second timestamps: 100 ms, ten times the longest clock
tick Linux stamps file times with (10 ms at ``HZ=100``)."""

STATUS_CHANGE_TIMES = os.name == "posix"
"""Whether ``st_ctime_ns`` is the time of the file's last status change, which every write
updates and no system call sets back. On Windows it is the creation time, and a file's times
can be set back with ``os.utime``: nothing is trusted there, every load checks."""

COARSE_MARGIN_NS = 2_000_000_000
"""The margin when a file's times are whole seconds (ext3, ext4 with small inodes, FAT's
two-second steps): two seconds."""


class FileIdentity(NamedTuple):
    """What a file's status says of its contents: same device, inode, size and times, same
    bytes (but see the module docstring)."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, status: os.stat_result) -> FileIdentity:
        return cls(status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns,
                   status.st_ctime_ns)

    def settled(self, clock_ns: int) -> bool:
        """Whether both times lie more than :func:`margin` before ``clock_ns`` (a write after
        that clock would have changed them)."""
        return max(self.mtime_ns, self.ctime_ns) < clock_ns - margin(self)


def margin(identity: FileIdentity) -> int:
    """:data:`COARSE_MARGIN_NS` when both of the file's times are whole seconds, else
    :data:`FINE_MARGIN_NS`."""
    whole = not identity.mtime_ns % 1_000_000_000 and not identity.ctime_ns % 1_000_000_000
    return COARSE_MARGIN_NS if whole else FINE_MARGIN_NS


class VerifiedFiles(BoundedLru[FileIdentity, int]):
    """The identities of files whose weights matched their checksums, each with the clock
    (``time.time_ns()``) read just before its status was; at most ``entries`` of them, the least
    recently used dropped first (:class:`~ep.framework.lru.BoundedLru`: thread-safe, emptied
    in a forked child). ``skipped`` counts the loads :meth:`trusted` spared a check since the
    last :meth:`clear`."""

    def __init__(self, entries: int = 1024) -> None:
        super().__init__(entries, 4 * entries, lambda _, __: 1)

    def trusted(self, identity: FileIdentity) -> bool:
        """Whether a file of ``identity`` was checked whole while its times were settled; never
        without :data:`STATUS_CHANGE_TIMES`."""
        clock = self.lookup(identity)
        found = clock is not MISSING and STATUS_CHANGE_TIMES and identity.settled(clock)
        with self._lock:
            self.skipped += found
        return found

    def record(self, identity: FileIdentity, clock_ns: int) -> None:
        """A file of ``identity``, its status read after ``clock_ns``, had every weight block
        match. The latest clock is kept: an entry checked again later may be settled then."""
        self.put(identity, clock_ns, merge=max)

    def _clear(self) -> None:
        super()._clear()
        self.skipped = 0


VERIFIED = VerifiedFiles()
"""The process's record, used by :meth:`~ep.npusim.binary_reader.ContextBinary.open`."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=VERIFIED.reset_after_fork)
