"""The replay scheduler keeps simpy's order exactly, and elastic replay is a fixed point.

Elastic replay matches the device cycle for cycle only if ties between records ready in the same
cycle break as on the device's simpy clock. The first test runs random jobs (delays, waits on
earlier jobs, a core, a link or a DMA channel held for some cycles, zero included) once as simpy
processes and once on :mod:`npu_sim.trace.schedule`, and compares every step, in order.
"""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.trace import replay
from npu_sim.trace.schedule import URGENT, Clock, Event, Pool, Resource, all_of, each

jobs = st.lists(
    st.tuples(st.integers(0, 3),                        # delay before waiting
              st.lists(st.integers(0, 30), max_size=3),  # earlier jobs waited for (mod index)
              st.sampled_from(["core0", "core1", "link", "pool", "both"]),
              st.integers(0, 4)),                       # cycles held
    min_size=1, max_size=14)


def _on_simpy(spec) -> list[tuple]:
    env = simpy.Environment()
    units = {"core0": simpy.Resource(env, 1), "core1": simpy.Resource(env, 1),
             "link": simpy.Resource(env, 1)}
    pool = simpy.Store(env, capacity=2)
    pool.items.extend([0, 1])
    log: list[tuple] = []
    procs: list[simpy.Process] = []

    def job(i, delay, deps, unit, hold):
        if delay:
            yield env.timeout(delay)
        if deps or delay == 2:  # a wait on nothing still costs a step
            yield simpy.AllOf(env, deps)
        log.append((i, "ready", env.now))
        if unit == "pool":
            item = yield pool.get()
            log.append((i, "got", item, env.now))
            yield env.timeout(hold)
            pool.put(item)
        else:
            names = ["core0", "core1"] if unit == "both" else [unit]
            requests = [units[n].request() for n in names]
            for req in requests:
                yield req
            log.append((i, "start", env.now))
            yield env.timeout(hold)
            for n, req in zip(names, requests, strict=True):
                units[n].release(req)
        log.append((i, "end", env.now))

    for i, (delay, deps, unit, hold) in enumerate(spec):
        waits = [procs[d % i] for d in deps] if i else []
        procs.append(env.process(job(i, delay, waits, unit, hold)))
    env.run()
    return log


def _on_clock(spec, direct: bool = False) -> list[tuple]:
    """``spec`` on a :class:`Clock`; ``direct``: odd jobs on one unit wait with
    ``Resource.acquire`` instead of the event of ``request``."""
    clock = Clock()
    units = {"core0": Resource(clock), "core1": Resource(clock), "link": Resource(clock)}
    pool = Pool(clock, [0, 1])
    log: list[tuple] = []
    done: list[Event] = []

    def job(i, delay, deps, unit, hold, finished):
        def ready():
            log.append((i, "ready", clock.now))
            if unit == "pool":
                def taken(item):
                    log.append((i, "got", item, clock.now))

                    def held():
                        pool.put(item)
                        end()

                    clock.at(hold, held)

                pool.take(taken)
                return
            names = ["core0", "core1"] if unit == "both" else [unit]

            def start():
                log.append((i, "start", clock.now))

                def held():
                    for n in names:
                        units[n].release()
                    end()

                clock.at(hold, held)

            if direct and i % 2 and len(names) == 1:
                units[unit].acquire(start)
            else:
                each([units[n].request() for n in names], start)

        def end():
            log.append((i, "end", clock.now))
            clock.soon(finished.fire)

        if delay:
            clock.at(delay, (lambda: all_of(clock, deps, ready)) if deps or delay == 2 else ready)
        elif deps:
            all_of(clock, deps, ready)
        else:
            ready()

    for i, (delay, deps, unit, hold) in enumerate(spec):
        waits = [done[d % i] for d in deps] if i else []
        done.append(Event())
        clock.at(0, lambda a=(i, delay, waits, unit, hold, done[-1]): job(*a), URGENT)
    clock.run()
    return log


@settings(max_examples=300, deadline=None)
@given(jobs)
def test_the_scheduler_keeps_simpys_order_step_for_step(spec):
    assert _on_clock(spec) == _on_simpy(spec)


@settings(max_examples=300, deadline=None)
@given(jobs)
def test_acquire_keeps_simpys_order_step_for_step(spec):
    """What DMA chunks wait with: a waiter queued itself takes the step its event would."""
    assert _on_clock(spec, direct=True) == _on_simpy(spec)


@settings(max_examples=20, deadline=None)
@given(hbm=st.floats(20.0, 4000.0), link=st.floats(1.0, 200.0), ch=st.integers(1, 16),
       chunk=st.sampled_from([4096, 65536, 10 << 20]), cores=st.sampled_from([1, 2, 4, 8]))
def test_a_replayed_trace_replays_to_itself(cnn_trace, hbm, link, ch, chunk, cores):
    """Replay's output is a trace of the new config: replayed again under that config, it
    gives back the same timeline (as a recorded trace does under its own config)."""
    config = cnn_trace.config.replace(hbm_gbps=hbm, host_link_gbps=link, dma_channels=ch,
                                      dma_chunk_bytes=chunk, cores=cores)
    first = replay(cnn_trace, config, "elastic")
    again = replay(first.as_trace(cnn_trace), config, "elastic")
    assert again.makespan == first.makespan
    assert [(r.id, r.start, r.end, r.engine) for r in again.records] == \
        [(r.id, r.start, r.end, r.engine) for r in first.records]
    assert again.busy == first.busy and again.energy == first.energy


def test_records_are_built_once_when_first_read(cnn_trace):
    result = replay(cnn_trace, cnn_trace.config, "elastic")
    assert result.records is result.records
    assert result.busy == replay(result.as_trace(cnn_trace), mode="recorded").busy
