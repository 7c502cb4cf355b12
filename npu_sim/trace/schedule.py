"""The event scheduler elastic replay runs on: the device clock's order, at a fraction of its cost.

The device runs on a simpy clock, and replay must reproduce it cycle for cycle: when two
records become ready in the same cycle, the one simpy serves first takes the free core, DMA
channel or link first. This module keeps exactly simpy's rules and nothing else:

- a :class:`Clock` is a heap of actions keyed by ``(cycle, priority, sequence)``: the earliest
  cycle first; in one cycle, starts of work (:data:`URGENT`) before everything else, then the
  order the actions were scheduled in;
- an :class:`Event` happens once, when the clock reaches the action that fires it; whoever
  waits on it (:meth:`Event.then`) continues then, or at once if it has already happened;
- :func:`all_of` continues one step after the last of several events (simpy's ``AllOf``),
  which is why a record waiting on others starts a step after the last of them ends;
- a :class:`Resource` (a core, the host link, the HBM port) serves requests first come first
  served, as many at a time as its capacity; a released unit goes to the next request one
  step later, unless a new request arrives first and hands it over sooner (simpy's
  ``Resource``); a :class:`Pool` hands out items (DMA channel numbers) the same way (simpy's
  ``Store``).

Every step costs one heap push and pop and a function call, where a simpy process pays for a
generator, event objects and condition values; :mod:`npu_sim.trace.retime` describes the
device's engines with these four pieces.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from heapq import heappop, heappush
from typing import Any

Action = Callable[[], None]

URGENT = 0
"""Priority of a piece of work starting (simpy's process initialisation)."""
NORMAL = 1
"""Priority of everything else."""


class Clock:
    """Actions in cycle order; in one cycle, urgent ones first, then in scheduling order.

    Actions for a later cycle wait in a heap keyed by ``(cycle, sequence)``; actions for the
    current cycle wait in two first-in first-out queues (urgent, normal). That is simpy's
    ``(cycle, priority, sequence)`` order: whatever was scheduled for this cycle from an
    earlier one has a lower sequence than anything scheduled during it."""

    __slots__ = ("now", "_later", "_seq", "_urgent", "_normal", "soon")

    def __init__(self) -> None:
        self.now = 0
        self._later: list[tuple[int, int, Action]] = []
        self._seq = 0
        self._urgent: deque[Action] = deque()
        self._normal: deque[Action] = deque()
        self.soon: Callable[[Action], None] = self._normal.append
        """Run an action later in this cycle (``at(0, action)``, the commonest step)."""

    def at(self, delay: int, action: Action, priority: int = NORMAL) -> None:
        """Run ``action`` ``delay`` cycles from now (urgent only with no delay)."""
        if delay:
            self._seq += 1
            heappush(self._later, (self.now + delay, self._seq, action))
        elif priority == URGENT:
            self._urgent.append(action)
        else:
            self._normal.append(action)

    def run(self) -> None:
        """Run every action, and the actions they schedule, until none is left."""
        later, urgent, normal = self._later, self._urgent, self._normal
        urgent_next, normal_next = urgent.popleft, normal.popleft
        now = self.now  # a local copy: only this loop moves the clock
        while True:
            if urgent:
                urgent_next()()
            elif later and later[0][0] == now:
                heappop(later)[2]()
            elif normal:
                normal_next()()
            elif later:
                now = self.now = later[0][0]
            else:
                return


class Event:
    """Something that happens once."""

    __slots__ = ("waiters",)

    def __init__(self) -> None:
        self.waiters: list[Action] | None = []  # None once it happened

    def fire(self) -> None:
        """It happens now: everyone waiting continues, in the order they started waiting."""
        waiters, self.waiters = self.waiters, None
        for action in waiters:  # type: ignore[union-attr]
            action()

    def then(self, action: Action) -> None:
        """Run ``action`` when this event happens (at once if it already has)."""
        if self.waiters is None:
            action()
        else:
            self.waiters.append(action)


def all_of(clock: Clock, events: Sequence[Event], action: Action) -> None:
    """Run ``action`` one step after all of ``events`` have happened (one step from now if
    none): what follows a wait on several events (simpy's ``AllOf``)."""
    left = len(events)
    if not left:
        clock.soon(action)
        return

    def arrived() -> None:
        nonlocal left
        left -= 1
        if not left:
            clock.soon(action)

    for event in events:
        event.then(arrived)


def each(events: Sequence[Event], action: Action, first: int = 0) -> None:
    """Run ``action`` once ``events`` have happened, waiting for them one after the other
    (a process that yields each in turn)."""
    for i in range(first, len(events)):
        waiters = events[i].waiters
        if waiters is not None:
            waiters.append(partial(each, events, action, i + 1))
            return
    action()


class Resource:
    """``capacity`` identical units served first come first served (a core, a link)."""

    __slots__ = ("clock", "free", "queue")

    def __init__(self, clock: Clock, capacity: int = 1) -> None:
        self.clock = clock
        self.free = capacity
        self.queue: deque[Action] = deque()

    def request(self) -> Event:
        """An event that happens when a unit is granted."""
        granted = Event()
        self.acquire(granted.fire)
        return granted

    def acquire(self, action: Action) -> None:
        """Run ``action`` when a unit is granted: ``request().then(action)`` without the
        event (the step that fires the event runs ``action`` itself)."""
        self.queue.append(action)
        self._grant()

    def release(self) -> None:
        """Give a unit back; the next request gets it one step later."""
        self.free += 1
        self.clock.soon(self._grant)

    def _grant(self) -> None:
        if self.queue and self.free:
            self.free -= 1
            self.clock.soon(self.queue.popleft())


class Pool:
    """Items handed out first come first served, oldest returned item first (DMA channels)."""

    __slots__ = ("clock", "items", "queue")

    def __init__(self, clock: Clock, items: Iterable[Any]) -> None:
        self.clock = clock
        self.items = list(items)
        self.queue: deque[Callable[[Any], None]] = deque()

    def take(self, action: Callable[[Any], None]) -> None:
        """Run ``action(item)`` when an item is handed over (simpy's ``Store.get``: the step
        that would resume a process waiting for the item runs ``action``)."""
        self.queue.append(action)
        self._hand()

    def put(self, item: Any) -> None:
        """Return ``item``; the next request gets it one step later."""
        self.items.append(item)
        self.clock.soon(self._hand)

    def _hand(self) -> None:
        if self.queue and self.items:
            self.clock.soon(partial(self.queue.popleft(), self.items.pop(0)))

