"""Sleeping until a CLOCK_MONOTONIC time on the event loop, to the tens of microseconds.

asyncio's timers wake through epoll_wait, which counts in whole milliseconds and rounds up: a
send due in 0.3 ms leaves 1 ms later, so an open loop's sends are late by up to a millisecond at
random, and at 2,000 requests a second (gaps of 0.5 ms) they reach the server bunched, however
idle the client is. On Linux one timerfd per event loop, armed at the earliest pending time
(absolute, on CLOCK_MONOTONIC, the clock of `time.monotonic`), is one more file the selector
waits on: it becomes readable at that time, within the kernel's timer slack (50 us). Measured
here, sleeps to a Poisson schedule at 2,000/s woke 34 us late at the median, against 546 us with
asyncio's sleep. Elsewhere the loop's own timers serve.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import itertools
import os
import sys
import time
import weakref
from typing import Callable

CLOCK_MONOTONIC = 1
TFD_TIMER_ABSTIME = 1


class _timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _timespec), ("it_value", _timespec)]


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create, libc.timerfd_settime  # noqa: B018 (present, or AttributeError)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def available() -> bool:
    """Whether sleeps here are timerfd-precise (Linux), rather than the loop's millisecond timers."""
    return hasattr(os, "timerfd_create") or _LIBC is not None


def _create() -> int:
    if hasattr(os, "timerfd_create"):  # Python 3.13+
        return os.timerfd_create(time.CLOCK_MONOTONIC, flags=os.TFD_NONBLOCK | os.TFD_CLOEXEC)
    fd = _LIBC.timerfd_create(CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "timerfd_create")
    return fd


def _arm(fd: int, t: float) -> None:
    """Make fd readable at monotonic time t (past: at once); never 0, which would disarm it."""
    ns = max(int(t * 1e9), 1)
    if hasattr(os, "timerfd_settime_ns"):
        os.timerfd_settime_ns(fd, flags=os.TFD_TIMER_ABSTIME, initial=ns)
        return
    spec = _itimerspec(_timespec(0, 0), _timespec(ns // 1_000_000_000, ns % 1_000_000_000))
    if _LIBC.timerfd_settime(fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
        raise OSError(ctypes.get_errno(), "timerfd_settime")


class _Timer:
    """One loop's timerfd and the callbacks waiting on it, earliest first."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        # no reference to the loop kept: _timers' entry (and the fd, closed by the finalizer) then
        # goes with the loop
        self.fd = _create()
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.armed: float | None = None
        self.seq = itertools.count()
        loop.add_reader(self.fd, self._fire)
        weakref.finalize(loop, os.close, self.fd)
        hook = waits(loop)
        if hook is not None:
            hook.first_fd = self.fd

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), fn))
        if self.armed is None or t < self.armed:
            self.armed = t
            _arm(self.fd, t)

    def _fire(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:  # re-armed before this read: its time has not come
            pass
        now = time.monotonic()
        while self.heap and self.heap[0][0] <= now:
            heapq.heappop(self.heap)[2]()
        self.armed = self.heap[0][0] if self.heap else None
        if self.armed is not None:
            _arm(self.fd, self.armed)


_timers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Timer]" = weakref.WeakKeyDictionary()


class Waits:
    """A selector loop's waits for I/O, wrapped once for whoever needs them: the seconds it spent
    waiting (`waited_s`; the rest of the wall it was busy: the self-check's busy share), and the
    timer's file put first among the files ready together (`first_fd`), so its callbacks run
    before the reads that came with it, not wherever epoll listed it."""

    def __init__(self, selector):
        self.waited_s = 0.0
        self.first_fd: int | None = None
        inner = selector.select

        def select(timeout=None):
            t = time.monotonic()
            try:
                events = inner(timeout)
            finally:
                self.waited_s += time.monotonic() - t
            if self.first_fd is not None:
                for i, (key, _) in enumerate(events):
                    if key.fd == self.first_fd:
                        if i:
                            events.insert(0, events.pop(i))
                        break
            return events
        selector.select = select


_waits: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Waits]" = weakref.WeakKeyDictionary()


def waits(loop: asyncio.AbstractEventLoop) -> Waits | None:
    """The loop's Waits (made on first call); None for a loop with no selector to wrap (uvloop,
    Windows' proactor). The only place the loop's private selector is touched."""
    selector = getattr(loop, "_selector", None)
    if selector is None:
        return None
    hook = _waits.get(loop)
    if hook is None:
        hook = _waits[loop] = Waits(selector)
    return hook


def call_at(t: float, fn: Callable[[], None]) -> asyncio.Future:
    """Run fn() on the running loop at monotonic time t, inside the timer's own wake-up (no task
    step between the time and the call: an open loop's request is written there); the future is
    done once fn has run (with fn's exception, if it raised)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def run() -> None:
        if fut.done():  # the waiter was cancelled
            return
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (handed to the waiter)
            fut.set_exception(e)
        else:
            fut.set_result(None)
    if not available():
        loop.call_at(t, run)  # asyncio's loop.time() is time.monotonic()
        return fut
    timer = _timers.get(loop)
    if timer is None:
        timer = _timers[loop] = _Timer(loop)
    timer.call_at(t, run)
    return fut


async def sleep_until(t: float) -> None:
    """Return at monotonic time t (at once if it has passed)."""
    if t > time.monotonic():
        await call_at(t, lambda: None)
