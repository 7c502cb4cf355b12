"""A small execution provider written in Python against the EP interface, for framework tests.

``ToyExecutionProvider`` takes ``Relu``, ``Add``, ``Mul`` and ``Neg`` on float32, runs them
with numpy, and supports EPContext generation and loading the way ONNX Runtime's EPs do: one
context file ``<model>_toy.bin`` (JSON: a format version and one program per graph) for every
partition, the first EPContext node main and the others referencing it, or the payload embedded
in the main node. That it works end to end shows a user can write another EP in Python.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from ep.framework import epcontext as E
from ep.framework.files import atomic_write
from ep.framework.graph import GraphView
from ep.framework.options import EP_CONTEXT_ENABLE
from ep.framework.provider import CompiledNode, ComputeCapability, ExecutionProvider, FusedNode

TOY = "ToyExecutionProvider"
OPS = {"Relu": lambda a: np.maximum(a, 0), "Neg": np.negative, "Add": np.add, "Mul": np.multiply}
FORMAT = 1


class ToyProgram(CompiledNode):
    """A list of numpy ops over named tensors."""

    def __init__(self, name: str, program: dict) -> None:
        self.name = name
        self.inputs = program["inputs"]
        self.outputs = program["outputs"]
        self.steps = program["steps"]
        self.consts = {k: np.array(v, dtype=np.float32) for k, v in program["consts"].items()}

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        env = dict(self.consts)
        env.update(zip(self.inputs, inputs, strict=True))
        for op, ins, out in self.steps:
            env[out] = OPS[op](*(env[i] for i in ins)).astype(np.float32)
        return [env[o] for o in self.outputs]


def _program(fused: FusedNode) -> dict:
    consts = {t.name: numpy_helper.to_array(t).tolist() for t in fused.graph.initializer}
    steps = [[n.op_type, list(n.input), n.output[0]] for n in fused.graph.node]
    return {"inputs": fused.inputs, "outputs": fused.outputs, "steps": steps, "consts": consts}


class ToyExecutionProvider(ExecutionProvider):
    """Runs Relu/Add/Mul/Neg (float32) with numpy; EPContext generation and loading."""

    type = TOY

    def __init__(self, context: E.ProviderContext | None = None) -> None:
        super().__init__(context)
        self._ctx_nodes: list[onnx.NodeProto] = []
        self.loaded_from_context = 0
        self.compiled_fresh = 0
        self.runs = 0

    def get_capability(self, graph: GraphView) -> list[ComputeCapability]:
        caps, group = [], []
        for i, node in enumerate(graph.nodes):
            if i in graph.assigned:
                continue
            if E.is_ep_context_node(node):
                source = E.parse_ep_context_node(node).source
                if source in (None, TOY):
                    caps.append(ComputeCapability((i,)))
            elif node.op_type in OPS and node.domain == "" and all(
                graph.tensor_type(t)[0] == "float32" for t in (*node.input, *node.output)
            ):
                group.append(i)
        return caps + ([ComputeCapability(tuple(group))] if group else [])

    def decline_reasons(self, graph: GraphView) -> dict[int, str]:
        return {i: f"{n.op_type} is not one of {sorted(OPS)}" for i, n in enumerate(graph.nodes)
                if n.op_type not in OPS}

    def compile(self, fused_nodes: Sequence[FusedNode]) -> list[CompiledNode]:
        ctx = [f for f in fused_nodes if E.is_ep_context_node(f.graph.node[0])]
        programs = self._load(ctx) if ctx else {}
        out: list[CompiledNode] = []
        fresh: list[tuple[FusedNode, dict]] = []
        for f in fused_nodes:
            if f in ctx:
                info = E.parse_ep_context_node(f.graph.node[0])
                if info.graph_name not in programs:
                    raise E.load_error(f"graph {info.graph_name!r} is in no context of this "
                                       f"model; graphs: {sorted(programs)}")
                out.append(ToyProgram(f.name, programs[info.graph_name]))
                self.loaded_from_context += 1
            else:
                program = _program(f)
                fresh.append((f, program))
                out.append(ToyProgram(f.name, program))
                self.compiled_fresh += 1
        if fresh and self.context.session_config.get(EP_CONTEXT_ENABLE) == "1":
            self._make_context_nodes(fresh)
        return out

    def _make_context_nodes(self, fresh: list[tuple[FusedNode, dict]]) -> None:
        settings = E.generation_settings(self.context)
        payload = json.dumps({"format": FORMAT,
                              "graphs": {f.name: p for f, p in fresh}}).encode()
        binary = settings.binary_path("toy")
        if settings.embed_mode == 0:
            atomic_write(binary, [payload])
        for k, (f, _) in enumerate(fresh):
            main = k == 0
            cache: bytes | str = binary.name if settings.embed_mode == 0 else \
                (payload if main else b"")
            self._ctx_nodes.append(E.make_ep_context_node(
                f.name, f.inputs, f.outputs, source=TOY, main_context=main,
                embed_mode=settings.embed_mode, ep_cache_context=cache, ep_sdk_version="1.0",
                hardware_architecture="toy", onnx_model_filename=settings.model_name + ".onnx"))

    def _load(self, fused: Sequence[FusedNode]) -> dict[str, dict]:
        programs: dict[str, dict] = {}
        for f in fused:
            info = E.parse_ep_context_node(f.graph.node[0])
            if not info.main_context:
                continue
            if info.embed_mode == 1:
                data = info.ep_cache_context
            else:
                path = E.resolve_context_file(info.ep_cache_context, E.context_folder(
                    self.context), node=info.name)
                data = path.read_bytes()
            try:
                doc = json.loads(data)
            except ValueError:
                raise E.load_error(f"EPContext node {info.name!r}: context is not valid "
                                   "JSON") from None
            if doc.get("format") != FORMAT:
                raise E.load_error(f"EPContext node {info.name!r}: context format version "
                                   f"{doc.get('format')!r}, this EP reads {FORMAT}")
            programs.update(doc["graphs"])
        return programs

    def get_ep_context_nodes(self) -> list[onnx.NodeProto]:
        return list(self._ctx_nodes)

    def run_stats(self) -> dict[str, int]:
        return {"compiled_fresh": self.compiled_fresh,
                "loaded_from_context": self.loaded_from_context}
