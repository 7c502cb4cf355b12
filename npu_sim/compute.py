"""Compute cores: where kernels run. Values come from kernels, cycles from the cost model.

The device has ``config.cores`` cores (scope ``npu.coreN``), each a simpy resource. A launch
(:meth:`Compute.execute`) names the op, its input and output tensors (an HBM address and a
:class:`~npu_sim.dtypes.TensorSpec` each) and the cores to run on. It

1. waits for its ``deps``, then acquires every requested core (in ascending order, so two
   launches can never deadlock over cores);
2. prices the launch: with the kernel's own ``cycles(config, in_specs, out_specs, attrs,
   cores=n)`` if it registered one, else with :func:`npu_sim.cost.op_cost`; either returns a
   cost with ``total_cycles`` (and optionally ``macs``);
3. in functional mode, hands the kernel its inputs as read-only views of HBM (no copy; a kernel
   that tries to write its inputs fails), calls the kernel's values function and checks every
   output against its spec (an output that shares memory with an input is copied at once, so
   it is a snapshot of what the kernel computed);
4. holds the cores for ``total_cycles``, then writes the outputs to HBM and releases the cores.

A cost may carry ``energy`` (picojoules by component, :mod:`npu_sim.cost.energy`): the trace
record's work holds it as ``work["energy"]``, and the dynamic components (all but ``leakage``,
which the runtime charges to every core for the whole run) add to the counters
``compute.energy_fj.<component>`` and ``core.<i>.energy_fj`` (split evenly over the launch's
cores).

The two halves never meet: the kernel never sees the clock and the cost never sees data. In
timing-only mode (``functional=False``) no tensor byte is read or written. Whatever goes
wrong inside a kernel or its pricing fails the launch with a
:class:`~npu_sim.errors.KernelError`; the cores are released and nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import simpy

from . import dtypes
from .config import DeviceConfig
from .cost.energy import DYNAMIC, femtojoules
from .dtypes import TensorSpec
from .errors import KernelError, NpuSimError
from .hbm import Hbm
from .trace.recorder import TraceRecorder, record_ids, tag

Operand = tuple[int, TensorSpec]


class Compute:
    """The compute cores of one device and the dispatch of kernel launches onto them."""

    def __init__(self, env: simpy.Environment, config: DeviceConfig, hbm: Hbm,
                 trace: TraceRecorder) -> None:
        self.env = env
        self.config = config
        self.hbm = hbm
        self.trace = trace
        self.cores = [simpy.Resource(env, 1) for _ in range(config.cores)]
        self.reset_stats()

    def reset_stats(self) -> None:
        """Zero every counter."""
        self._stats: dict[str, float] = {"compute.kernels": 0, "compute.macs": 0}
        for name in DYNAMIC:
            self._stats[f"compute.energy_fj.{name}"] = 0
        for i in range(self.config.cores):
            self._stats[f"core.{i}.busy_cycles"] = 0
            self._stats[f"core.{i}.energy_fj"] = 0

    def stats(self) -> dict[str, float]:
        """Counters: kernels run, MACs (when the cost reports them), busy cycles per core, and
        dynamic energy (picojoules) by component and per core."""
        return dict(self._stats)

    def execute(self, op: str, inputs: Sequence[Operand | None], outputs: Sequence[Operand],
                attrs: Mapping[str, Any], *, cores: Sequence[int], node: str = "",
                functional: bool = True, deps: Sequence[simpy.Event] = ()) -> simpy.Process:
        """Launch ``op`` on ``cores``; the returned process ends when the outputs are written.

        Bad core indices, an unknown op or (in functional mode) an operand outside a live
        allocation raise at once; kernel failures fail the returned process with KernelError.
        """
        from .kernels.registry import lookup

        cores = tuple(cores)
        if not cores or len(set(cores)) != len(cores) or not all(
                isinstance(c, int) and 0 <= c < self.config.cores for c in cores):
            raise KernelError(op, node, f"cores={list(cores)}: expected distinct core indices "
                                        f"in [0, {self.config.cores})")
        kern = lookup(op, node)
        if len(outputs) == 0 or any(o is None for o in outputs):
            raise KernelError(op, node, "every launch needs at least one output, none omitted")
        if functional:
            for operand in [*inputs, *outputs]:
                if operand is not None and operand[1].nbytes:
                    try:
                        self.hbm.locate(operand[0], operand[1].nbytes)
                    except NpuSimError as exc:
                        raise KernelError(op, node, f"operand {operand[1]}: {exc}") from None
        return self.env.process(self._run(kern, op, list(inputs), list(outputs), dict(attrs),
                                          tuple(sorted(cores)), node, functional, tuple(deps)))

    def _run(self, kern, op, inputs, outputs, attrs, cores, node, functional, deps):
        submit = self.env.now
        if deps:
            yield simpy.AllOf(self.env, deps)
        ready = self.env.now
        in_specs = [None if x is None else x[1] for x in inputs]
        out_specs = [spec for _, spec in outputs]
        requests = [self.cores[c].request() for c in cores]
        try:
            for req in requests:
                yield req
            start = self.env.now
            cost = price(self.config, kern, op, node, in_specs, out_specs, attrs, len(cores))
            results = self._values(kern, op, node, inputs, outputs, attrs) if functional else ()
            yield self.env.timeout(cost.total_cycles)
        finally:
            for c, req in zip(cores, requests, strict=True):
                req.cancel()  # withdraws a request still waiting; no-op once granted
                self.cores[c].release(req)
        for (address, _), value in zip(outputs, results, strict=functional):
            self.hbm.write(address, value)
        end = self.env.now
        macs = int(getattr(cost, "macs", 0) or 0)
        self._stats["compute.kernels"] += 1
        self._stats["compute.macs"] += macs
        energy = {k: float(v) for k, v in (getattr(cost, "energy", None) or {}).items()}
        dynamic = 0.0
        for name in DYNAMIC:
            dynamic += energy.get(name, 0.0)
            self._stats[f"compute.energy_fj.{name}"] += femtojoules(energy.get(name, 0.0))
        for c in cores:
            self._stats[f"core.{c}.busy_cycles"] += end - start
            self._stats[f"core.{c}.energy_fj"] += femtojoules(dynamic / len(cores))
        work = {
            "op": op, "node": node, "cores": len(cores), "core_ids": list(cores), "macs": macs,
            "attrs": attrs, "unit": getattr(cost, "engine", "array"),
            "hbm_bytes": int(getattr(cost, "hbm_bytes", 0) or 0),
            "inputs": [None if s is None else [list(s.shape), s.dtype] for s in in_specs],
            "outputs": [[list(s.shape), s.dtype] for s in out_specs],
            "bytes": sum(s.nbytes for s in [*in_specs, *out_specs] if s is not None),
            "reads": [[a, s.nbytes] for a, s in (x for x in inputs if x is not None)],
            "writes": [[a, s.nbytes] for a, s in outputs],
        }
        if energy:
            work["energy"] = energy
        rid = self.trace.record("kernel", f"core{cores[0]}", f"npu.core{cores[0]}",
                                node or op, start, end, record_ids(deps), work,
                                submit=submit, ready=ready)
        tag(self.env.active_process, rid)
        return rid

    def _values(self, kern, op, node, inputs, outputs, attrs) -> list[np.ndarray]:
        try:
            arrays = [None if x is None else self._load(*x) for x in inputs]
        except NpuSimError as exc:  # an input was freed after the launch was accepted
            raise KernelError(op, node, f"cannot read inputs: {exc}") from exc
        try:
            results = list(kern.values(arrays, attrs))
        except KernelError:
            raise
        except Exception as exc:  # any kernel failure is a typed error naming the launch
            raise KernelError(op, node, f"kernel raised {exc!r}") from exc
        if len(results) < len(outputs):
            raise KernelError(op, node, f"expected {len(outputs)} outputs, got {len(results)}")
        # A node may omit trailing optional outputs (MaxPool's Indices) its kernel computes.
        results = results[:len(outputs)]
        checked = []
        for i, ((_, spec), value) in enumerate(zip(outputs, results, strict=True)):
            want = dtypes.to_numpy(spec.dtype)
            got_shape = getattr(value, "shape", None)
            got_dtype = getattr(value, "dtype", None)
            if got_shape != spec.shape or got_dtype != want:
                raise KernelError(op, node, f"output {i}: expected shape {spec.shape} dtype "
                                            f"{spec.dtype}, got shape {got_shape} dtype "
                                            f"{got_dtype}")
            # The write to HBM comes cycles later; a result that is (a view of) an input must not
            # change in between, nor alias the memory it is written to.
            if any(a is not None and np.may_share_memory(value, a) for a in arrays):
                value = value.copy()
            checked.append(np.require(value, requirements="C"))  # 0-d stays 0-d
        return checked

    def _load(self, address: int, spec: TensorSpec) -> np.ndarray:
        """A read-only view of the operand's bytes in HBM, of its spec's shape and dtype."""
        raw = self.hbm.peek(address, spec.nbytes) if spec.nbytes else np.zeros(0, np.uint8)
        array = raw.view(dtypes.to_numpy(spec.dtype)).reshape(spec.shape)
        array.flags.writeable = False
        return array


def price(config: DeviceConfig, kern: Any, op: str, node: str,
          in_specs: Sequence[TensorSpec | None], out_specs: Sequence[TensorSpec],
          attrs: Mapping[str, Any], ncores: int) -> Any:
    """The cost of one launch of ``op`` on ``ncores`` cores: the kernel's own ``cycles`` if it
    registered one (``kern`` from :func:`npu_sim.kernels.registry.lookup`), else
    :func:`npu_sim.cost.op_cost`. Any failure is a :class:`KernelError` naming the launch.
    Trace replay prices recorded launches under another config with this same function."""
    try:
        if kern.cycles is not None:
            cost = kern.cycles(config, in_specs, out_specs, attrs, cores=ncores)
        else:
            from .cost import op_cost

            cost = op_cost(config, op, in_specs, out_specs, attrs, cores=ncores)
    except NpuSimError as exc:
        raise KernelError(op, node, f"cannot price the launch: {exc}") from exc
    except Exception as exc:  # a cost function bug must not escape as a raw traceback
        raise KernelError(op, node, f"cost function raised {exc!r}") from exc
    cycles = getattr(cost, "total_cycles", None)
    if isinstance(cycles, bool) or not isinstance(cycles, (int, np.integer)) or cycles < 0:
        raise KernelError(op, node, f"cost total_cycles={cycles!r}; expected an int >= 0")
    return cost
