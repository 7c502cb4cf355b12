"""Writing EPContext files: OS failures are Fail with nothing left behind, and what a writer
killed mid-generation left is removed by the next generation into that folder."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx
import pytest

import ep
from ep.framework.files import atomic_write, remove_stale_temporaries, temp_prefix
from tests.ep.test_epcontext_load import gen_options, npu_cpu_model


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return int(child.stdout)


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EACCES", "EROFS"])
def test_an_os_error_while_generating_is_fail_with_nothing_left(tmp_path: Path, monkeypatch,
                                                                 errno_name: str) -> None:
    import errno
    onnx.save(npu_cpu_model(), tmp_path / "m.onnx")
    code = getattr(errno, errno_name)

    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(ep.Fail, match=os.strerror(code)):
        ep.InferenceSession(str(tmp_path / "m.onnx"), gen_options())
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    pid = dead_pid()
    stale_file = tmp_path / f".m_ctx.onnx.npusim-{pid}-abc123.tmp"
    stale_dir = tmp_path / f".npusim-{pid}-xyz"
    live = tmp_path / f"{temp_prefix('m_npusim.bin')}keep.tmp"
    stale_file.write_bytes(b"half a model")
    stale_dir.mkdir()
    (stale_dir / "model_ctx.onnx").write_bytes(b"x")
    live.write_bytes(b"being written by this process")
    onnx.save(npu_cpu_model(), tmp_path / "m.onnx")
    ep.InferenceSession(str(tmp_path / "m.onnx"), gen_options())
    assert not stale_file.exists() and not stale_dir.exists()
    assert live.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "m.onnx", "m_ctx.onnx", "m_npusim.bin"]
    assert remove_stale_temporaries(tmp_path) == []


def test_a_killed_writer_leaves_a_temporary_the_next_generation_removes(tmp_path: Path) -> None:
    """A real kill -9 in the middle of atomic_write."""
    script = (f"import os, signal, sys; sys.path[:0] = {sys.path!r}\n"
              "from ep.framework.files import atomic_write\n"
              "def chunks():\n"
              "    yield b'x' * 1024\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n"
              f"atomic_write({str(tmp_path / 'm_ctx.onnx')!r}, chunks())\n")
    result = subprocess.run([sys.executable, "-c", script])
    assert result.returncode == -9
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".m_ctx.onnx.npusim-")
    assert remove_stale_temporaries(tmp_path) == left
    assert list(tmp_path.iterdir()) == []
    atomic_write(tmp_path / "after", [b"ok"])
    assert (tmp_path / "after").read_bytes() == b"ok"
