"""Weights at LLM scale: the prefill graph of the decoder transformer (``ep.models_decoder``) with
float16 weights, ratios measured in one run.

1. **Compile time vs layers**: the model at ``--layers`` counts (default 3, 6 and 12 layers of
   width 2048: about 0.28, 0.56 and 1.13 GiB of float16 weights) compiled to an EPContext model
   (embed mode 0); seconds per GiB of weights at each size (linear growth: the same figure).
2. **Context binary size**: the binary of the largest model against its weight bytes (target:
   at most weights + 1%).
3. **Loading the context** (the largest model, embed mode 0), each in a fresh process so its
   peak RSS is its own: reading the binary file once (the reference), opening it
   (``ContextBinary.open``: map, verify every checksum, decode the records), and creating the
   session from the ``_ctx.onnx`` (open + place the programs; the weight uploads are streamed)
   until every weight has landed in the simulated device's HBM, which holds real bytes.
   Targets: loading at most 2x the read; peak RSS at most 1.2x the weights.
   The ``rss`` figures are the child's peak minus its RSS after the imports (python,
   onnxruntime, numba: the same in every child).

Run: ``python bench/bench_weights.py [--layers 3 6 12] [--dim 2048] [--keep] [--quick] [--json]``.
Needs about 4 GiB of memory and 5 GiB of disk (a temporary folder, removed unless ``--keep``);
``--quick``: 1 and 2 layers of width 512.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import Figure, at_most, bench_main, info

GIB = 1 << 30
QUICK = ["--layers", "1", "2", "--dim", "512"]


def _rss() -> int:
    """This process's peak RSS in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def stage_build(folder: str, layers: int, dim: int) -> dict:
    """Write the prefill model; its float16 weight bytes."""
    import onnx

    from ep.models_decoder import DecoderSpec, prefill, weights

    spec = DecoderSpec(vocab=256, dim=dim, heads=dim // 128, layers=layers, prompt=16, cache=32,
                       weight_dtype="float16")
    nbytes = sum(v.nbytes for v in weights(spec).values())
    onnx.save(prefill(spec), Path(folder) / "prefill.onnx")
    return {"weights": nbytes}


def stage_compile(folder: str) -> dict:
    """Compile to an EPContext model (embed mode 0); seconds and binary size."""
    import ep

    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    start = time.perf_counter()
    ep.InferenceSession(str(Path(folder) / "prefill.onnx"), so,
                        providers=["NpuSimExecutionProvider"])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "binary": (Path(folder) / "prefill_npusim.bin").stat().st_size}


def stage_read(folder: str) -> dict:
    """Read the binary once, 64 MiB at a time."""
    path = Path(folder) / "prefill_npusim.bin"
    buf = bytearray(64 << 20)
    buf[::4096] = bytes(len(buf) // 4096)  # touch it: its pages are not the read's cost
    base = _current_rss()
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return {"seconds": time.perf_counter() - start, "rss": _rss() - base}


def stage_open(folder: str) -> dict:
    """``ContextBinary.open`` and every program (weights as views into the mapping)."""
    from ep.npusim.binary import ContextBinary

    base = _current_rss()
    start = time.perf_counter()
    binary = ContextBinary.open(Path(folder) / "prefill_npusim.bin")
    programs = binary.programs()
    seconds = time.perf_counter() - start
    assert programs
    return {"seconds": seconds, "rss": _rss() - base}


def stage_session(folder: str) -> dict:
    """An InferenceSession from the EPContext model (open the binary, place the programs, start
    the weight uploads), then every upload landed in the simulated HBM (real bytes)."""
    import ep

    base = _current_rss()
    start = time.perf_counter()
    session = ep.InferenceSession(str(Path(folder) / "prefill_ctx.onnx"),
                                  providers=["NpuSimExecutionProvider"])
    created = time.perf_counter() - start
    runtime = session._providers[0].runtime
    runtime.device.synchronize()  # the streamed uploads land
    seconds = time.perf_counter() - start
    stats = runtime.firmware.stats()
    return {"created": created, "seconds": seconds, "rss": _rss() - base,
            "hbm_weights": stats["hbm.weights.bytes"], "h2d": stats["dma.h2d.bytes"],
            "cycles": runtime.device.now}


STAGES = {"build": stage_build, "compile": stage_compile, "read": stage_read,
          "open": stage_open, "session": stage_session}


def child(stage: str, *args: object) -> dict:
    """Run one stage in a fresh process; its JSON result."""
    # Import what every stage imports before the stage measures its own RSS baseline.
    out = subprocess.run([sys.executable, __file__, "--stage", stage, *map(str, args)],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"stage {stage} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[3, 6, 12])
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    p.add_argument("--stage", help=argparse.SUPPRESS)
    p.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    return p


def measure(ns: argparse.Namespace) -> list[Figure]:
    root = Path(tempfile.mkdtemp(prefix="bench_weights_"))
    try:
        rows = []
        for layers in ns.layers:
            folder = root / f"L{layers}"
            folder.mkdir()
            built = child("build", folder, layers, ns.dim)
            compiled = child("compile", folder)
            rows.append((layers, built["weights"], compiled))
            gib = built["weights"] / GIB
            print(f"compile {layers:3d} layers, {gib:6.3f} GiB of float16 weights: "
                  f"{compiled['seconds']:7.2f} s = {compiled['seconds'] / gib:6.2f} s/GiB; "
                  f"binary {compiled['binary'] / built['weights']:.4f}x the weights")
            if layers != ns.layers[-1]:
                shutil.rmtree(folder)
        per_gib = [c["seconds"] / (w / GIB) for _, w, c in rows]
        print(f"compile time linearity: s/GiB from {min(per_gib):.2f} to {max(per_gib):.2f} "
              f"(largest/smallest {max(per_gib) / min(per_gib):.2f}x)")
        layers, nbytes, compiled = rows[-1]
        folder = root / f"L{layers}"
        print(f"binary size: {compiled['binary'] / nbytes:.4f}x the weights (target <= 1.01)")
        child("read", folder)  # warm the page cache: every figure below reads cached pages
        read = child("read", folder)
        opened = child("open", folder)
        session = child("session", folder)
        print(f"read the binary once: {read['seconds']:.3f} s")
        print(f"ContextBinary.open: {opened['seconds']:.3f} s = "
              f"{opened['seconds'] / read['seconds']:.2f}x the read (target <= 2); "
              f"peak RSS +{opened['rss'] / nbytes:.2f}x the weights (target <= 1.2)")
        print(f"session from the _ctx.onnx: created in {session['created']:.3f} s "
              f"({session['created'] / read['seconds']:.2f}x the read), weights in HBM after "
              f"{session['seconds']:.3f} s ({session['seconds'] / read['seconds']:.2f}x the "
              f"read; {session['h2d'] / nbytes:.4f}x the weights moved by DMA in "
              f"{session['cycles']} simulated cycles); peak RSS +{session['rss'] / nbytes:.2f}x "
              f"the weights (target <= 1.2); hbm.weights.bytes "
              f"{session['hbm_weights'] / nbytes:.4f}x the weights")
    finally:
        if ns.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return [info("weights", "compile s/GiB: largest / smallest model", max(per_gib) / min(per_gib)),
            at_most("weights", "context binary / weight bytes", compiled["binary"] / nbytes, 1.01),
            at_most("weights", "ContextBinary.open / reading the file",
                    opened["seconds"] / read["seconds"], 2.0),
            at_most("weights", "ContextBinary.open peak RSS / weight bytes",
                    opened["rss"] / nbytes, 1.2),
            info("weights", "session created / reading the file",
                 session["created"] / read["seconds"]),
            info("weights", "weights in HBM / reading the file",
                 session["seconds"] / read["seconds"]),
            at_most("weights", "session peak RSS / weight bytes", session["rss"] / nbytes, 1.2)]


def main() -> None:
    ns = parser().parse_known_args()[0]
    if ns.stage:
        import ep  # noqa: F401  (the baseline RSS includes the imports)

        args = [int(a) if a.isdigit() else a for a in ns.args]
        print(json.dumps(STAGES[ns.stage](*args)))
        return
    bench_main(parser(), measure, QUICK)


if __name__ == "__main__":
    main()
