"""sd_notify messages on a real AF_UNIX datagram socket standing in for systemd's NOTIFY_SOCKET."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.sdnotify import Notifier, watchdog_interval
from tests.systemd.notify_socket import NotifySocket


@pytest.fixture
def notify_path(tmp_path: Path) -> Iterator[tuple[str, NotifySocket]]:
    path = str(tmp_path / "notify")
    receiver = NotifySocket(path)
    yield path, receiver
    receiver.close()


def test_ready_reaches_a_path_socket(notify_path: tuple[str, NotifySocket]) -> None:
    path, receiver = notify_path
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled and notifier.ready("listening on 127.0.0.1:1883")
    [(_, message)] = receiver.wait_for(1)
    assert message == "READY=1\nSTATUS=listening on 127.0.0.1:1883"


def test_abstract_namespace_address_with_at_sign() -> None:
    name = f"appliance-test-{os.getpid()}-{time.monotonic_ns()}"
    receiver = NotifySocket(b"\0" + name.encode())
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).stopping()
        assert receiver.wait_for(1)[0][1] == "STOPPING=1"
    finally:
        receiver.close()


def test_without_notify_socket_nothing_is_sent_and_no_pinger_runs() -> None:
    notifier = Notifier({"WATCHDOG_USEC": "1000000"})
    assert not notifier.enabled and not notifier.ready()
    asyncio.run(asyncio.wait_for(notifier.ping_watchdog_forever(), 1.0))  # returns at once


@pytest.mark.parametrize(
    ("environ", "interval"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "0"}, None),
        ({}, None),
        ({"WATCHDOG_USEC": "abc"}, None),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}, 1.0),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process(environ: dict[str, str], interval: float | None) -> None:
    assert watchdog_interval(environ) == interval


def test_watchdog_pings_come_every_half_period_and_stop_while_the_loop_is_stuck(notify_path: tuple[str, NotifySocket]) -> None:
    path, receiver = notify_path
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})  # ping every 0.1 s

    async def gateway_loop() -> None:
        pinger = asyncio.create_task(notifier.ping_watchdog_forever())
        await asyncio.sleep(0.35)
        time.sleep(0.5)  # a blocking call on the loop: exactly what the watchdog must notice
        await asyncio.sleep(0.25)
        pinger.cancel()

    asyncio.run(gateway_loop())
    times = [at for at, message in receiver.wait_for(6) if message == "WATCHDOG=1"]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    longest = max(gaps)
    assert longest >= 0.5  # no ping while the loop was blocked
    regular = sorted(gaps)[:-1]
    # The pinger wakes on the loop's timer: never early, late only by the machine's load; the typical gap is
    # the half period, far from the blocked one.
    assert len(regular) >= 4 and min(regular) >= 0.1 - 0.02 and statistics.median(regular) <= 0.25, regular


def test_a_child_process_started_like_systemd_does_sends_ready(notify_path: tuple[str, NotifySocket]) -> None:
    """The environment route end to end: a separate process finds NOTIFY_SOCKET in its environment."""
    path, receiver = notify_path
    code = "from appliance.sdnotify import Notifier; raise SystemExit(0 if Notifier().ready() else 1)"
    env = {**os.environ, "NOTIFY_SOCKET": path}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)
    assert receiver.wait_for(1)[0][1] == "READY=1"


def test_a_vanished_notify_socket_is_reported_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert notifier.watchdog() is False
    assert "sd_notify 'WATCHDOG=1' failed" in caplog.text


def test_no_watchdog_pings_while_a_service_is_unhealthy(notify_path: tuple[str, NotifySocket],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A forwarding pump that is down stops the pings: if it stays down, systemd restarts the gateway."""
    path, receiver = notify_path
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"})  # ping every 0.05 s
    healthy = True

    def pings() -> int:
        return sum(message == "WATCHDOG=1" for _, message in receiver.messages)

    async def gateway_loop() -> tuple[int, int]:
        nonlocal healthy
        pinger = asyncio.create_task(notifier.ping_watchdog_forever(lambda: healthy))
        while pings() < 2:
            await asyncio.sleep(0.01)
        healthy = False
        await asyncio.sleep(0.06)  # a ping already on its way may still land
        down = pings()
        await asyncio.sleep(0.3)  # six periods: no ping may come
        still_down = pings()
        healthy = True
        while pings() == still_down:
            await asyncio.sleep(0.01)
        pinger.cancel()
        return down, still_down

    with caplog.at_level(logging.WARNING, logger="appliance.sdnotify"):
        down, still_down = asyncio.run(asyncio.wait_for(gateway_loop(), 5))
    assert still_down == down
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.WARNING]
