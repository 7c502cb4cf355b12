"""npu_sim: a cycle-approximate neural processing unit.

The device is a handful of small objects, each with one job:

- :class:`DeviceConfig` (``config``): the base parameters of the part; presets ``npu-s``,
  ``npu-m``, ``npu-l`` and ``os32``.
- ``hbm``: finite device memory with an allocator (alignment, strategies, fragmentation,
  out-of-memory), whose contents are real bytes backed lazily per allocation.
- ``dma``: DMA channels that move data over a shared host link in ``dma_chunk_bytes`` chunks.
- ``compute``: cores with a systolic array and a vector unit; values come from the numba kernels
  in :mod:`npu_sim.kernels`, cycles from the cost model in :mod:`npu_sim.cost`.
- ``trace``: a record of every DMA chunk, kernel and command with its engine, scope, cycles and
  tagged dependencies; :mod:`npu_sim.trace` also saves, exports, replays and analyses traces.

All of it runs on one simpy clock; nothing depends on wall-clock time. :class:`Device` is the
driver-level API that ties them together.
"""

from .config import DeviceConfig
from .device import HOST_IOVA_BASE, Device
from .dtypes import TensorSpec
from .hbm import DeviceBuffer, Hbm
from .trace import TraceRecord, TraceRecorder

__all__ = [
    "HOST_IOVA_BASE",
    "Device",
    "DeviceBuffer",
    "DeviceConfig",
    "Hbm",
    "TensorSpec",
    "TraceRecord",
    "TraceRecorder",
]
