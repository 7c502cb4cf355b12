"""``InferenceSession``: load a model, partition it across providers, compile, run.

The class mirrors ``onnxruntime.InferenceSession`` (constructor, ``run``, ``get_inputs``,
``get_outputs``, ``get_providers``, ``get_provider_options``, ``end_profiling``,
``set_providers`` and the EP-error fallback of :mod:`ep.framework.fallback`) so user code ports
by changing the import. Creating a session:

1. loads the model (from a path, with its external data from the model's folder; or from
   bytes, with ``session.model_external_initializers_file_folder_path`` for external data);
2. builds the providers (names, ``(name, options)`` pairs, or names plus ``provider_options``;
   an :class:`~ep.framework.provider.ExecutionProvider` instance is accepted too, which is how
   a provider written in Python joins a session); ``CPUExecutionProvider`` is always last;
3. partitions the graph (:func:`~ep.framework.partitioner.partition`) and compiles every
   partition on its provider; an ``EPContext`` node no provider takes is ``NotImplemented``;
4. with ``ep.context_enable=1``, writes the EPContext model
   (:class:`~.context_writer.ContextWriter`).

After a run, :meth:`InferenceSession.get_run_stats` reports each provider's counters (for the
NPU: simulated cycles, microseconds, per-engine utilization), and
:meth:`InferenceSession.get_node_assignment` / :meth:`InferenceSession.get_decline_reasons` say
which provider runs each node and why the others declined it.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime

from ..errors import EPFail, Fail, InvalidArgument, RuntimeException
from . import fallback, optimized_model
from .assignment import EpAssignedSubgraph, assignment_info
from .context_writer import ContextWriter
from .executor import PlanExecutor, check_present
from .files import atomic_write
from .gc_pause import creation
from .io_binding import IOBinding, as_arrays, owned
from .node_args import NodeArg, node_arg
from .options import EP_CONTEXT_ENABLE, SessionOptions, config_flag
from .pipeline import construct
from .provider import CompiledNode
from .registry import (
    CPU_PROVIDER,
    ProviderSpec,
    available_providers,
    normalize_provider_args,
    spec_names,
)
from .run_options import check_mapping, check_run, check_severity
from .tensors import restore_raw_data


def get_available_providers() -> list[str]:
    """The registered providers, in default priority order (``CPUExecutionProvider`` last)."""
    return available_providers()


def get_all_providers() -> list[str]:
    """Every provider name a session accepts: the registered ones onnxruntime does not know,
    then onnxruntime's ``get_all_providers`` (those it knows but this process lacks a session
    leaves out, with a warning)."""
    known = onnxruntime.get_all_providers()
    return [p for p in available_providers() if p not in known] + known


def get_device() -> str:
    """The device this package's sessions run on by default, as onnxruntime's ``get_device``
    names its build's (``"CPU"``, ``"GPU"``): the simulated NPU."""
    return "NPU"


class InferenceSession:
    """A model partitioned across execution providers, ready to run (see the module doc)."""

    def __init__(
        self,
        path_or_bytes: str | os.PathLike[str] | bytes,
        sess_options: SessionOptions | None = None,
        providers: Sequence[ProviderSpec] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(path_or_bytes, (str, os.PathLike, bytes)):  # onnxruntime's check
            raise TypeError(f"Unable to load from type '{type(path_or_bytes)}'")
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise TypeError(f"sess_options must be an ep.SessionOptions, got "
                            f"{type(sess_options).__module__}.{type(sess_options).__name__}")
        self._source = path_or_bytes
        self._sess_options = sess_options or SessionOptions()
        self._enable_fallback = fallback.enabled(kwargs)
        try:
            self._create(providers, provider_options)
        except Exception as exc:  # onnxruntime retries some on the CPU (ep.framework.fallback)
            if not (self._enable_fallback and fallback.retries_creation(exc)):
                raise
            fallback.report_creation(exc, providers)
            try:
                self._create(fallback.PROVIDERS, None)
            except Exception as fallback_error:
                raise fallback_error from exc
            self.disable_fallback()

    @creation  # no cyclic garbage collection inside a creation (ep.framework.gc_pause)
    def _create(self, providers: Sequence[ProviderSpec] | None,
                provider_options: Sequence[Mapping[str, Any]] | None) -> None:
        started = time.perf_counter()
        options = self._sess_options
        check_severity(options.log_severity_level, "session", RuntimeException)
        config = options.config_entries()
        profiler = Profiler(options)
        if providers is None and provider_options is None and options.has_providers():
            specs = normalize_provider_args(options.providers, None)
        else:
            if (providers or provider_options) and options.has_providers():
                warnings.warn(
                    "Specified 'providers'/'provider_options' when creating InferenceSession but "
                    "SessionOptions has already been configured with providers. "
                    "InferenceSession will only use the providers passed to InferenceSession().",
                    stacklevel=4)
            specs = normalize_provider_args(
                available_providers() if providers is None else providers, provider_options)
        ctx = config_flag(config, EP_CONTEXT_ENABLE)
        built = construct(
            self._source, config, specs,
            optimization_level=options.graph_optimization_level,
            free_dims=options.free_dimension_overrides,
            free_denotations=options.free_dimension_denotations,
            make_writer=lambda path: ContextWriter(config, path) if ctx else None,
            wrap=profiler.wrap, initializers=options.initializers,
            external_initializers=options.external_initializers,
            context_data=options.context_data)
        used = [part.provider for part in built.plan.partitions if part.nodes]
        named = providers is not None or options.has_providers()  # not the default list
        fallback.check_cpu_ep_fallback(config, named and CPU_PROVIDER in spec_names(specs), used)
        if options.optimized_model_filepath:
            optimized_model.write(self._source, options, used)
        self._profiler, self._config = profiler, config
        self._model, self._model_path = built.source, built.model_path
        self._weights: dict[str, np.ndarray] | None = built.weights
        self._providers, self._graph, self._plan = built.providers, built.graph, built.plan
        self._executor = PlanExecutor(self._graph, self._plan, built.compiled)
        if profiler.enabled:
            model_name = self._model.graph.name or os.path.basename(str(self._model_path or ""))
            for provider in self._providers:
                provider.start_profiling(model_name)
        profiler.event("session_initialization", "Session", started)

    # -- onnxruntime's API --------------------------------------------------------------------

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: Any = None) -> list[np.ndarray]:
        """Compute ``output_names`` (None or empty: every output) from ``input_feed``, with
        ``run_options`` (an :class:`~ep.framework.run_options.RunOptions`) if given. A run
        that fails with ``EPFail`` runs again on ``CPUExecutionProvider`` while the fallback
        is enabled, as in onnxruntime (:mod:`ep.framework.fallback`)."""
        wanted = check_run(output_names, input_feed, run_options)
        try:
            return self._run(input_feed, wanted)
        except EPFail as err:
            self._fall_back(err)
            return self._run(input_feed, wanted)

    def run_async(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                  callback: Callable[[list[np.ndarray], Any, str], object], user_data: Any,
                  run_options: Any = None) -> None:
        """:meth:`run` on another thread, as onnxruntime's: the arguments and the inputs'
        presence are checked here (raising as :meth:`run` does), then
        ``callback(outputs, user_data, "")`` is called from that thread, or
        ``callback([], user_data, message)`` if the run failed (no EP-error fallback, as in
        onnxruntime). The device serializes runs of one session."""
        if not callable(callback):
            raise TypeError(f"run_async(): callback must be callable as callback(outputs, "
                            f"user_data, error), got {type(callback).__name__}")
        wanted = check_run(output_names, input_feed, run_options)
        check_present(self._graph, input_feed)
        # onnxruntime's asynchronous path words this one with a space (its run does not)
        unknown = [name for name in wanted or () if name not in self._graph.outputs]

        def work() -> None:
            try:
                if unknown:
                    raise InvalidArgument(f"Invalid output name: {unknown[0]}")
                results, error = self._run(input_feed, wanted), ""
            except Exception as exc:  # noqa: BLE001 - reported to the callback, as onnxruntime
                results, error = [], getattr(exc, "message", str(exc))
            callback(results, user_data, error)

        threading.Thread(target=work, name="ep-run-async", daemon=True).start()

    def run_with_ort_values(self, output_names: Sequence[str] | None,
                            input_dict_ort_values: Mapping[str, Any],
                            run_options: Any = None) -> list[Any]:
        """:meth:`run` with ``OrtValue`` inputs and outputs (onnxruntime's own class, on the
        CPU; :mod:`ep.framework.io_binding`)."""
        feeds = as_arrays(dict(check_mapping(input_dict_ort_values)))
        values = self.run(output_names, feeds, run_options)
        names = output_names or self._graph.outputs
        return [owned(value, self._graph, name)
                for name, value in zip(names, values, strict=True)]

    def io_binding(self) -> IOBinding:
        """A new :class:`~ep.framework.io_binding.IOBinding` of this session."""
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: Any = None) -> None:
        """Run on the inputs ``iobinding`` holds, into the outputs it binds (onnxruntime runs
        a binding without the EP-error fallback)."""
        if not isinstance(iobinding, IOBinding):
            raise TypeError(f"run_with_iobinding(): expected an IOBinding of this session "
                            f"(session.io_binding()), got {type(iobinding).__name__}")
        iobinding.run(run_options)

    def run_bound(self, output_names: Sequence[str], input_feed: Mapping[str, Any],
                  run_options: Any = None) -> list[np.ndarray]:
        """:meth:`run` without the fallback, for :class:`IOBinding`."""
        return self._run(input_feed, check_run(output_names, input_feed, run_options))

    def _fall_back(self, err: EPFail) -> None:
        """Re-create the session on the fallback providers after ``err``, as onnxruntime does;
        raise ``err`` if the fallback is off."""
        if not self._enable_fallback:
            raise err
        fallback.report_run(err, self.get_providers())
        self.set_providers(fallback.PROVIDERS)
        self.disable_fallback()

    def _run(self, input_feed: Mapping[str, Any], wanted: list[str] | None) -> list[np.ndarray]:
        started = time.perf_counter()
        for provider in self._providers:
            provider.on_run_start()
        try:
            result = self._executor.run(input_feed, wanted)
        finally:
            for provider in self._providers:
                provider.on_run_end()
        self._profiler.event("model_run", "Session", started)
        return result

    def set_providers(self, providers: Sequence[ProviderSpec] | None = None,
                      provider_options: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Create the session again from its model and options with these providers (None:
        the session options' providers, else every available one), as onnxruntime re-creates
        its session. On failure the session keeps what it had."""
        self._create(providers, provider_options)

    def disable_fallback(self) -> None:
        """Turn off the EP-error fallback (:mod:`ep.framework.fallback`) for later runs."""
        self._enable_fallback = False

    def enable_fallback(self) -> None:
        """Turn the EP-error fallback back on: a run failing with ``EPFail`` runs again on
        ``CPUExecutionProvider``."""
        self._enable_fallback = True

    def create_instance(self) -> SessionInstance:
        """Another inference instance of this compiled model, as PPLNN's
        ``builder->CreateRuntime()``: it shares the model's weights (one device copy, counted
        once in ``hbm.weights.bytes``) and has its own activations, so instances run from
        different threads without waiting on each other's buffers. Each compiled node makes its
        instance (:meth:`~ep.framework.provider.CompiledNode.instance`)."""
        nodes = {name: node.instance() for name, node in self._executor.compiled.items()}
        return SessionInstance(self, PlanExecutor(self._graph, self._plan, nodes))

    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs (initializers excluded), in order."""
        return [node_arg(self._graph, name) for name in self._graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs, in order."""
        return [node_arg(self._graph, name) for name in self._graph.outputs]

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers the graph also lists as inputs, in input order: a run may feed them
        (their initializer is the value otherwise), as onnxruntime's."""
        return [node_arg(self._graph, name) for name in self._graph.overridable]

    def get_providers(self) -> list[str]:
        """The session's providers, in priority order (``CPUExecutionProvider`` last)."""
        return [p.type for p in self._providers]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Each provider's options, as given."""
        return {p.type: {str(k): str(v) for k, v in p.context.provider_options.items()}
                for p in self._providers}

    def get_input_memory_infos(self) -> list[onnxruntime.OrtMemoryInfo]:
        """Where each input is read from: host memory (``Cpu``), as onnxruntime's CPU-resident
        inputs; the NPU's DMA engines copy them to the device."""
        return [_host_memory() for _ in self._graph.inputs]

    def get_output_memory_infos(self) -> list[onnxruntime.OrtMemoryInfo]:
        """Where each output is written: host memory (``Cpu``)."""
        return [_host_memory() for _ in self._graph.outputs]

    def get_tuning_results(self) -> list[dict[str, Any]]:
        """Kernel tuning results to save: none, as onnxruntime's CPU provider has none (its
        ROCm and CUDA providers tune)."""
        return []

    def set_tuning_results(self, results: list[dict[str, Any]], *,
                           error_on_invalid: bool = False) -> None:
        """Tuning results from :meth:`get_tuning_results`: no provider here tunes, so none is
        used (onnxruntime logs that it cannot find the provider a result names)."""
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
            raise TypeError("set_tuning_results(): incompatible function arguments: results "
                            f"must be a list of dicts, got {type(results).__name__}")

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started (ns since the epoch, as ``time.time_ns``); 0 when it is off."""
        return self._profiler.start_ns

    def get_session_options(self) -> SessionOptions:
        """The options the session was created with."""
        return self._sess_options

    def get_modelmeta(self) -> ModelMetadata:
        """The model's producer, graph name, domain, descriptions, version and metadata
        properties, as onnxruntime's ``ModelMetadata``."""
        m = self._model
        return ModelMetadata(
            producer_name=m.producer_name, graph_name=m.graph.name, domain=m.domain,
            description=m.doc_string, graph_description=m.graph.doc_string,
            version=m.model_version if m.HasField("model_version") else NO_VERSION,
            custom_metadata_map={p.key: p.value for p in m.metadata_props})

    def end_profiling(self) -> str:
        """Write the profile (ONNX Runtime's JSON format) and return its file name; ``""``
        when profiling is off.

        A provider that records a replayable trace (the NPU: every run of every partition
        since the session was created) has it written beside the profile, same stem, suffix
        ``.trace.jsonl`` (``docs/trace_format.md``); its kernels join the profile as ``Node``
        events in simulated time. Profiling stops, as in onnxruntime."""
        traces = [t for t in (p.end_profiling() for p in self._providers) if t is not None]
        return self._profiler.end(self.get_run_stats(), traces[0] if traces else None)

    # -- what the simulator adds --------------------------------------------------------------

    def get_node_assignment(self) -> dict[str, str]:
        """Node name -> the provider that runs it."""
        return dict(self._plan.assignment)

    def get_decline_reasons(self) -> dict[str, dict[str, str]]:
        """Node name -> {provider: why it declined} for nodes a provider did not take."""
        return {k: dict(v) for k, v in self._plan.reasons.items()}

    def get_provider_graph_assignment_info(self) -> list[EpAssignedSubgraph]:
        """The subgraphs each provider took (:mod:`ep.framework.assignment`), when the session
        was made with ``session.record_ep_graph_assignment_info=1``."""
        return assignment_info(self._config, self._graph, self._plan)

    def get_partitions(self) -> list[dict[str, Any]]:
        """The partitions in execution order: name, provider, node names, inputs, outputs."""
        return [{"name": p.name, "provider": p.provider,
                 "nodes": [self._graph.names[i] for i in p.nodes],
                 "inputs": list(p.inputs), "outputs": list(p.outputs)}
                for p in self._plan.partitions]

    def get_external_weight_files(self) -> list[Any]:
        """Every provider's external weight files after compiling or loading, in provider
        order: entries with ``path``, ``size``, ``offset`` and ``id`` (GE's
        ``CompiledGraphSummary::GetExternalWeightPaths``); see ``docs/epcontext.md``."""
        return [item for p in self._providers for item in p.external_weight_files()]

    def get_run_stats(self) -> dict[str, Any]:
        """Counters from the last run: per provider its ``run_stats()`` (simulated cycles,
        microseconds and engine utilization for the NPU), plus wall time per partition."""
        stats: dict[str, Any] = {p.type: dict(p.run_stats()) for p in self._providers
                                 if p.run_stats()}
        stats["partition_wall_us"] = self._profiler.last_partition_us()
        return stats

    @property
    def model(self) -> onnx.ModelProto:
        """The model as the session partitioned it: loaded (external data included), with
        onnxruntime's basic optimizations applied and shapes inferred."""
        if self._weights is not None:  # the load kept large weights out of the protobuf
            restore_raw_data(self._model.graph.initializer, self._weights)
            self._weights = None
        return self._model


# -- loading, feeds, profiling ---------------------------------------------------------------


class SessionInstance:
    """An inference instance made by :meth:`InferenceSession.create_instance`: ``run`` as the
    session's (partial runs included), its own activations, the session's weights."""

    def __init__(self, session: InferenceSession, executor: PlanExecutor) -> None:
        self.session = session
        self._executor = executor

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: Any = None) -> list[np.ndarray]:
        """Compute ``output_names`` (None or empty: every output) from ``input_feed``."""
        return self._executor.run(input_feed, check_run(output_names, input_feed, run_options))

    def get_inputs(self) -> list[NodeArg]:
        """The session's inputs."""
        return self.session.get_inputs()

    def get_outputs(self) -> list[NodeArg]:
        """The session's outputs."""
        return self.session.get_outputs()


#: The version onnxruntime reports for a model without ``model_version`` (its ``kNoVersion``).
NO_VERSION = 2**63 - 1


@dataclass(frozen=True)
class ModelMetadata:
    """onnxruntime's ``ModelMetadata``: what :meth:`InferenceSession.get_modelmeta` returns."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]


class _TimedNode(CompiledNode):
    """A compiled node whose runs are timed for the profile."""

    def __init__(self, inner: CompiledNode, name: str, provider: str,
                 profiler: Profiler) -> None:
        self.inner, self.name, self.provider, self.profiler = inner, name, provider, profiler

    def instance(self) -> CompiledNode:
        return _TimedNode(self.inner.instance(), self.name, self.provider, self.profiler)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        started = time.perf_counter()
        outputs = self.inner.run(inputs)
        self.profiler.partition_ran(self.name, self.provider, started, inputs, outputs)
        return outputs

    def run_partial(self, inputs: Sequence[np.ndarray], wanted: Sequence[bool]) -> list[Any]:
        started = time.perf_counter()
        outputs = self.inner.run_partial(inputs, wanted)
        self.profiler.partition_ran(self.name, self.provider, started, inputs, outputs)
        return outputs


class Profiler:
    """Records session events in ONNX Runtime's profile format (a JSON list of Chrome trace
    ``"ph": "X"`` events with ``cat`` Session/Node) when ``enable_profiling`` is set."""

    def __init__(self, options: SessionOptions) -> None:
        self.enabled = bool(options.enable_profiling)
        self.prefix = options.profile_file_prefix
        self.origin = time.perf_counter()
        self.start_ns = time.time_ns() if self.enabled else 0  # onnxruntime: 0 when off
        self.events: list[dict[str, Any]] = []
        self._last: dict[str, float] = {}

    def wrap(self, node: CompiledNode, name: str, provider: str) -> CompiledNode:
        """``node``, timed per run."""
        return _TimedNode(node, name, provider, self)

    def _us(self, t: float) -> int:
        return int((t - self.origin) * 1e6)

    def event(self, name: str, cat: str, started: float,
              args: Mapping[str, Any] | None = None) -> None:
        """Record an event that began at ``started`` (perf_counter) and ends now."""
        if not self.enabled:
            return
        now = time.perf_counter()
        self.events.append({"cat": cat, "pid": os.getpid(), "tid": 0,
                            "dur": self._us(now) - self._us(started), "ts": self._us(started),
                            "ph": "X", "name": name, "args": dict(args or {})})

    def partition_ran(self, name: str, provider: str, started: float,
                      inputs: Sequence[np.ndarray] = (),
                      outputs: Sequence[np.ndarray] = ()) -> None:
        """Record one partition's run (its tensors' shapes as onnxruntime lists them)."""
        self._last[name] = (time.perf_counter() - started) * 1e6
        if self.enabled:
            self.event(f"{name}_kernel_time", "Node", started,
                       {"op_name": name, "provider": provider,
                        "input_type_shape": _type_shapes(inputs),
                        "output_type_shape": _type_shapes(outputs),
                        "node_index": str(len(self.events))})

    def last_partition_us(self) -> dict[str, float]:
        """Wall microseconds of each partition's latest run."""
        return dict(self._last)

    def end(self, run_stats: Mapping[str, Any], trace: Any = None) -> str:
        """Write the profile JSON (with the providers' run stats attached, and ``trace``'s
        kernels as Node events) and return its name; ``""`` when profiling is off. ``trace``
        (an :class:`npu_sim.trace.Trace`) is saved beside it as ``<stem>.trace.jsonl``."""
        if not self.enabled:
            return ""
        from npu_sim.trace import save
        from npu_sim.trace.exporters import ort_events

        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        path = f"{self.prefix}_{stamp}.json"
        events = list(self.events)
        if trace is not None:
            events.extend(ort_events(trace, pid=os.getpid()))
            try:
                save(trace, f"{self.prefix}_{stamp}.trace.jsonl")
            except OSError as exc:
                raise Fail(f"cannot write the trace beside {path}: {exc.strerror}") from None
        for provider, stats in run_stats.items():
            events.append({"cat": "Session", "pid": os.getpid(), "tid": 0, "dur": 0,
                           "ts": self._us(time.perf_counter()), "ph": "X",
                           "name": f"{provider}_run_stats", "args": _jsonable(stats)})
        atomic_write(path, [json.dumps(events, indent=1).encode("utf-8")])
        self.events.clear()
        self.enabled = False
        return path


_ORT_TYPE_NAMES = {"float32": "float", "float64": "double"}


@functools.cache
def _ort_type_name(dtype: np.dtype) -> str:
    """onnxruntime's profile name of ``dtype`` (numpy builds ``dtype.name`` anew each time,
    2-3 us: a profiled run asks for every partition's inputs and outputs)."""
    return _ORT_TYPE_NAMES.get(dtype.name, dtype.name)


def _type_shapes(arrays: Sequence[Any]) -> list[dict[str, list[int]]]:
    """``[{"float": [1, 3, 64, 64]}, ...]``: onnxruntime's profile form of tensor types."""
    return [{_ort_type_name(a.dtype): list(a.shape)} for a in arrays if isinstance(a, np.ndarray)]


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


def _host_memory() -> onnxruntime.OrtMemoryInfo:
    return onnxruntime.OrtMemoryInfo("Cpu", onnxruntime.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                     onnxruntime.OrtMemType.DEFAULT)
