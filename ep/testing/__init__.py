"""ep.testing: a testing kit for execution-provider developers (see ``docs/testing.md``).

- :mod:`ep.testing.strategies`: hypothesis strategies :func:`~ep.testing.strategies.models`,
  :func:`~ep.testing.strategies.feeds` and :func:`~ep.testing.strategies.device_configs`;
- :func:`assert_matches_onnxruntime`: run a model on ``ep.InferenceSession`` and on
  onnxruntime's CPU provider and compare with per-dtype tolerances; a failure saves a
  replayable case (:func:`replay`);
- a pytest plugin (:mod:`ep.testing.pytest_plugin`, active once the package is installed) with
  the fixtures ``npu_device``, ``npu_session`` and ``assert_matches_onnxruntime``;
- :mod:`ep.testing.conformance`: the ONNX backend node tests through :mod:`ep.backend`;
- :mod:`ep.testing.fuzz`: differential fuzzing with a model generator of its own
  (``python -m ep.testing.fuzz --seed S --count N --workers W --out DIR``).
"""

from .compare import Mismatch, assert_matches_onnxruntime, replay

__all__ = ["Mismatch", "assert_matches_onnxruntime", "replay"]
