"""A context binary file whose weights were checked whole is not read again while its status is
unchanged and settled (``ep/npusim/verified_files.py``); any change to the file is checked.

Real files on the real file system. The clock the reader compares file times with is moved
forward in some tests (``later``) instead of sleeping past the margin.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ep
from ep.errors import InvalidArgument, InvalidGraph
from ep.npusim import binary_reader, verified_files
from ep.npusim.binary import ContextBinary
from ep.npusim.verified_files import (
    COARSE_MARGIN_NS,
    FINE_MARGIN_NS,
    VERIFIED,
    FileIdentity,
    VerifiedFiles,
    margin,
)
from tests.ep.test_binary_blocks import LARGE, packed, sections
from tests.ep.test_epcontext_load import gen_options
from tests.ep.test_session import X, mixed_model
from tests.threads import run_together

NPU = "NpuSimExecutionProvider"
DATA = packed(LARGE)
WEIGHTS_AT = sections(DATA)["weights"][1].offset


@pytest.fixture(autouse=True)
def fresh_record():
    VERIFIED.clear()
    yield
    VERIFIED.clear()


@pytest.fixture
def checks(monkeypatch):
    """How many times a binary's weight blocks were checked."""
    made = []
    real = binary_reader.BlockChecks

    def counted(*args):
        made.append(1)
        return real(*args)

    monkeypatch.setattr(binary_reader, "BlockChecks", counted)
    return made


@pytest.fixture
def later(monkeypatch):
    """Move the reader's clock ``seconds`` ahead of the real one (a call per move)."""
    ahead = [0]
    real = binary_reader.time.time_ns

    class Clock:
        @staticmethod
        def time_ns() -> int:
            return real() + ahead[0]

    monkeypatch.setattr(binary_reader, "time", Clock)

    def move(seconds: float) -> None:
        ahead[0] += int(seconds * 1e9)

    return move


def load(path) -> None:
    ContextBinary.open(path).close()


def corrupted(data: bytes, at: int = 0) -> bytes:
    out = bytearray(data)
    out[WEIGHTS_AT + at] ^= 0x40
    return bytes(out)


def test_a_settled_file_checked_whole_is_not_read_again(tmp_path, checks, later):
    path = tmp_path / "m.bin"
    path.write_bytes(DATA)
    later(1)
    load(path)
    load(path)
    load(path)
    assert len(checks) == 1
    assert VERIFIED.skipped == 2


def test_a_file_whose_times_are_recent_is_checked_on_every_load(tmp_path, checks):
    path = tmp_path / "m.bin"
    path.write_bytes(DATA)
    load(path)
    load(path)
    assert len(checks) == 2  # written just now: a write in the same clock tick keeps its times


def test_a_recent_file_is_trusted_once_a_check_happened_after_its_times_settled(
        tmp_path, checks, later):
    path = tmp_path / "m.bin"
    path.write_bytes(DATA)
    load(path)  # recent: recorded, not trusted
    later(1)
    load(path)  # checked again, now settled
    load(path)
    assert len(checks) == 2


@pytest.mark.parametrize("how", ["rewritten", "in place", "replaced by rename"])
def test_a_file_changed_after_it_was_trusted_is_checked_and_refused(tmp_path, checks, later,
                                                                     how):
    path = tmp_path / "m.bin"
    path.write_bytes(DATA)
    later(1)
    load(path)
    load(path)
    if how == "rewritten":
        path.write_bytes(corrupted(DATA))
    elif how == "in place":
        with open(path, "r+b") as f:
            f.seek(WEIGHTS_AT)
            f.write(bytes([DATA[WEIGHTS_AT] ^ 0x40]))
    else:
        other = tmp_path / "other.bin"
        other.write_bytes(corrupted(DATA))
        os.replace(other, path)
    with pytest.raises(InvalidGraph, match="checksum mismatch in section"):
        load(path)
    later(1)  # settled or not, a failed check is never recorded
    with pytest.raises(InvalidGraph, match="checksum mismatch in section"):
        load(path)
    assert len(checks) == 3


def test_a_file_whose_check_failed_is_checked_again(tmp_path, checks, later):
    path = tmp_path / "m.bin"
    path.write_bytes(corrupted(DATA))
    later(1)
    for _ in range(2):
        with pytest.raises(InvalidGraph, match="checksum mismatch"):
            load(path)
    assert len(checks) == 2 and len(VERIFIED) == 0


def test_a_deferred_check_is_recorded_only_once_waited_for(tmp_path, checks, later):
    path = tmp_path / "m.bin"
    path.write_bytes(DATA)
    later(1)
    binary = ContextBinary.open(path, defer_weights=True)
    assert len(VERIFIED) == 0
    binary.verify_weights()
    assert len(VERIFIED) == 1
    binary.close()
    load(path)
    assert len(checks) == 1


def test_a_trusted_file_still_has_its_metadata_checked(tmp_path, later):
    path = tmp_path / "m.bin"
    path.write_bytes(DATA)
    later(1)
    load(path)
    data = bytearray(DATA)
    data[8] ^= 1  # a header byte: the file changes, and is refused whatever the record says
    path.write_bytes(bytes(data))
    later(1)
    with pytest.raises(InvalidGraph):
        load(path)


def test_threads_loading_one_file_check_it_at_most_once_each(tmp_path, checks, later):
    """Four real threads loading the same settled file: every load succeeds, and the file is
    checked by at most one load per thread (those that began before any check ended)."""
    path = tmp_path / "m.bin"
    path.write_bytes(DATA)
    later(1)

    def loads(_: int) -> None:
        for _ in range(10):
            load(path)

    run_together(loads, 4)
    assert 1 <= len(checks) <= 4 and VERIFIED.skipped == 40 - len(checks)


def _ctx_model(folder) -> str:
    onnx.save(mixed_model(), folder / "m.onnx")
    ep.InferenceSession(str(folder / "m.onnx"), gen_options())
    return str(folder / "m_ctx.onnx")


@pytest.mark.parametrize(("option", "checked"), [(None, 1), ("changed", 1), ("always", 3)])
def test_the_provider_option_weight_checks(tmp_path, checks, later, option, checked):
    """Sessions of one EPContext model: its binary is checked once by default, on every load
    with ``weight_checks=always``; the outputs are the same either way."""
    ctx = _ctx_model(tmp_path)
    later(1)
    options = {} if option is None else {"weight_checks": option}
    outputs = [ep.InferenceSession(ctx, providers=[(NPU, options)]).run(None, {"x": X})[0]
               for _ in range(3)]
    assert len(checks) == checked
    for got in outputs[1:]:
        np.testing.assert_array_equal(got, outputs[0])


def test_a_bad_weight_checks_option_names_the_valid_ones(tmp_path):
    ctx = _ctx_model(tmp_path)
    with pytest.raises(InvalidArgument, match=r"weight_checks='sometimes'; valid: changed, always"):
        ep.InferenceSession(ctx, providers=[(NPU, {"weight_checks": "sometimes"})])


def test_without_status_change_times_every_load_checks(tmp_path, checks, later, monkeypatch):
    monkeypatch.setattr(verified_files, "STATUS_CHANGE_TIMES", False)  # Windows' st_ctime
    path = tmp_path / "m.bin"
    path.write_bytes(DATA)
    later(1)
    for _ in range(3):
        load(path)
    assert len(checks) == 3


def test_weights_given_as_bytes_are_checked_on_every_load(checks):
    for _ in range(2):
        ContextBinary.from_bytes(DATA).close()
    assert len(checks) == 2 and len(VERIFIED) == 0


def test_the_margin_is_two_seconds_for_whole_second_times():
    fine = FileIdentity(1, 2, 3, 1_700_000_000_123_456_789, 1_700_000_000_123_456_789)
    coarse = FileIdentity(1, 2, 3, 1_700_000_000_000_000_000, 1_700_000_001_000_000_000)
    assert margin(fine) == FINE_MARGIN_NS and margin(coarse) == COARSE_MARGIN_NS
    assert fine.settled(fine.ctime_ns + FINE_MARGIN_NS + 1)
    assert not fine.settled(fine.ctime_ns + FINE_MARGIN_NS)
    assert not coarse.settled(coarse.ctime_ns + FINE_MARGIN_NS + 1)
    assert coarse.settled(coarse.ctime_ns + COARSE_MARGIN_NS + 1)
    late_mtime = fine._replace(mtime_ns=fine.ctime_ns + 10**9)  # either time counts
    assert not late_mtime.settled(fine.ctime_ns + FINE_MARGIN_NS + 1)


def test_the_record_is_bounded_and_keeps_the_latest_clock():
    record = VerifiedFiles(entries=2)
    ids = [FileIdentity(1, i, 3, 10, 10) for i in range(3)]
    record.record(ids[0], 5)  # checked before its times settled
    assert not record.trusted(ids[0])
    record.record(ids[0], 10 + FINE_MARGIN_NS + 1)
    record.record(ids[0], 7)  # an older clock does not unsettle it
    assert record.trusted(ids[0])
    record.record(ids[1], 10**12)
    record.trusted(ids[0])  # used: ids[1] is now the least recently used
    record.record(ids[2], 10**12)
    assert len(record) == 2 and record.trusted(ids[0]) and not record.trusted(ids[1])


ACTIONS = st.lists(st.sampled_from(["load", "corrupt", "restore", "settle"]), min_size=1,
                   max_size=12)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=ACTIONS, at=st.integers(0, 3 * 4096))
def test_a_load_succeeds_exactly_when_the_files_weights_are_intact(tmp_path, later, actions,
                                                                    at):
    """Whatever sequence of rewrites, loads and waits: the record never changes a load's
    outcome from what checking every block would give."""
    VERIFIED.clear()
    path = tmp_path / "p.bin"
    path.write_bytes(DATA)
    intact = True
    for action in actions:
        if action == "corrupt":
            path.write_bytes(corrupted(DATA, at))
            intact = False
        elif action == "restore":
            path.write_bytes(DATA)
            intact = True
        elif action == "settle":
            later(1)
        elif intact:
            load(path)
        else:
            with pytest.raises(InvalidGraph, match="checksum mismatch"):
                load(path)


def test_a_forked_child_starts_with_an_empty_record():
    record = VerifiedFiles()
    record.record(FileIdentity(1, 2, 3, 4, 5), 10**12)
    record.trusted(FileIdentity(1, 2, 3, 4, 5))
    record.reset_after_fork()
    assert len(record) == 0 and record.skipped == 0 and verified_files.VERIFIED is VERIFIED
