"""The code in README.md, docs/*.md and traces/README.md runs, so the docs cannot rot.

Each document's fenced blocks run in order, in one fresh temporary folder holding ``model.onnx``
(the bundled ``tiny_cnn``), the file every example starts from, and ``traces/``, a copy of the
sample traces (so a command that writes beside them writes into the copy, never the tree):

- a ```` ```python ```` block is executed in one namespace per document, so a block may use
  names and files an earlier block of the same document made; ``test_*`` functions a document
  defines (docs/testing.md's hypothesis test) are called once its blocks have run;
- in a ```` ```sh ```` block, every line that is an ``npu-sim`` command runs through
  ``ep.cli.main`` (the console script's entry point) and must exit 0; other lines (``pip``,
  ``pytest``, ``python -m venv``) are the install and CI steps ``.ci/run`` runs, and
  ``python -m ep.traces``, whose output tests/trace/test_samples.py checks;
- a block marked ```` ```python no-run ```` or ```` ```sh no-run ```` is not run: only for
  fragments that cannot (an excerpt of a source file, a Ray cluster); the text beside it says
  why, and the test counts them so they stay few.

Blocks without a language (formulas, layouts, sample output) are not code.
"""

from __future__ import annotations

import re
import shlex
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest

from ep.cli import main as npu_sim
from ep.framework import registry
from ep.models import tiny_cnn

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), TRACES / "README.md"]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.M | re.S)
SHELLS = ("sh", "bash")
NOT_CODE = ("text", "json", "toml", "csv")  # languages that are data, never run
SHELL_METACHARACTERS = set("|><;&$`*?")
MAX_NO_RUN = 4  # blocks opted out across every document; raising it needs a reason


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    language: str
    run: bool
    code: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line} ({self.language})"


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of ``doc`` with a language, in order (indented ones dedented)."""
    text = doc.read_text()
    found = []
    for match in FENCE.finditer(text):
        words = match["info"].split()
        if not words:
            continue
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(doc, line, words[0], "no-run" not in words[1:],
                           textwrap.dedent(match["body"])))
    return found


def npu_sim_commands(block: Block) -> list[list[str]]:
    """The ``npu-sim`` command lines of a shell block, continuation lines joined."""
    commands = []
    for line in block.code.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line.startswith("npu-sim "):
            continue
        odd = SHELL_METACHARACTERS & set(line)
        assert not odd, f"{block}: {line!r} uses shell syntax {sorted(odd)}; the docs test runs " \
                        "npu-sim lines as plain argument lists"
        commands.append(shlex.split(line)[1:])
    return commands


def run_block(block: Block, namespace: dict) -> None:
    if block.language == "python":
        exec(compile(block.code, f"{block.doc}:{block.line}", "exec"), namespace)  # noqa: S102
    elif block.language in SHELLS:
        for argv in npu_sim_commands(block):
            assert npu_sim(argv) == 0, f"{block}: npu-sim {shlex.join(argv)} failed"


def runnable(doc: Path) -> list[Block]:
    return [b for b in blocks(doc) if b.run and b.language in ("python", *SHELLS)]


@pytest.mark.parametrize("doc", [d for d in DOCS if runnable(d)],
                         ids=lambda d: str(d.relative_to(ROOT)))
def test_doc_examples_run(doc, tmp_path, monkeypatch):
    onnx.save(tiny_cnn(), tmp_path / "model.onnx")
    shutil.copytree(TRACES, tmp_path / "traces")
    monkeypatch.chdir(tmp_path)
    # A document may register a provider by name (writing_an_ep.md); it lasts for that test.
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    namespace: dict = {"__name__": f"docs_{doc.stem}"}
    for block in runnable(doc):
        run_block(block, namespace)
    for name, value in list(namespace.items()):
        if name.startswith("test_") and callable(value):
            value()


def test_every_block_is_code_or_data():
    """A misspelt language (```pyhton) would quietly leave a block unrun."""
    odd = [str(b) for doc in DOCS for b in blocks(doc)
           if b.language not in ("python", *SHELLS, *NOT_CODE)]
    assert not odd, f"blocks of unknown language: {odd}"


def test_few_blocks_opt_out():
    skipped = [str(b) for doc in DOCS for b in blocks(doc) if not b.run]
    assert len(skipped) <= MAX_NO_RUN, f"too many no-run blocks: {skipped}"


def test_readme_opens_with_the_commands_ci_runs():
    """.ci/run installs and runs exactly what the README's first block says."""
    first = blocks(ROOT / "README.md")[0]
    assert first.language == "sh" and first.run
    lines = first.code.splitlines()
    assert lines[0].endswith('pip install . && npu-sim run')
    assert lines[1].endswith('pip install ".[test]" && python -m pytest -q')


def test_the_ep_developer_example_runs_nodes_on_its_own_ep(tmp_path, monkeypatch):
    """docs/testing.md's EP is not a no-op that leaves everything to the CPU."""
    from onnx import TensorProto, helper

    import ep

    namespace: dict = {"__name__": "docs_testing"}
    monkeypatch.chdir(tmp_path)
    for block in blocks(ROOT / "docs" / "testing.md"):
        if block.run and block.language == "python":
            run_block(block, namespace)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="r"),
         helper.make_node("Softplus", ["r"], ["y"], name="s")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ep.InferenceSession(model.SerializeToString(), providers=[
        namespace["MyExecutionProvider"](), "CPUExecutionProvider"])
    assert session.get_node_assignment() == {"r": "MyExecutionProvider",
                                             "s": "CPUExecutionProvider"}
