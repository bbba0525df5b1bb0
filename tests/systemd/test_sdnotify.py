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
from testing.waiting import until
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
    """The pinger wakes on the loop's timer: never early, and late only as much as any timer of the loop.

    The bounds come from the run itself, so they hold on a busy machine: a probe task sleeps the same
    interval on the same loop, and its lateness is what the pings' lateness is compared with. The pings
    are timed where they are sent (the loop's clock), not where the receiving thread stamps them.
    """
    path, receiver = notify_path
    interval = 0.2
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": str(int(interval * 2e6))})
    sent: list[float] = []
    probe_lateness: list[float] = []
    blocked_s = 0.6

    async def gateway_loop() -> None:
        loop = asyncio.get_running_loop()
        send = notifier.watchdog

        def timed_watchdog() -> bool:
            sent.append(loop.time())
            return send()

        notifier.watchdog = timed_watchdog  # type: ignore[method-assign]  # the real send, timed

        async def probe() -> None:
            while True:
                asked = loop.time()
                await asyncio.sleep(interval)
                probe_lateness.append(loop.time() - asked - interval)

        pinger = asyncio.create_task(notifier.ping_watchdog_forever())
        prober = asyncio.create_task(probe())
        await asyncio.sleep(3.5 * interval)
        time.sleep(blocked_s)  # a blocking call on the loop: exactly what the watchdog must notice
        await asyncio.sleep(2.5 * interval)
        pinger.cancel()
        prober.cancel()

    asyncio.run(gateway_loop())
    pings = receiver.wait_for(len(sent))
    assert [message for _, message in pings] == ["WATCHDOG=1"] * len(sent)
    gaps = sorted(later - earlier for earlier, later in itertools.pairwise(sent))
    assert gaps[-1] >= blocked_s  # no ping while the loop was blocked
    regular = gaps[:-1]
    typical_lateness = statistics.median(sorted(probe_lateness)[:-1])  # without the blocked wake-up
    resolution = time.get_clock_info("monotonic").resolution + 1e-3  # asyncio fires within its clock resolution
    assert len(regular) >= 4 and min(regular) >= interval - resolution, regular
    # Every half period, not every period: the typical gap is the interval plus the loop's typical lateness,
    # and half an interval of margin still tells it from a whole one.
    assert statistics.median(regular) <= interval + typical_lateness + interval / 2, (regular, probe_lateness)


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
        await until(lambda: pings() >= 2)
        healthy = False  # the pinger runs on this loop: no ping is sent from here on
        receiver.barrier()  # every ping sent so far has arrived
        down = pings()
        await asyncio.sleep(0.3)  # six periods: no ping may come
        receiver.barrier()
        still_down = pings()
        healthy = True
        await until(lambda: pings() > still_down)
        pinger.cancel()
        return down, still_down

    with caplog.at_level(logging.WARNING, logger="appliance.sdnotify"):
        down, still_down = asyncio.run(asyncio.wait_for(gateway_loop(), 5))
    assert still_down == down
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.WARNING]
