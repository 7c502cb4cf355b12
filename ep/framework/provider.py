"""The execution-provider interface, in ONNX Runtime's shape.

An execution provider (EP) is asked three things by the framework:

1. :meth:`ExecutionProvider.get_capability`: which nodes of this graph can you take? It answers
   with :class:`ComputeCapability` groups (node indices of a :class:`~ep.framework.graph.GraphView`)
   and, for every node it declines, a reason a user can read
   (:meth:`ExecutionProvider.decline_reasons`).
2. :meth:`ExecutionProvider.compile`: here are the partitions you were assigned, each as a
   :class:`FusedNode` holding its own subgraph; return a :class:`CompiledNode` for each that
   runs it.
3. :meth:`ExecutionProvider.get_ep_context_nodes`: the ``EPContext`` nodes (domain
   ``com.microsoft``) standing for what you compiled, when context generation is enabled.

The framework partitions providers in priority order, first come first served, keeps the
partitions acyclic, runs what nobody took on the CPU provider, and writes/reads EPContext models.
A user can write another EP in Python against this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from ..errors import EPFail, OrtError
from .context_data import ContextDataFunctions
from .tensors import restore_raw_data

if TYPE_CHECKING:
    from .graph import GraphView


@dataclass(frozen=True)
class ComputeCapability:
    """A group of nodes (indices into ``GraphView.nodes``) an EP offers to run as one unit."""

    nodes: tuple[int, ...]


@dataclass
class FusedNode:
    """A partition assigned to an EP: a fused node standing for a self-contained subgraph.

    :attr:`graph` is a standalone ``onnx.GraphProto`` (its inputs and outputs typed with static
    or symbolic shapes, the initializers it uses included) whose inputs and outputs are exactly
    ``inputs`` and ``outputs``, in order. ``opset_imports`` are the source model's. ``source``
    nodes are the indices of the original nodes it replaces.

    The partitioner does not copy weights into it: ``body`` is the subgraph with the
    initializers it holds itself, ``initializers`` the session's own tensors it also uses (by
    name, not copied) and ``values`` the decoded values of those the session already read (its
    weights, read-only). :attr:`graph` joins body and initializers on first use; an EP that
    reads values (the NPU compiler) takes ``values`` and never pays for that copy.
    """

    name: str
    body: onnx.GraphProto
    inputs: list[str]
    outputs: list[str]
    opset_imports: list[onnx.OperatorSetIdProto]
    source_nodes: tuple[int, ...] = ()
    initializers: Mapping[str, onnx.TensorProto] = field(default_factory=dict)
    values: Mapping[str, np.ndarray] = field(default_factory=dict)

    @cached_property
    def graph(self) -> onnx.GraphProto:
        """The standalone subgraph: ``body`` with ``initializers`` copied in (before its own);
        made on first use and kept (:meth:`standalone_graph` makes one that is not kept)."""
        return self.standalone_graph()

    def standalone_graph(self) -> onnx.GraphProto:
        """A new standalone subgraph (see :attr:`graph`): the weights copied in for a caller
        that hands it on (serialized to onnxruntime) and does not keep it."""
        if not self.initializers:
            return self.body
        graph = onnx.GraphProto()
        graph.CopyFrom(self.body)
        del graph.initializer[:]
        graph.initializer.extend(self.all_initializers())
        restore_raw_data(graph.initializer, self.values)
        return graph

    def all_initializers(self) -> list[onnx.TensorProto]:
        """Every initializer of the subgraph (``initializers``, then ``body``'s), not copied."""
        return [*self.initializers.values(), *self.body.initializer]


class CompiledNode(ABC):
    """What an EP returns for one fused node: something that runs it."""

    name: str

    @abstractmethod
    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Compute the outputs (in ``FusedNode.outputs`` order) from the inputs (in order)."""

    def run_partial(self, inputs: Sequence[np.ndarray], wanted: Sequence[bool]) -> list[Any]:
        """Like :meth:`run` when only the outputs with ``wanted[k]`` true are needed (a
        partial session run); the others may be anything, the executor drops them. The
        default computes everything; a node that can skip work overrides it."""
        return self.run(inputs)

    def instance(self) -> CompiledNode:
        """Another runnable instance of this node for a session instance
        (:meth:`~ep.framework.session.InferenceSession.create_instance`): its own activations,
        the same read-only state (weights). The default is the node itself, right for a node
        that keeps no state between runs and may run from several threads at once; a node
        with device memory for its activations returns a new one."""
        return self


@dataclass
class ProviderContext:
    """What the framework tells an EP at creation: its options and the session's config."""

    provider_options: Mapping[str, str] = field(default_factory=dict)
    session_config: Mapping[str, str] = field(default_factory=dict)
    model_path: str | None = None
    context_data: ContextDataFunctions = field(default_factory=ContextDataFunctions)
    """The user's functions to write and read context binaries through, if any."""


class ExecutionProvider(ABC):
    """Base class of execution providers. ``type`` is the provider's registered name."""

    type: str = ""
    shares_ep_contexts: bool = False
    """Whether this EP implements ``ep.share_ep_contexts`` (weight sharing across sessions)."""

    def __init__(self, context: ProviderContext | None = None) -> None:
        self.context = ProviderContext()
        self.bind(context or ProviderContext())

    def bind(self, context: ProviderContext) -> None:
        """Give the provider its context: its provider options, the session's config and the
        model path. The framework binds every provider once, when the session is created and
        before it asks the provider anything; a provider passed as an instance keeps its own
        provider options and gets the session's config here. Subclasses derive their settings
        in :meth:`_bind`, never in ``__init__``, so an instance made before the session sees
        the session's options too."""
        self.context = context
        self._bind(context)

    def _bind(self, context: ProviderContext) -> None:
        """Derive settings from ``context`` (the hook :meth:`bind` calls); nothing by default."""
        return None

    @abstractmethod
    def get_capability(self, graph: GraphView) -> list[ComputeCapability]:
        """The groups of nodes this EP can run. Nodes already assigned must not be offered."""

    def decline_reasons(self, graph: GraphView) -> dict[int, str]:
        """For each node this EP declines, why (e.g. ``"Resize: mode=cubic not supported"``)."""
        return {}

    @abstractmethod
    def compile(self, fused_nodes: Sequence[FusedNode]) -> list[CompiledNode]:
        """Compile the assigned partitions; one :class:`CompiledNode` per fused node, in order."""

    def get_ep_context_nodes(self) -> list[onnx.NodeProto]:
        """EPContext nodes for what :meth:`compile` compiled (empty unless generation is on)."""
        return []

    def end_ep_context_generation(self, committed: bool) -> None:
        """Called once generation is over: ``committed`` if the EPContext model was written (or
        nothing needed writing), False if the session failed. An EP sharing contexts across
        sessions makes this session's graphs part of its group, or drops them, here."""
        return None

    def free_dimension_overrides(self) -> dict[str, int]:
        """Symbolic dimensions this provider's options fix (name -> value). The session fixes
        them for the whole graph before partitioning, like
        ``SessionOptions.add_free_dimension_override_by_name``; none by default."""
        return {}

    def on_run_start(self) -> None:
        """Called before each session run (ONNX Runtime's ``OnRunStart``); nothing by default."""
        return None

    def on_run_end(self) -> None:
        """Called after each session run, also a failed one (``OnRunEnd``)."""
        return None

    def start_profiling(self, model: str) -> None:
        """The session profiles (``SessionOptions.enable_profiling``): from now on keep a
        replayable trace of every run of ``model``; nothing by default."""
        return None

    def end_profiling(self) -> Any:
        """Stop recording; the :class:`npu_sim.trace.Trace` of every run since
        :meth:`start_profiling`, or None (the default: this provider records no trace)."""
        return None

    def run_stats(self) -> dict[str, Any]:
        """Counters from the last run (simulated cycles, utilization...); empty by default."""
        return {}

    def external_weight_files(self) -> list[Any]:
        """The weights the provider keeps in external files (each with ``path``, ``size``,
        ``offset`` and ``id``, like GE's compile summary); none by default."""
        return []


@contextmanager
def provider_call(provider: ExecutionProvider, method: str) -> Iterator[None]:
    """Inside, an exception a provider's own code raised that is not one of ONNX Runtime's
    status errors becomes ``EPFail`` naming the provider and the call, chained to it: what ONNX
    Runtime makes of an EP returning a failed status, a typed error that is not retried on the
    CPU provider (:mod:`.fallback`)."""
    try:
        yield
    except OrtError:
        raise
    except Exception as exc:  # noqa: BLE001 - a provider's bug, reported as its EP's failure
        raise EPFail(f"{provider.type}.{method} raised {exc!r}") from exc
