"""Differential fuzzing: random valid ONNX models, run on ep and on onnxruntime, compared.

- :mod:`~ep.testing.fuzz.generate`: :func:`generate` ``(seed, index)``, a model from a
  catalogue of 109 proposers over 108 operator types, typed by ONNX's shape inference
  (:mod:`~ep.testing.fuzz.build`, :mod:`~ep.testing.fuzz.ops_math`,
  :mod:`~ep.testing.fuzz.ops_tensor`). It shares no code with the NPU's compiler or with
  :mod:`ep.testing.strategies`.
- :mod:`~ep.testing.fuzz.run`: :func:`run_case` classifies one model's outcome and localizes
  a difference to the node where ep departs from onnxruntime.
- :mod:`~ep.testing.fuzz.minimize`: delta debugging over nodes, down to a small reproducer.
- :mod:`~ep.testing.fuzz.campaign` and ``python -m ep.testing.fuzz``: many models through
  worker processes with time and memory limits, a JSON and markdown table.
"""

from .build import feeds
from .generate import generate
from .run import OK, run_case

__all__ = ["OK", "feeds", "generate", "run_case"]
