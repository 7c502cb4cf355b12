"""Splitting one kernel launch over the host's cores with a single low-latency handoff.

A mobile net's large launches (a 1x1 convolution with its bias and SiLU, a depthwise
convolution) take 0.3-2.5 ms on one core; onnxruntime runs them on both. Handing half of such a
launch to a :class:`~concurrent.futures.ThreadPoolExecutor` and waiting on the future costs
about 60-100 us per launch in this VM (a futex wakeup of a sleeping vCPU each way), which eats
the gain on all but the largest launches. :func:`split` does better:

- the calling thread runs parts itself, so there is one handoff (to the helper threads), not two;
- parts are claimed from an atomic counter, so a caller whose helper has not woken yet (the
  other core busy with another process) takes the helper's parts too instead of waiting for it:
  the split never makes a launch much slower than running it whole;
- after a job a helper spins on the job counter for :data:`SPIN_SECONDS` (0.5 ms,
  ``pause`` between reads, the GIL released, in compiled code) before it blocks, so the next
  large launch of the same run finds it awake: a handoff then costs a few microseconds;
- on a busy host (another process running, or helpers that come late) splits run on the caller
  and the helpers stop spinning for a while (:data:`LATE`).
- a launch run many times (a prepared kernel) goes through a :class:`Choice`, which times it
  split and whole in its first runs and keeps the faster way;
- a part that is native code (:func:`split_native`: an address and a record, a numba
  ``cfunc``) is run by a spinning helper from its compiled spin loop, without the GIL at all.

Each part is a range of output elements computed with exactly the arithmetic of the unsplit
launch, so the values are the same bits whichever thread computes which part. A part must
release the GIL for the split to gain (numpy's BLAS calls and ufuncs do, and so do the nogil
numba loops). A call made while another split runs (another session's thread, or a part that
itself splits) runs its parts serially on its own thread.

Measured on 2 vCPUs (AMD EPYC Zen 4), handing an empty job to the helper and waiting for it:
ThreadPoolExecutor submit + result 59-93 us; a helper blocked on a condition 43 us; a helper
still spinning 4-22 us.

What still costs a Python part is the GIL between its calls (native parts pay none of it):
a thread that asks for it while the other holds it sleeps on CPython's condition variable, and
waking it costs 10-40 us here. Timed
inside a split 1x1 convolution of 16 to 72 channels (56x56, Relu), the helper's part started
12-44 us after the post, and the two GEMM halves took 47-53 and 56-88 us against about 70 us
for the whole (a GEMM of 16-long rows streams and packs the whole input in each part). So a
split gains only on launches of a few hundred microseconds and more, with few calls per part;
eight parts of four calls each measured 2.3 against 1.6 ms whole. Making the caller wait in
compiled code until the helper had claimed its part (so the helper took a free GIL) measured no
better. With the other core kept busy by a spinning process, the split launches measured from
10% slower to 1.3x faster than whole (a busy core never made them collapse).
"""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

MAX_THREADS = 4
"""The most threads a launch is split over: more parts than this gained nothing measurable
and each part's calls queue for the GIL (eight parts measured slower than two)."""


def _cgroup_cpus() -> float | None:
    """The CPUs a cgroup v2 quota (``cpu.max``) allows this process, or None without one."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else max(1.0, int(quota) / int(period))
    except (OSError, ValueError):
        return None


def usable_threads(affinity: int, quota: float | None) -> int:
    """Threads worth splitting over: one per CPU of the ``affinity`` mask, no more than a
    cgroup CPU ``quota`` allows (whole CPUs), at most :data:`MAX_THREADS`, at least one."""
    return max(1, min(affinity, int(quota or affinity), MAX_THREADS))


_AFFINITY = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
    (os.cpu_count() or 1)
_QUOTA = _cgroup_cpus()
#: Threads that run parts: the caller and ``THREADS - 1`` helpers (:func:`usable_threads`).
THREADS = usable_threads(_AFFINITY, _QUOTA)
#: Whether the host's running-task count (``/proc/loadavg``) speaks for this process's CPUs:
#: only when it may use every CPU of the host, without a quota (in a container or a CPU set
#: other tasks on other CPUs count too; lateness alone then tells a busy host).
_LOAD_IS_OURS = _QUOTA is None and _AFFINITY == (os.cpu_count() or _AFFINITY)
#: How long a helper spins after a job, and a caller waits for the helper's last part, before
#: blocking (seconds; turned into loop iterations by timing the loop once, :func:`_spins`).
SPIN_SECONDS = 0.5e-3
#: A split finds the host busy when more threads are running than the caller and its awake
#: helpers (:func:`_others_running`; that split runs on the caller), or turns out *late*: no
#: helper took a part until :data:`LATE` seconds after it was posted (the caller ran every
#: part itself, for longer than that, or a helper came that late). After :data:`STRIKES` such
#: splits in a row the next :data:`REST` splits run on
#: the caller alone and the helpers do not spin: on a busy host a spinning helper only takes
#: time from the caller (MobileNet-V3-like, one core kept busy: 5.87 ms a run with helpers,
#: 4.97 without). One busy sample alone (a kernel thread waking) does not make them rest.
LATE = 300e-6
STRIKES = 3
REST = 32


def _item(context, builder, signature, args):  # pragma: no cover - compiled
    """The pointer to ``array[index]`` of an intrinsic's ``(array, index)`` arguments."""
    aryty = signature.args[0]
    ary = context.make_array(aryty)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]])


@intrinsic
def _load(typingctx, array, index):  # pragma: no cover - compiled
    """``array[index]`` as an acquire load: read again on every call, never hoisted."""
    def codegen(context, builder, signature, args):
        return builder.load_atomic(_item(context, builder, signature, args), "acquire",
                                   signature.args[0].dtype.bitwidth // 8)
    return array.dtype(array, index), codegen


@intrinsic
def _fetch_add(typingctx, array, index):  # pragma: no cover - compiled
    """Atomically add 1 to ``array[index]``; the value before."""
    def codegen(context, builder, signature, args):
        ptr = _item(context, builder, signature, args)
        return builder.atomic_rmw("add", ptr, ir.Constant(ptr.type.pointee, 1), "seq_cst")
    return array.dtype(array, index), codegen


@intrinsic
def _swap(typingctx, array, index, expected, new):  # pragma: no cover - compiled
    """Set ``array[index]`` to ``new`` if it still holds ``expected`` (compare-and-swap);
    whether it did."""
    def codegen(context, builder, signature, args):
        ptr = _item(context, builder, signature, args[:2])
        pair = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)
    return types.boolean(array, index, types.int64, types.int64), codegen


@intrinsic
def _call_part(typingctx, function, data, part):  # pragma: no cover - compiled
    """Call the native part at address ``function``: ``void f(void *data, int64 part)``."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i64])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        builder.call(fn, [builder.inttoptr(args[1], ir.IntType(8).as_pointer()), args[2]])
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


#: The spin-wait hint of this CPU's instruction set, as an LLVM intrinsic (none known: the spin
#: loops run without one).
_PAUSE = {"x86_64": "llvm.x86.sse2.pause", "amd64": "llvm.x86.sse2.pause",
          "i386": "llvm.x86.sse2.pause", "i686": "llvm.x86.sse2.pause",
          "aarch64": "llvm.aarch64.hint", "arm64": "llvm.aarch64.hint"
          }.get(platform.machine().lower())


@intrinsic
def _pause(typingctx):  # pragma: no cover - compiled
    """The spin-wait hint (x86 ``pause``, ARM ``yield``: the core's pipeline goes to its
    sibling, and power is saved); nothing on other CPUs."""
    def codegen(context, builder, signature, args):
        if _PAUSE == "llvm.aarch64.hint":  # hint #1 is YIELD
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(builder.module,
                                                ir.FunctionType(ir.VoidType(), [i32]), _PAUSE)
            builder.call(fn, [ir.Constant(i32, 1)])
        elif _PAUSE is not None:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), _PAUSE)
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@njit(cache=True, nogil=True)
def _claim(counts):  # pragma: no cover - compiled
    return _fetch_add(counts, 0)


@njit(cache=True, nogil=True)
def _finished(counts):  # pragma: no cover - compiled
    return _fetch_add(counts, 1) + 1


@njit(cache=True, nogil=True)
def _await_done(counts, parts, limit):  # pragma: no cover - compiled
    """Spin while fewer than ``parts`` parts are finished, at most ``limit`` times; whether all
    are."""
    for _ in range(limit):
        if _load(counts, 1) >= parts:
            return True
        _pause()
    return _load(counts, 1) >= parts


@intrinsic
def _store(typingctx, array, index, value):  # pragma: no cover - compiled
    """``array[index] = value`` as a release store: every write before it is seen first."""
    def codegen(context, builder, signature, args):
        ptr = _item(context, builder, signature, args[:2])
        builder.store_atomic(args[2], ptr, "release", signature.args[0].dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.void(array, index, types.int64), codegen


#: A native job's slots in :attr:`_Team.native`: the claim word (its sequence number, its
#: part count and the next part to claim, :func:`_word`), the part's address, its data's
#: address, and the count of parts finished.
_WORD, _FUNCTION, _DATA, _DONE = 0, 1, 2, 3
_FIELD = (1 << 20) - 1  # the claim word's part count and next part: 20 bits each
_SEQUENCE = (1 << 23) - 1  # its sequence number: the job's post number, 23 bits of it


@njit(cache=True, nogil=True)
def _word(seq, parts):  # pragma: no cover - compiled
    return ((seq & _SEQUENCE) << 40) | (parts << 20)


@njit(cache=True, nogil=True)
def _is_native(native, seq):  # pragma: no cover - compiled
    """Whether post number ``seq`` is a native job (its claim word carries that number)."""
    return _load(native, _WORD) >> 40 == seq & _SEQUENCE


@njit(cache=True, nogil=True)
def _run_native(native, seq):  # pragma: no cover - compiled
    """Claim and run parts of native job ``seq`` until none is left; how many ran here.

    A part is claimed by a compare-and-swap of the whole claim word, so it is claimed only
    while that job is still the posted one with parts left: the part's address and data,
    read between loading the word and swapping it, are then that job's (its poster writes
    the next job's only once every part of this one has finished)."""
    ran = 0
    while True:
        word = _load(native, _WORD)
        part, parts = word & _FIELD, (word >> 20) & _FIELD
        if word >> 40 != seq & _SEQUENCE or part >= parts:
            return ran
        function, data = _load(native, _FUNCTION), _load(native, _DATA)
        if _swap(native, _WORD, word, word + 1):
            _call_part(function, data, part)
            _fetch_add(native, _DONE)
            ran += 1


@njit(cache=True, nogil=True)
def _post_native(native, posted, function, data, parts):  # pragma: no cover - compiled
    """Write a native job of ``parts`` parts and post it (the post number last); its number."""
    seq = posted[0] + 1
    native[_FUNCTION] = function
    native[_DATA] = data
    native[_DONE] = 0
    _store(native, _WORD, _word(seq, parts))
    _store(posted, 0, seq)
    return seq


@njit(cache=True, nogil=True)
def _finish_native(native, seq, parts):  # pragma: no cover - compiled
    """The poster's share of native job ``seq``: run parts, then spin until all have ended.
    How many parts it ran, and how many spins it then waited for a helper's part."""
    ran, waited = _run_native(native, seq), 0
    while _load(native, _DONE) < parts:
        _pause()
        waited += 1
    return ran, waited


@njit(cache=True, nogil=True)
def _serial_native(function, data, parts):  # pragma: no cover - compiled
    for part in range(parts):
        _call_part(function, data, part)


@njit(cache=True, nogil=True)
def _serve_native(posted, seen, limit, native):  # pragma: no cover - compiled
    """A helper's wait: spin while ``posted[0] == seen``, at most ``limit`` times, running the
    parts of every native job posted meanwhile here, without the GIL (then spinning afresh).
    Returns the post number of a job of the Python side, or ``seen`` when the spin ends."""
    spins = 0
    while spins < limit:
        value = _load(posted, 0)
        if value == seen:
            _pause()
            spins += 1
            continue
        if not _is_native(native, value):
            return value
        _run_native(native, value)
        seen, spins = value, 0
    return seen


class _Job:
    """One split: ``work(k)`` for ``k < parts``; ``counts`` = [next part, parts finished]."""

    __slots__ = ("work", "parts", "counts", "errors", "last", "errstate", "errcall", "claimed")

    def __init__(self, work: Callable[[int], object], parts: int) -> None:
        self.work, self.parts = work, parts
        # numpy's error handling is per thread: the caller's holds for every part
        self.errstate, self.errcall = np.geterr(), np.geterrcall()
        self.counts = np.zeros(2, np.int64)
        self.errors: dict[int, BaseException] = {}  # part -> what it raised
        self.claimed = 0.0  # when a helper first took a part (perf_counter), 0: none did
        self.last = threading.Lock()  # released by whoever finishes the last part
        self.last.acquire()

    def run_parts(self) -> int:
        """Claim and run parts until none is left (after an error, the rest are skipped); how
        many this thread ran."""
        ran = 0
        while (k := int(_claim(self.counts))) < self.parts:
            ran += 1
            try:
                if not self.errors:
                    self.work(k)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
                self.errors[k] = e
            if _finished(self.counts) == self.parts:
                self.last.release()
        return ran

    def cancel(self) -> None:
        """Skip the parts nobody has started (the caller was interrupted)."""
        self.errors.setdefault(self.parts, KeyboardInterrupt())

    def error(self) -> BaseException | None:
        """What the lowest-numbered failing part raised (as the serial loop would report)."""
        return self.errors[min(self.errors)] if self.errors else None


class _Team:
    """The helper threads and the job they take next."""

    def __init__(self) -> None:
        self.posted = np.zeros(1, np.int64)  # sequence number of the newest job
        self.job: _Job | None = None
        self.native = np.zeros(4, np.int64)  # the native job (_WORD, _FUNCTION, ...)
        self.wake = threading.Condition()
        self.sleepers = 0
        self.busy = threading.Lock()  # one split at a time; others run serially
        self.spins = _spins(self.posted)  # loop iterations in SPIN_SECONDS
        self.spin = self.spins  # how long helpers spin after a job: 0 while resting
        self.strikes = 0  # late helpers in a row
        self.rest = 0  # splits still to run serially on the caller
        for i in range(THREADS - 1):
            threading.Thread(target=self._serve, name=f"npu_sim-cores-{i}", daemon=True).start()

    def _serve(self) -> None:
        seen = 0
        while True:
            if _serve_native(self.posted, seen, self.spin, self.native) == seen:
                with self.wake:
                    self.sleepers += 1
                    while self.posted[0] == seen:
                        self.wake.wait()
                    self.sleepers -= 1
            seen = int(self.posted[0])
            if _is_native(self.native, seen):  # posted while this thread slept
                _run_native(self.native, seen)
                continue
            job = self.job
            if job is not None and int(job.counts[0]) < job.parts:
                job.claimed = job.claimed or time.perf_counter()
                with np.errstate(call=job.errcall, **job.errstate):
                    job.run_parts()

    def run(self, job: _Job) -> None:
        self.job = job
        with self.wake:
            self.posted[0] += 1
            if self.sleepers:
                self.wake.notify_all()
        posted = time.perf_counter()
        try:
            mine = job.run_parts()
            done = time.perf_counter()
            # a helper may still be on its part: spin a while, then block until it ends
            if not _await_done(job.counts, job.parts, self.spins):
                job.last.acquire()
        except BaseException:  # interrupted (Ctrl-C): no part may still write once we return
            job.cancel()
            _finish_uninterrupted(job)
            raise
        finally:
            self.job = None
        # late: a helper took its first part LATE after the post, or none came while the
        # caller ran every part for longer than that
        late = job.claimed - posted if job.claimed else (done - posted if mine else 0.0)
        if late > LATE:
            self.strike()
        else:
            self.strikes = 0

    def run_native(self, parts: int, function: int, data: int) -> int:
        """Post a native job (:func:`split_native`) and run parts of it until all have ended:
        the helpers take theirs in compiled code, without the GIL. How many parts the caller
        ran. A caller that then waited :data:`LATE` for a helper's part (a helper that
        claimed it and lost its core) counts the split late, as :meth:`run` does."""
        with self.wake:
            seq = _post_native(self.native, self.posted, function, data, parts)
            if self.sleepers:
                self.wake.notify_all()
        ran, waited = _finish_native(self.native, seq, parts)
        if waited > self.spins * (LATE / SPIN_SECONDS):
            self.strike()
        else:
            self.strikes = 0
        return ran

    def strike(self) -> None:
        """Count a split that found the host busy; at :data:`STRIKES` in a row, rest."""
        self.strikes += 1
        if self.strikes >= STRIKES:  # the helpers' cores are taken: rest, and stop spinning
            self.strikes, self.rest, self.spin = 0, REST, 0


def _finish_uninterrupted(job: _Job) -> None:
    """Wait until every claimed part of ``job`` has ended, whatever interrupts the wait."""
    while True:
        try:
            while not _await_done(job.counts, job.parts, 1 << 20):
                pass
            return
        except BaseException:  # noqa: BLE001 - another Ctrl-C: keep waiting, the first is raised
            continue


def _spins(flag: np.ndarray) -> int:
    """How many iterations of the spin loop take :data:`SPIN_SECONDS` on this CPU."""
    idle = np.zeros(4, np.int64)  # no native job
    _serve_native(flag, flag[0], 10, idle)  # compiled (or loaded from the cache) before timing
    start = time.perf_counter()
    _serve_native(flag, flag[0], 20000, idle)
    per = (time.perf_counter() - start) / 20000
    return max(1000, int(SPIN_SECONDS / max(per, 1e-9)))


_team: _Team | None = None
_team_lock = threading.Lock()
_loadavg: int | None = None  # descriptor of /proc/loadavg; -1: there is none to read
_no_threads = False
"""The helper threads could not be started: every split runs on its caller. Python 3.12 and
later start no thread once the interpreter is exiting (a session run from an ``atexit``
handler), and a host may refuse a new thread."""


def _reset_after_fork() -> None:
    global _team, _team_lock, _loadavg, _no_threads
    _team, _team_lock, _loadavg, _no_threads = None, threading.Lock(), None, False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _others_running(helpers: _Team, *, awake: bool = True) -> bool:
    """Whether more threads are running on the host than this caller and its spinning helpers
    (Linux's count of runnable tasks, ``/proc/loadavg``, 2 us to read): another process has a
    core, and a helper would only take time from the caller. False where the count does not
    speak for this process's CPUs (:data:`_LOAD_IS_OURS`) or cannot be read. ``awake``
    False: whether more threads run than there are cores (a native split's test: a helper
    asleep costs it nothing, and the count then often held one thread more than the caller,
    which made 27 of a MobileNet-V3's 840 splits run serially for nothing)."""
    global _loadavg
    if not _LOAD_IS_OURS:
        return False
    if _loadavg is None:
        with _team_lock:
            if _loadavg is None:
                try:
                    _loadavg = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    _loadavg = -1
    try:
        running = int(os.pread(_loadavg, 128, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return False
    # the caller and each helper not asleep
    return running > THREADS - (helpers.sleepers if awake else 0)


def team() -> _Team | None:
    """The helper threads (started on first use); None on a one-core host, or where they
    cannot be started (:data:`_no_threads`)."""
    global _team, _no_threads
    if THREADS < 2 or _no_threads:
        return None
    if _team is None:
        with _team_lock:
            if _team is None and not _no_threads:
                try:
                    _team = _Team()
                except RuntimeError:  # "can't create new thread at interpreter shutdown"
                    _no_threads = True
    return _team


#: Calls of a :class:`Choice` timed each way (split, then whole, alternating) before it decides.
TRIALS = 5
#: A :class:`Choice` decides after :data:`EARLY` calls each way when every call one way took
#: :data:`CLEAR` times less than every call the other way (light_resnet50's split launches
#: take 0.55-0.65 of their whole time): with two schedules alternating, ten trial calls each
#: made a fresh session's first 20-odd runs 1.2-1.5x slower than the later ones.
EARLY = 2
CLEAR = 1.25


class Choice:
    """Whether one launch that runs again and again (a prepared kernel) gains from splitting,
    decided by timing it: its first ``2 * TRIALS`` calls alternate split and whole, and the
    way with the lower median time is kept for every later call (or, after ``2 * EARLY``
    calls, the way every call of which was ``CLEAR`` times faster than every call the other
    way).

    Whether a split gains depends on the host more than on the launch: a handoff cost 4-22 us
    on the Zen 4 the split sizes were measured on, and a median 60 us on a Zen 3 VM, where the
    helper waited that long for the GIL the caller handed over. There every one of
    MobileNet-V3's five split launches (its stem and depthwise convolutions) took longer split
    than whole in its runs (medians of 5: 75 against 250 us, 150 against 290, 360 against 470),
    while EfficientNet's largest gained (about 620 against 700 us) and most of its others were
    level. Both ways give the same values (a part's arithmetic does not depend on the thread
    running it), so the choice is only a matter of time. A launch is timed in its runs, beside
    the launches around it; the busy-host rules of :func:`split` still apply to split calls."""

    __slots__ = ("_times", "_whole")

    def __init__(self) -> None:
        self._times: tuple[list[float], list[float]] = ([], [])  # split, whole
        self._whole: bool | None = None  # None while timing

    @property
    def whole(self) -> bool | None:
        """True once whole was faster, False once split was, None while still timing."""
        return self._whole

    def run(self, parts: int, work: Callable[[int], object]) -> None:
        """``work(k)`` for every ``k`` in ``range(parts)``, split or whole as chosen."""
        if self._whole is not None:
            (serial if self._whole else split)(parts, work)
            return
        split_times, whole_times = self._times
        whole = len(whole_times) < len(split_times)  # split first, then whole, in turn
        start = time.perf_counter()
        (serial if whole else split)(parts, work)
        (whole_times if whole else split_times).append(time.perf_counter() - start)
        if len(whole_times) >= TRIALS:
            self._whole = statistics.median(whole_times) <= statistics.median(split_times)
        elif EARLY <= len(whole_times) == len(split_times):
            if max(whole_times) * CLEAR <= min(split_times):
                self._whole = True
            elif max(split_times) * CLEAR <= min(whole_times):
                self._whole = False


def split_native(parts: int, function: int, data: int) -> None:
    """Run ``function(data, k)`` for every ``k`` in ``range(parts)`` over the caller and the
    helper threads. ``function`` is the address of a native ``void f(void *data, int64 k)``
    (a numba ``cfunc``) that neither raises nor needs the GIL, ``data`` the address of what
    it reads, kept alive by the caller until this returns.

    A Python part (:func:`split`) needs the GIL to start and between its calls, and a helper
    asleep on the GIL takes tens of microseconds to wake here, which eats the gain of a split
    below a few hundred microseconds. A helper spinning after a job takes a native part at
    once, in compiled code, and the caller runs the parts no helper has claimed, so a split
    costs a whole run and a post at worst. Resting helpers (:data:`REST`) leave every part
    to the caller, and so does a host busy with other threads (:func:`_others_running`: a
    helper sharing its core with another thread may lose it in the middle of a part, which
    the caller then waits for); a split already running (another thread's) runs this one
    serially."""
    helpers = team()
    if parts <= 1 or parts > _FIELD or helpers is None or \
            not helpers.busy.acquire(blocking=False):
        _serial_native(function, data, parts)
        return
    try:
        if helpers.rest > 0:
            helpers.rest -= 1
            if not helpers.rest:
                helpers.spin = helpers.spins
            _serial_native(function, data, parts)
        elif _others_running(helpers, awake=False):
            helpers.strike()
            _serial_native(function, data, parts)
        else:
            helpers.run_native(parts, function, data)
    finally:
        helpers.busy.release()


def serial(parts: int, work: Callable[[int], object]) -> None:
    """``work(k)`` for every ``k`` in ``range(parts)``, in order, on the calling thread."""
    for k in range(parts):
        work(k)


def split(parts: int, work: Callable[[int], object]) -> None:
    """``work(k)`` for every ``k`` in ``range(parts)``, spread over the caller and the helper
    threads; returns when all are done and raises what the lowest-numbered failing part
    raised (the rest are skipped once one has failed)."""
    helpers = team()
    if parts <= 1 or helpers is None or not helpers.busy.acquire(blocking=False):
        serial(parts, work)
        return
    try:
        if helpers.rest > 0:  # resting after late helpers: on the caller
            helpers.rest -= 1
            if not helpers.rest:
                helpers.spin = helpers.spins
            job = None
        elif _others_running(helpers):
            helpers.strike()  # this split runs on the caller
            job = None
        else:
            job = _Job(work, parts)
            helpers.run(job)
    finally:
        helpers.busy.release()
    if job is None:
        serial(parts, work)
    elif (error := job.error()) is not None:
        raise error
