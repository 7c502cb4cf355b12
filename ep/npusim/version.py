"""Versions the NPU execution provider stamps into what it produces.

``SDK_VERSION`` is the version of this SDK (the EP, its compiler and the firmware model): it goes
into every context binary and into the ``ep_sdk_version`` attribute of EPContext nodes. A binary
built by an SDK of another *major* version is refused, since the program encoding may differ.

``FORMAT_VERSION`` is the ``(major, minor)`` version of the context binary layout specified in
``docs/binary_format.md``: the major changes on any incompatible layout change, or when a binary
may hold something older readers must not ignore; the minor changes when something is added that
older readers may safely ignore. A writer stamps the lowest version that describes the file, so
binaries that use nothing new still open in older SDKs (:func:`format_version`).
"""

from __future__ import annotations

from collections.abc import Iterable

from npu_sim.epilogue import ATTRIBUTES

SDK_VERSION = "0.1.0"
FORMAT_VERSION: tuple[int, int] = (3, 0)
"""The newest layout this SDK writes: 3.0 adds fused epilogues (:data:`FORMAT_3_ATTRIBUTES`)."""
READABLE_MAJORS = (2, 3)
"""Majors this SDK reads: a 2.x file is a 3.0 file that uses no fused epilogue."""
FORMAT_3_ATTRIBUTES = ATTRIBUTES
"""Kernel attributes a 2.x reader would ignore (it accepts any attribute name), computing other
values; a binary whose launches carry one is 3.0, any other 2.2."""


def format_version(attribute_names: Iterable[str]) -> tuple[int, int]:
    """The version a binary whose launches carry ``attribute_names`` is stamped with."""
    return FORMAT_VERSION if FORMAT_3_ATTRIBUTES.intersection(attribute_names) else (2, 2)


def sdk_major(version: str) -> int:
    """The major component of a ``MAJOR.MINOR.PATCH`` version string.

    Raises ``ValueError`` when ``version`` does not start with a decimal major number.
    """
    head = version.split(".", 1)[0]
    if not head.isdecimal() or not head.isascii():
        raise ValueError(f"version {version!r} does not start with a MAJOR number")
    return int(head)
