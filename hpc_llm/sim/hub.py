"""The simulator's scheduler: a virtual clock, timed events, and the processes' threads as greenlets.

Every simulated thread (a supervisor's main loop, its fleet's I/O thread, an agent, an srun, a
rank) is a greenlet; exactly one runs at a time, and it runs until it blocks in the world
(sleep, select, a queue, a Slurm command): the hub then takes the next event from its heap,
ordered by (virtual time, insertion), so a run is a pure function of its seed. Virtual time
passes only between events: a thread that computes for a while takes no time at all, which is
why a run of minutes of the control plane takes milliseconds (and why a hot loop that never
blocks would hang the simulation: :data:`MAX_EVENTS_AT_ONE_TIME` catches it).

Greenlets, not threads: the code under test is written in blocking style, and a greenlet can
block anywhere and be resumed later at no cost (about a microsecond a switch, where handing the
GIL between threads costs tens).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from greenlet import greenlet

#: a timed wait that ran out
TIMEOUT = object()
#: events at one virtual instant beyond which the simulation is stuck in a loop that never waits
MAX_EVENTS_AT_ONE_TIME = 200_000


class Stuck(RuntimeError):
    """The simulated code spun without letting virtual time pass."""


class Killed(BaseException):
    """Raised in a thread whose process was killed, if it ever runs again (it should not)."""


class Task:
    """One simulated thread of a process."""

    __slots__ = ("glet", "proc", "name", "wait", "done", "dropped")

    def __init__(self, glet: greenlet, proc: Any, name: str) -> None:
        self.glet = glet
        self.proc = proc
        self.name = name
        self.wait: Wait | None = None
        self.done = False
        #: never to run again (its process died, or exec'd another program)
        self.dropped = False


class Wait:
    """A task blocked until something fires it (with a value) or its timeout does."""

    __slots__ = ("task", "fired")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.fired = False


class Hub:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.main = greenlet.getcurrent()
        self.current: Task | None = None
        self.events = 0
        self._at_now = 0
        self._last_t = -1.0
        self.tasks: list[Task] = []

    # -- timed events
    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def soon(self, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now, fn, *args)

    def run(self, until: float, stop: Callable[[], bool] = lambda: False) -> None:
        heap = self._heap
        while heap and not stop():
            t, _, fn, args = heap[0]
            if t > until:
                break
            heapq.heappop(heap)
            if t == self._last_t:
                self._at_now += 1
                if self._at_now > MAX_EVENTS_AT_ONE_TIME:
                    raise Stuck(f"more than {MAX_EVENTS_AT_ONE_TIME} events at t={t:.3f}: a loop that never waits")
            else:
                self._last_t, self._at_now = t, 0
            self.now = t
            self.events += 1
            fn(*args)
        if not stop():
            self.now = max(self.now, until) if not heap or heap[0][0] > until else self.now

    # -- tasks
    def spawn(self, proc: Any, name: str, fn: Callable[[], None]) -> Task:
        task: Task

        def body(_: Any = None) -> None:
            try:
                fn()
            except Killed:
                pass  # its process died, or it exec'd: it just stops
            finally:
                task.done = True

        task = Task(greenlet(body, parent=self.main), proc, name)
        self.tasks.append(task)
        self.soon(self._start, task)
        return task

    def _start(self, task: Task) -> None:
        if task.dropped:
            return
        if task.proc.frozen:
            task.proc.deferred.append((task, None))
            return
        self._switch(task, None)

    def _switch(self, task: Task, value: Any) -> None:
        prev = self.current
        self.current = task
        try:
            task.glet.switch(value)
        finally:
            self.current = prev

    def waiter(self) -> Wait:
        task = self.current
        if task is None:
            raise RuntimeError("the hub itself cannot wait")
        w = Wait(task)
        task.wait = w
        return w

    def suspend(self, w: Wait, timeout: float | None) -> Any:
        """Give the hub control until ``w`` is fired (its value) or ``timeout`` passes (TIMEOUT)."""
        if timeout is not None:
            self.at(self.now + max(0.0, timeout), self.fire, w, TIMEOUT)
        value = self.main.switch()
        task = w.task
        if task.dropped:
            raise Killed()
        return value

    def fire(self, w: Wait, value: Any = None) -> None:
        """Wake the task waiting on ``w`` (once: a later fire, or its timeout, does nothing)."""
        if w.fired:
            return
        w.fired = True
        task = w.task
        if task.dropped or task.done:
            return
        if task.proc.frozen:
            task.proc.deferred.append((task, value))
            return
        self.soon(self._resume, task, w, value)

    def _resume(self, task: Task, w: Wait, value: Any) -> None:
        if task.dropped or task.done or task.wait is not w:
            return
        if task.proc.frozen:
            task.proc.deferred.append((task, value))
            return
        self._switch(task, value)

    def resume_deferred(self, task: Task, value: Any) -> None:
        if task.dropped or task.done:
            return
        if task.wait is not None:
            self.soon(self._resume, task, task.wait, value)
        else:
            self.soon(self._start, task)

    def sleep(self, seconds: float) -> None:
        w = self.waiter()
        self.suspend(w, seconds)
