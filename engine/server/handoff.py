"""Events from the lane host's thread to the event loop, handed over a batch at a time.

The host emits a round's tokens (each appended here) and then flushes once, so the loop is woken
once a round, not once a token. Each wake-up writes the loop's self-pipe, and the woken HTTP
thread was placed on the host thread's core and preempted it: 1.0-1.5 ms a round of run-queue
waits at 4-8 streams on a 2-core box while other processes held the other core (neutral in the
served aggregate at lighter load). Order is kept: a batch
is delivered in the order its events were emitted, batches in the order they were flushed.
"""
from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Callable

_boxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Outbox:
    """One per event loop. `put` and `flush` run on a lane host's thread (a lock, should two hosts
    share a loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.items: list[tuple[Callable[[tuple], None], tuple]] = []
        self._lock = threading.Lock()

    @staticmethod
    def of(loop: asyncio.AbstractEventLoop) -> "Outbox":
        box = _boxes.get(loop)
        if box is None:
            box = _boxes[loop] = Outbox(loop)
        return box

    def put(self, deliver: Callable[[tuple], None], event: tuple) -> None:
        with self._lock:
            self.items.append((deliver, event))

    def flush(self) -> None:
        if not self.items:
            return
        with self._lock:
            items, self.items = self.items, []
        if not self.loop.is_closed():  # a server shutting down has no one left to tell
            self.loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list) -> None:
    for deliver, event in items:
        deliver(event)
