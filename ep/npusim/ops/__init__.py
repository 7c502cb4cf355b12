"""The NPU's operator catalogue: one entry per op, in the module of its family.

Importing this package registers every entry (see :mod:`.catalogue` for what an entry holds).
The family modules mirror :mod:`npu_sim.kernels`' (``conv``, ``gemm``, ``pool``...), so an op's
rules sit next door to its kernel's name. Everything else reads the catalogue:

- :data:`ep.npusim.capability.SUPPORT_TABLE` (what the EP offers to take),
- the compiler's views (:mod:`~ep.npusim.compiler.lower`), fusion lists
  (:mod:`~ep.npusim.compiler.rewrite`), opset-dependent kernels (:mod:`~ep.npusim.compiler.ir`)
  and tiling classes (:mod:`~ep.npusim.compiler.tiling`),
- ``tests/ep/test_catalogue.py``, which checks the catalogue against the device's kernels and
  cost model.
"""

from . import (  # noqa: F401 - importing a family module registers its entries
    activations,
    conv,
    elementwise,
    gemm,
    logic,
    norm,
    pool,
    quant,
    reduce,
    resize,
    shape,
)
from .catalogue import (
    CatalogueError,
    Fusion,
    Lowering,
    Op,
    OpEntry,
    OpSupport,
    Tiling,
    entries,
    entry,
    ops_where,
    price,
    register,
    remove,
)

__all__ = ["CatalogueError", "Fusion", "Lowering", "Op", "OpEntry", "OpSupport", "Tiling",
           "entries", "entry", "ops_where", "price", "register", "remove"]
