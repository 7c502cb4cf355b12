"""``ep.backend``: an ``onnx.backend.base.Backend`` over :class:`ep.InferenceSession`.

What ``onnxruntime.backend`` is for onnxruntime: the interface onnx's backend test suite drives
(``prepare`` a model, ``run`` it on a list or dict of inputs, ``run_node`` for one node). The
session runs the NPU first and the CPU for what it declines; pass ``providers=`` (and any
``ep.SessionOptions`` as ``sess_options=``) to ``prepare`` to choose others::

    import ep.backend as backend
    rep = backend.prepare(model)
    outputs = rep.run([x])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from .errors import InvalidArgument
from .framework.session import InferenceSession

DEFAULT_PROVIDERS = ("NpuSimExecutionProvider", "CPUExecutionProvider")


class EpBackendRep(BackendRep):
    """A prepared model: an :class:`ep.InferenceSession` ready to run."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> list[np.ndarray]:
        """Outputs (all, in graph order) for ``inputs``: a list in graph-input order, a dict by
        name, or one array for a one-input model."""
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, Mapping):
            feed = dict(inputs)
        elif isinstance(inputs, np.ndarray):
            feed = {names[0]: inputs} if names else {}
        else:
            values = list(inputs)
            if len(values) > len(names):
                raise InvalidArgument(f"{len(values)} inputs given; the model takes "
                                      f"{len(names)}: {names}")
            feed = dict(zip(names, values, strict=False))
        return self.session.run(None, feed)


class EpBackend(Backend):
    """onnx's backend interface over :class:`ep.InferenceSession` (host device ``CPU``)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Any model the session accepts; checked when it is prepared."""
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """``CPU`` (the host; the simulated NPU is a provider behind it)."""
        return device.upper() == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto | bytes | str, device: str = "CPU",
                **kwargs: Any) -> EpBackendRep:
        """A session for ``model``; ``providers``, ``provider_options`` and ``sess_options``
        are passed on to :class:`ep.InferenceSession`."""
        if not cls.supports_device(device):
            raise InvalidArgument(f"device {device!r} not supported; supported: CPU")
        if isinstance(model, onnx.ModelProto):
            model = model.SerializeToString()
        providers: Sequence[Any] = kwargs.get("providers") or DEFAULT_PROVIDERS
        session = InferenceSession(model, kwargs.get("sess_options"), providers=list(providers),
                                   provider_options=kwargs.get("provider_options"),
                                   enable_fallback=0)  # the NPU's own faults are the result
        return EpBackendRep(session)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> list[np.ndarray]:
        """Prepare ``model`` and run it once."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, Any]] | None = None,
                 **kwargs: Any) -> list[np.ndarray]:
        """Run one node on ``inputs`` (arrays in the node's input order)."""
        from onnx import helper

        arrays = [np.asarray(a) for a in inputs]
        names = [n for n in node.input if n]
        values = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                a.shape) for n, a in zip(names, arrays,
                                                                         strict=False)]
        graph = helper.make_graph([node], "run_node", values,
                                  [onnx.ValueInfoProto(name=o) for o in node.output if o])
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain, opset)])
        return cls.run_model(model, dict(zip(names, arrays, strict=False)), device, **kwargs)


prepare = EpBackend.prepare
run_model = EpBackend.run_model
run_node = EpBackend.run_node
supports_device = EpBackend.supports_device
is_compatible = EpBackend.is_compatible
