"""ep.framework: the ONNX Runtime role (sessions, partitioning, EPContext models, providers).

Importing it registers ``CPUExecutionProvider``; execution providers register themselves
(:mod:`.registry`).
"""

from . import cpu  # noqa: F401 - registers CPUExecutionProvider
