"""``npu-sim run``: one model on the simulated NPU, with a summary and an optional check.

Inputs come from ``--inputs FILE.npz`` or are generated from what the model says about them:
an integer input that reaches a Gather's indices (directly or through Cast, Unsqueeze, Reshape,
Squeeze, Flatten or Identity) gets indices in range of the gathered axis, so token ids run
instead of faulting. ``--check`` (always on for the bundled model) compares the outputs with
onnxruntime's CPU provider using :func:`ep.testing.compare.compare`'s per-dtype tolerances and
prints the tolerance it used for each output. ``--cpu-nodes`` keeps nodes or op types on the
CPU (the provider option ``cpu_nodes``); ``--dim NAME=VALUE`` fixes a symbolic dimension
(:mod:`ep.cli_dims`), and generated inputs have that size.

``--json`` prints one JSON object instead of text, with these stable keys: ``model``,
``device``, ``trace`` (with ``--trace``: where it went), ``outputs`` (``{name: {dtype, shape}}``),
``partitions`` (``[{name, provider, nodes}]``), ``declined`` (``{op_type: {reason: [node,
...]}}``), ``runs`` (per provider: ``cycles``, ``microseconds``, ``throughput_per_s``,
``utilization`` per engine, ``energy``, ``partitions``) and, when checked, ``check``
(``{output: {ok, tolerance, reference, problem}}``).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import onnx

from ep import cli_errors, cli_progress, cli_trace
from ep.cli_dims import add_dim_option, fix_dims, session_dims
from ep.errors import InvalidArgument, OrtError

INDEX_PASSTHROUGH = frozenset({"Cast", "Unsqueeze", "Reshape", "Squeeze", "Flatten", "Identity"})
NPU = "NpuSimExecutionProvider"


def add_run(commands: argparse._SubParsersAction) -> None:
    """Register ``npu-sim run``."""
    p = commands.add_parser(
        "run", help="run a model on the simulated NPU and report the simulated run",
        description="Run MODEL (default: the bundled tiny_cnn, built in code) with "
                    "NpuSimExecutionProvider and CPU fallback, and report the simulated run. "
                    "The bundled model is always checked against onnxruntime's CPU provider; "
                    "other models with --check.")
    p.add_argument("model", nargs="?", default=None, help="path of an .onnx model")
    p.add_argument("--device", default="npu-m",
                   help="device preset (npu-s, npu-m, npu-l, os32) or a JSON/TOML config path")
    p.add_argument("--inputs", default=None, metavar="FILE.npz",
                   help="feed the arrays of FILE.npz (one per graph input, by name)")
    p.add_argument("--timing-only", action="store_true",
                   help="simulate timing only: no values computed, no comparison")
    p.add_argument("--check", action="store_true",
                   help="compare the outputs with onnxruntime CPU (per-dtype tolerances); "
                        "exit 1 on a mismatch")
    p.add_argument("--cpu-nodes", default=None, metavar="NAMES",
                   help="comma-separated node names or op types to keep on the CPU "
                        "(provider option cpu_nodes)")
    add_dim_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="record the run's replayable trace to FILE (.trace.jsonl); the ONNX "
                        "Runtime profile is written beside it")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Handler of ``npu-sim run``; returns the exit status (1 on a mismatch)."""
    from ep import InferenceSession
    from ep.models import DEFAULT_MODEL_NAME, tiny_cnn

    if args.model is None:
        model, label = tiny_cnn(), f"{DEFAULT_MODEL_NAME} (bundled)"
        source: str | bytes = model.SerializeToString()
    else:
        model, label, source = cli_errors.load_model(args.model), args.model, args.model
    options = {"device": args.device, "functional": "0" if args.timing_only else "1"}
    if args.cpu_nodes:
        options["cpu_nodes"] = args.cpu_nodes
    session_options = cli_trace.profiling(args.trace)
    dims = fix_dims(session_options, args.dim)
    with cli_progress.phase(f"loading {label} on {args.device}"):
        session = InferenceSession(source, session_options, providers=[(NPU, options)],
                                   enable_fallback=0)
    checking = not args.timing_only and (args.check or args.model is None)
    # The model that describes the inputs (an EPContext model's source), loaded once for
    # generating inputs and for --check, and only when one of them needs it.
    described = described_by(model, source) if checking or not args.inputs else None
    feeds = load_inputs(model, args.inputs) if args.inputs else generate_inputs(
        described, args.seed, {**session_dims(described, session), **dims})
    try:
        with cli_progress.phase(f"running {label}"):
            outputs = session.run(None, feeds)
    except OrtError as exc:
        raise type(exc)(f"{blame_inputs(model, feeds)}{exc.message}") from exc
    report: dict[str, Any] = {"model": label, "device": args.device}
    if args.trace:
        report["trace"] = cli_trace.save_profile(session, args.trace)
    report["outputs"] = {o.name: {"dtype": str(v.dtype), "shape": list(v.shape)}
                         for o, v in zip(session.get_outputs(), outputs, strict=True)}
    report["partitions"] = [{"name": p["name"], "provider": p["provider"],
                             "nodes": list(p["nodes"])} for p in session.get_partitions()]
    report["declined"] = declines_by_operator(model, session.get_decline_reasons())
    report["runs"] = {name: {**stats, "throughput_per_s": 1e6 / stats["microseconds"]
                             if stats["microseconds"] else None}
                      for name, stats in session.get_run_stats().items()
                      if isinstance(stats, dict) and "cycles" in stats}
    ok = True
    if checking:
        with cli_progress.phase("checking against onnxruntime CPU"):
            report["check"] = check(model, source, feeds, outputs, described)
        ok = all(c["ok"] for c in report["check"].values())
    if args.json:
        print(json.dumps(report, default=_jsonable), file=out)
    else:
        _print_report(report, out)
    return 0 if ok else 1


def generate_inputs(model: onnx.ModelProto, seed: int = 0,
                    dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random inputs for ``model``, its symbolic dims at ``dims`` (others 1), index inputs of a
    Gather kept in range of its axis."""
    from ep.models import sample_input

    feeds = sample_input(model, seed, dims)
    rng = np.random.default_rng(seed)
    for name, bound in index_bounds(model).items():
        if name in feeds and feeds[name].dtype.kind in "iu":
            feeds[name] = rng.integers(0, bound, feeds[name].shape).astype(feeds[name].dtype)
    return feeds


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Graph inputs that reach a Gather's indices, each with the smallest gathered axis size."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    dims = {t.name: list(t.dims) for t in graph.initializer}
    for vi in [*graph.input, *graph.value_info]:
        shape = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in shape):
            dims.setdefault(vi.name, [d.dim_value for d in shape])
    inputs = {vi.name for vi in graph.input}
    bounds: dict[str, int] = {}
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[0] not in dims:
            continue
        shape = dims[node.input[0]]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if not -len(shape) <= axis < len(shape):
            continue
        tensor = node.input[1]
        while tensor in producer and producer[tensor].op_type in INDEX_PASSTHROUGH:
            tensor = producer[tensor].input[0]
        if tensor in inputs:
            bounds[tensor] = min(bounds.get(tensor, shape[axis]), shape[axis])
    return bounds


def load_inputs(model: onnx.ModelProto, path: str) -> dict[str, np.ndarray]:
    """The arrays of ``path`` (an .npz), checked against the model's graph inputs by name."""
    from npu_sim import dtypes

    init_names = {t.name for t in model.graph.initializer}
    wanted = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input
              if vi.name not in init_names}
    try:
        with np.load(path, allow_pickle=False) as npz:
            feeds = {name: npz[name] for name in npz.files}
    except ValueError as exc:
        raise InvalidArgument(f"{path}: not a readable .npz of plain arrays ({exc})") from exc
    for name in feeds:
        if name not in wanted:
            raise InvalidArgument(f"{path}: array {name!r} is not a graph input (inputs: "
                                  f"{', '.join(sorted(wanted))})")
    for name, elem in wanted.items():
        if name not in feeds:
            raise InvalidArgument(f"{path}: no array for graph input {name!r}")
        want = dtypes.to_numpy(dtypes.from_onnx(elem))
        if feeds[name].dtype != want:
            raise InvalidArgument(f"{path}: input {name!r} is {feeds[name].dtype}, the model "
                                  f"expects {want}")
    return feeds


def blame_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> str:
    """The prefix naming the inputs a failed run is likely about.

    An input feeding Gather indices with a value out of range of the gathered axis is named
    alone; otherwise every input is described, so a value-dependent fault can be traced back.
    """
    bad = [f"input {name!r} has values in [{feeds[name].min()}, {feeds[name].max()}], out of "
           f"range of the axis of size {bound} it indexes through Gather"
           for name, bound in index_bounds(model).items()
           if name in feeds and feeds[name].size
           and not -bound <= feeds[name].min() <= feeds[name].max() < bound]
    return "; ".join(bad) + ": " if bad else f"with inputs {describe_feeds(feeds)}: "


def describe_feeds(feeds: dict[str, np.ndarray]) -> str:
    """One phrase per input: dtype, shape and, for integers, the range of its values."""
    parts = []
    for name, value in feeds.items():
        text = f"{name} {value.dtype}{list(value.shape)}"
        if value.dtype.kind in "iu" and value.size:
            text += f" in [{value.min()}, {value.max()}]"
        parts.append(text)
    return "; ".join(parts)


def declines_by_operator(model: onnx.ModelProto,
                         reasons: dict[str, dict[str, str]]) -> dict[str, dict[str, list[str]]]:
    """Decline reasons grouped by operator: ``{op_type: {reason: [node, ...]}}``."""
    op_of = {n.name: n.op_type for n in model.graph.node}
    grouped: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for node, why in reasons.items():
        grouped[op_of.get(node, "?")][why.get(NPU, "")].append(node)
    return {op: dict(by_reason) for op, by_reason in sorted(grouped.items())}


def check(model: onnx.ModelProto, source: str | bytes, feeds: dict[str, np.ndarray],
          outputs: list[np.ndarray], described: onnx.ModelProto | None = None
          ) -> dict[str, dict[str, Any]]:
    """Each output against onnxruntime CPU: ``{name: {ok, tolerance, problem}}``.
    ``described``: :func:`described_by`'s model, when the caller has it (not loaded again)."""
    from ep.testing.compare import compare, quantized_outputs, reference_outputs

    original = source_of(model, source)
    if original is not None:  # onnxruntime cannot run EPContext nodes: check the source model
        source = original
        model = described if described is not None else cli_errors.load_model(original)
    want, _, label, error = reference_outputs(model, feeds, source)
    if original is not None:
        label = f"{label} of {original}"
    if error is not None or want is None:
        raise InvalidArgument(f"onnxruntime CPU cannot run the model to check it: {error}")
    quantized = quantized_outputs(model)
    result = {}
    for vi, got, ref in zip(model.graph.output, outputs, want, strict=True):
        q = vi.name in quantized
        problem = compare(np.asarray(got), np.asarray(ref), quantized=q)
        result[vi.name] = {"ok": problem is None, "tolerance": tolerance(ref.dtype, q),
                           "reference": label, "problem": problem}
    return result


def described_by(model: onnx.ModelProto, source: str | bytes) -> onnx.ModelProto:
    """The model whose graph says what ``model``'s inputs may hold: for an EPContext model the
    source model beside it when it is there (a Gather inside an EPContext node is out of
    sight), else ``model`` itself."""
    try:
        original = source_of(model, source)
    except InvalidArgument:
        return model
    return model if original is None else cli_errors.load_model(original)


def source_of(model: onnx.ModelProto, source: str | bytes) -> str | None:
    """For an EPContext model, the source model it was compiled from (the EPContext nodes'
    ``onnx_model_filename``, beside it); None for any other model. InvalidArgument when it
    is an EPContext model whose source is not there."""
    from ep.framework import epcontext as E

    names = {E.parse_ep_context_node(n).onnx_model_filename for n in model.graph.node
             if E.is_ep_context_node(n)}
    if not names:
        return None
    folder = Path(source).parent if isinstance(source, str) else Path()
    found = [folder / n for n in names if n and (folder / n).is_file()]
    if len(found) != 1:
        raise InvalidArgument(f"--check compares with onnxruntime, which cannot run EPContext "
                              f"nodes, so it runs the source model instead; expected it beside "
                              f"the EPContext model as {sorted(filter(None, names))} in "
                              f"{str(folder)!r}")
    return str(found[0])


def tolerance(dtype: np.dtype, quantized: bool) -> str:
    """The tolerance :func:`ep.testing.compare.compare` applies to ``dtype`` by default."""
    if dtype.name in ("float16", "bfloat16"):
        return "1 ulp"
    if dtype.kind == "f":
        return "rtol 1e-4, atol 1e-5"
    if quantized and dtype.kind in "iu":
        return "1 quantization step"
    return "exact"


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _print_report(report: dict[str, Any], out: TextIO) -> None:
    if "trace" in report:
        print(report["trace"], file=out)
    print(f"model: {report['model']}", file=out)
    for name, o in report["outputs"].items():
        print(f"  output {name}: {o['dtype']}{o['shape']}", file=out)
    for part in report["partitions"]:
        print(f"  {part['name']:<10} {part['provider']:<26} {len(part['nodes']):>4} node(s)",
              file=out)
    for op, by_reason in report["declined"].items():
        for reason, nodes in by_reason.items():
            print(f"  declined {op} x{len(nodes)} ({', '.join(nodes)}): {reason}", file=out)
    for name, stats in report["runs"].items():
        print(f"{name}: {stats['cycles']:,} cycles = {stats['microseconds']:.1f} us simulated "
              f"over {len(stats.get('partitions', {}))} partition(s)", file=out)
        if stats["throughput_per_s"]:
            print(f"  throughput: {stats['throughput_per_s']:,.1f} inferences/s", file=out)
        busy = ", ".join(f"{engine} {100 * u:.0f}%" for engine, u in stats["utilization"].items())
        print(f"  utilization: {busy}", file=out)
        energy = stats.get("energy")
        if energy:
            print(f"  energy: {energy['total_pj'] / 1e6:,.2f} uJ (dynamic "
                  f"{energy['dynamic_pj'] / 1e6:,.2f}, leakage {energy['static_pj'] / 1e6:,.2f}), "
                  f"average {energy['average_power_w']:.2f} W, {energy['tops_per_w']:.3f} TOPS/W",
                  file=out)
        for part, figures in stats.get("partitions", {}).items():
            print(f"  {part}: {figures['cycles']:,} cycles = {figures['microseconds']:.1f} us",
                  file=out)
    for name, c in report.get("check", {}).items():
        verdict = "OK" if c["ok"] else f"MISMATCH: {c['problem']}"
        print(f"check {name} vs {c['reference']} (tolerance {c['tolerance']}): {verdict}",
              file=out)
