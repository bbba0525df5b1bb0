"""`ResetWatch` over real loopback TCP: a reset is reported once, a normal close of both sides is not."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from hil_tests.rig.reset_watch import ResetWatch
from hil_tests.rig.tests.peers import reset_on_close


@contextmanager
def _tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        near = socket.create_connection(server.getsockname())
        far, _ = server.accept()
    with near, far:
        yield near, far


def _reset(sock: socket.socket) -> None:
    reset_on_close(sock)
    sock.close()


async def _settle(loop: asyncio.AbstractEventLoop) -> None:
    """Let the loop poll its selector (and so the watch's epoll) a few times."""
    for _ in range(5):
        done = loop.create_future()
        loop.call_soon(done.set_result, None)
        await done


def test_a_reset_after_a_half_close_is_reported_once():
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        watch = ResetWatch(loop)
        reported: list[str] = []
        reset = asyncio.Event()
        try:
            with _tcp_pair() as (near, far):
                watch.watch(near.fileno(), lambda: (reported.append("reset"), reset.set()))
                far.shutdown(socket.SHUT_WR)  # a FIN: near stays writable, nothing to report
                await _settle(loop)
                assert reported == []
                _reset(far)
                await asyncio.wait_for(reset.wait(), 5)
                await _settle(loop)
        finally:
            watch.close()
        return reported

    assert asyncio.run(scenario()) == ["reset"]


def test_a_close_of_both_directions_is_not_a_reset():
    """Both FINs exchanged is a hang-up without an error: bytes may still wait unread, nothing is ended."""

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        watch = ResetWatch(loop)
        reported: list[str] = []
        try:
            with _tcp_pair() as (near, far):
                watch.watch(near.fileno(), lambda: reported.append("reset"))
                far.sendall(b"unread")
                far.shutdown(socket.SHUT_WR)
                near.shutdown(socket.SHUT_WR)
                assert far.recv(1) == b""  # near's FIN arrived: both directions are closed
                await _settle(loop)
                assert near.recv(6) == b"unread"
        finally:
            watch.close()
        return reported

    assert asyncio.run(scenario()) == []


def test_forgetting_a_socket_whose_number_was_reused_keeps_the_new_watch():
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        watch = ResetWatch(loop)
        reported: list[str] = []
        reset = asyncio.Event()

        def old() -> None:
            reported.append("old")

        try:
            with socket.create_server(("127.0.0.1", 0)) as server:
                closed = socket.create_connection(server.getsockname())
                server.accept()[0].close()
                fd = closed.fileno()
                watch.watch(fd, old)
                closed.close()  # the kernel drops it from the epoll set; the lowest free number is its
                with socket.create_connection(server.getsockname()) as reused:
                    reused_far, _ = server.accept()
                    assert reused.fileno() == fd
                    watch.watch(fd, lambda: (reported.append("new"), reset.set()))
                    watch.forget(fd, old)  # the old connection's late cleanup
                    _reset(reused_far)
                    await asyncio.wait_for(reset.wait(), 5)
        finally:
            watch.close()
        return reported

    assert asyncio.run(scenario()) == ["new"]
