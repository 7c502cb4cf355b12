"""A fuzzing worker process: ``python -m ep.testing.fuzz.worker --memory-mb M``.

Reads one JSON job a line on stdin (``{"seed": S, "index": I, "max_nodes": N, "minimize":
B}``), generates the model itself, runs it (:func:`ep.testing.fuzz.run.run_case`) and writes
``{"phase": "stage", "stage": "onnxruntime" | "ep"}`` as it goes and then
``{"phase": "result", ...}``; for a failure it then minimizes it and writes
``{"phase": "minimized", "reproducer": <ONNX text>}``. The protocol goes to the original
stdout only; anything else printed goes to stderr. The address space is limited with
``resource.setrlimit`` so a runaway allocation fails here instead of taking the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .build import feeds
from .generate import generate
from .minimize import minimize
from .run import OK, run_case


def feed_seed(seed: int, index: int) -> int:
    """The seed of model ``index``'s inputs in campaign ``seed``."""
    return seed * 1_000_003 + index


def optimized(index: int) -> bool:
    """Whether model ``index`` runs with onnxruntime's basic optimizations (four in five);
    the fifth shows the partitioner the graph as written."""
    return index % 5 != 4


def to_text(model) -> str:
    """The model in ONNX's textual syntax (``onnx.parser.parse_model`` reads it back)."""
    import onnx.printer

    return onnx.printer.to_text(model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ep.testing.fuzz.worker")
    parser.add_argument("--memory-mb", type=int, default=0)
    parser.add_argument("--minimize-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.memory_mb:
        import resource

        limit = args.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        job = json.loads(line)
        started = time.perf_counter()
        fs = feed_seed(job["seed"], job["index"])
        try:
            model = generate(job["seed"], job["index"], job.get("max_nodes", 24))
        except Exception as exc:  # noqa: BLE001 - a generator bug is reported, not fatal
            protocol.write(json.dumps({"index": job["index"], "phase": "result",
                                       "outcome": "generator-error", "detail": repr(exc)[:300],
                                       "feed_seed": fs}) + "\n")
            protocol.flush()
            continue
        optimize = optimized(job["index"])

        def stage(name: str, index: int = job["index"]) -> None:
            protocol.write(json.dumps({"index": index, "phase": "stage", "stage": name}) + "\n")
            protocol.flush()

        result = run_case(model, feeds(model, fs), optimize=optimize, progress=stage)
        result.update(index=job["index"], phase="result", feed_seed=fs,
                      ops=sorted({n.op_type for n in model.graph.node}),
                      seconds=round(time.perf_counter() - started, 3))
        protocol.write(json.dumps(result) + "\n")
        protocol.flush()
        if job.get("minimize") and result["outcome"] not in OK:
            small = minimize(model, fs, args.minimize_s, optimize=optimize)
            protocol.write(json.dumps({"index": job["index"], "phase": "minimized",
                                       "reproducer": to_text(small),
                                       "nodes": len(small.graph.node)}) + "\n")
            protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
