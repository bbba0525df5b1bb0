"""Sockets inside another network namespace, opened by a process that itself stays where it is.

A socket belongs to the network namespace of the thread that created it, for its whole life. So one
worker thread joins the namespace (``setns``) and creates sockets there. Any thread can then use those
sockets, including the event loop. The netns backend's delay relay listens and connects inside the cloud
namespace this way, and the tests open peers on either side of the veth pair. Python 3.11 has no
``os.setns``, so libc's is called through ctypes.
"""

from __future__ import annotations

import ctypes
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"  # where `ip netns add` pins named namespaces


def join_namespace(namespace: str) -> None:
    """Move the calling thread (only) into the named network namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, namespace), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({namespace}): {os.strerror(errno)}")
    finally:
        os.close(fd)


class NamespaceSockets:
    """A worker thread living in ``namespace``; `run` executes a callable there (typically: make a socket)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"netns-{namespace}")
        try:
            self._worker.submit(join_namespace, namespace).result(30)
        except BaseException:
            self._worker.shutdown()
            raise

    def run(self, make: Callable[[], T]) -> T:
        return self._worker.submit(make).result(30)

    def socket(self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
        return self.run(lambda: socket.socket(family, kind))

    def close(self) -> None:
        """End the worker thread (a thread inside a namespace keeps it alive after ``ip netns del``)."""
        self._worker.shutdown()

    def __enter__(self) -> NamespaceSockets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def in_namespace(namespace: str, make: Callable[[], T]) -> T:
    """Run ``make`` once inside ``namespace`` and return what it made."""
    with NamespaceSockets(namespace) as sockets:
        return sockets.run(make)
