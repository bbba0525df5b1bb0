"""Notice a TCP socket that breaks (reset, timed out) while asyncio is not looking at it.

asyncio learns of a reset only through a read or a write: it stops reading a socket once it has read the
socket's EOF (a half-close) and while its reader's buffer is full, and it writes only when there is
something to write. The relay's shaper may meanwhile wait for tokens for bytes that can no longer be
delivered, spending the link's shared rate on them. So the relay also registers each socket in an epoll
set of its own for errors only (``EPOLLERR``; ``EPOLLHUP`` comes with it unasked), and that set's file
descriptor in the event loop: a socket whose peer resets makes it readable, and the relay ends the flow
then, not at its next write.

A hang-up without an error is a normal close of both directions (FINs both ways); bytes may still wait
unread in the kernel, so it ends nothing. Registrations are one-shot, so that such a hang-up, which stays
reported, does not wake the loop again and again.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from collections.abc import Callable


class ResetWatch:
    """Calls a socket's ``on_reset`` once when the socket reports an error; Linux only (epoll)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._epoll = select.epoll()
        # fd -> the callback of the socket registered under it (an fd number is reused after a close)
        self._on_reset: dict[int, Callable[[], None]] = {}
        loop.add_reader(self._epoll.fileno(), self._ready)

    def watch(self, fd: int, on_reset: Callable[[], None]) -> None:
        self._epoll.register(fd, select.EPOLLERR | select.EPOLLONESHOT)
        self._on_reset[fd] = on_reset

    def forget(self, fd: int, on_reset: Callable[[], None]) -> None:
        """Stop watching ``fd``; call it before the socket is closed. A no-op if ``fd`` now belongs to
        another watch (the socket was closed, by the kernel's error handling, and its number reused)."""
        if self._on_reset.get(fd) is not on_reset:
            return
        del self._on_reset[fd]
        with contextlib.suppress(OSError):  # closed already: epoll dropped it with the socket
            self._epoll.unregister(fd)

    def close(self) -> None:
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
        self._on_reset.clear()

    def _ready(self) -> None:
        for fd, events in self._epoll.poll(0):
            if events & select.EPOLLERR and (on_reset := self._on_reset.get(fd)) is not None:
                on_reset()
