"""A fuzzing campaign: models ``start..start+count`` of a seed through worker processes.

Each worker is a ``python -m ep.testing.fuzz.worker`` process with an address-space limit; a
model that takes longer than ``timeout_s`` is a *hang* (the worker is killed and replaced), a
worker that dies is a *crash*; ``onnxruntime-hang`` / ``onnxruntime-crash`` when it happened in
onnxruntime's reference run (the worker reports each stage as it starts). Minimizing a failure
gets its own time budget; when it runs out the failure is kept unminimized. :func:`summarize`
and :func:`markdown` turn the results into the table ``python -m ep.testing.fuzz`` writes
(``results.json``, ``results.md``).
"""

from __future__ import annotations

import collections
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .run import OK


class _Worker:
    """One worker process and a line reader on its protocol pipe that honours timeouts."""

    def __init__(self, memory_mb: int, minimize_s: float, log: Path) -> None:
        self.args = [sys.executable, "-m", "ep.testing.fuzz.worker",
                     "--memory-mb", str(memory_mb), "--minimize-s", str(minimize_s)]
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.buffer = b""

    def start(self) -> None:
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, env=dict(os.environ))
        self.buffer = b""

    def send(self, job: dict) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, timeout_s: float) -> dict | str:
        """The next message, or ``"hang"`` / ``"crash"``."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                return "hang"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    code = self.proc.wait()
                    self.proc = None
                    return f"crash (exit status {code})"
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def run_campaign(seed: int, count: int, workers: int = 1, start: int = 0, out: Path | None = None,
                 timeout_s: float = 120.0, memory_mb: int = 4096, minimize: bool = True,
                 minimize_s: float = 90.0, max_nodes: int = 24) -> list[dict[str, Any]]:
    """Run models ``start..start+count-1`` of ``seed``; one result dict per model, in order."""
    log_dir = Path(out) if out else Path(os.environ.get("TMPDIR", "/tmp"))
    log_dir.mkdir(parents=True, exist_ok=True)
    jobs = collections.deque(range(start, start + count))
    results: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()

    def drive(k: int) -> None:
        worker = _Worker(memory_mb, minimize_s, log_dir / f"worker-{k}.log")
        try:
            while True:
                with lock:
                    if not jobs:
                        return
                    index = jobs.popleft()
                worker.send({"seed": seed, "index": index, "max_nodes": max_nodes,
                             "minimize": minimize})
                stage, msg = "generator", worker.read(timeout_s)
                while isinstance(msg, dict) and msg.get("phase") == "stage":
                    stage, msg = msg["stage"], worker.read(timeout_s)
                if isinstance(msg, str):
                    outcome = msg.split(" ")[0]
                    if stage == "onnxruntime":
                        outcome = f"onnxruntime-{outcome}"
                    results[index] = {"index": index, "outcome": outcome,
                                      "detail": f"{msg} while running {stage}"}
                    continue
                results[index] = msg
                if minimize and msg["outcome"] not in OK:
                    small = worker.read(minimize_s + 30)
                    if isinstance(small, dict):
                        msg["reproducer"], msg["reproducer_nodes"] = (small["reproducer"],
                                                                       small["nodes"])
        finally:
            worker.stop()

    threads = [threading.Thread(target=drive, args=(k,)) for k in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[i] for i in sorted(results)]


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per outcome, the share giving onnxruntime's result, the NPU's node share."""
    counts = collections.Counter(r["outcome"] for r in results)
    npu = sum(r.get("npu_nodes", 0) for r in results)
    nodes = sum(r.get("partitioned_nodes", 0) for r in results)
    classes = collections.Counter(_failure_class(r) for r in results if r["outcome"] not in OK)
    return {"models": len(results), "outcomes": dict(counts.most_common()),
            "onnxruntime_result": sum(counts[o] for o in OK),
            "npu_nodes": npu, "partitioned_nodes": nodes,
            "npu_share": round(npu / nodes, 4) if nodes else 0.0,
            "ops": len({op for r in results for op in r.get("ops", ())}),
            "basic_level_reference": sum("reference" in r for r in results),
            "failure_classes": dict(classes.most_common())}


def _failure_class(r: dict[str, Any]) -> str:
    if r["outcome"] == "different":
        tag = "amplified" if r.get("amplified") else "differs at"
        return f"different: {tag} {r.get('culprit', '?')}"
    detail = r.get("detail", "")
    head = detail.split(":")[0:4]
    return f"{r['outcome']}: {':'.join(head)[:80]}".replace("|", "/")


def markdown(summary: dict[str, Any], seed: int, start: int, seconds: float, workers: int) -> str:
    """The summary as the markdown table ``docs/conformance.md`` carries."""
    n = summary["models"]
    lines = [f"{n} models of seed {seed} (models {start}..{start + n - 1}), {summary['ops']} "
             f"operator types, {workers} worker(s), {seconds:.0f} s. Regenerate with "
             f"`python -m ep.testing.fuzz --seed {seed} --count {n} --workers {workers} "
             f"--out DIR --docs docs/conformance.md`.", "",
             "| outcome | models | share |", "|---|---|---|"]
    for outcome, k in summary["outcomes"].items():
        lines.append(f"| {outcome} | {k} | {100 * k / n:.1f}% |")
    ok = summary["onnxruntime_result"]
    lines += ["", f"onnxruntime's result (equal, or refused with the same error class): "
              f"**{ok} of {n} ({100 * ok / n:.1f}%)**. The NPU runs "
              f"**{summary['npu_nodes']} of {summary['partitioned_nodes']} non-Constant nodes "
              f"({100 * summary['npu_share']:.1f}%)** of the partitioned graphs."]
    if summary["basic_level_reference"]:
        lines += ["", f"{summary['basic_level_reference']} model(s) onnxruntime refuses at its "
                  "default optimization level (its own optimizer breaks them) are judged "
                  "against onnxruntime at the basic level, the one ep applies."]
    if summary["failure_classes"]:
        lines += ["", "| remaining failure class | models |", "|---|---|"]
        lines += [f"| {c} | {k} |" for c, k in summary["failure_classes"].items()]
    return "\n".join(lines) + "\n"
