"""A tiny sd_notify client: tell systemd we are ready, and keep its watchdog fed from the event loop.

The protocol is one datagram per message on the AF_UNIX socket named by ``NOTIFY_SOCKET`` (a path, or an
abstract-namespace name written with a leading ``@``), so a plain socket does it and no library is needed.
Outside systemd ``NOTIFY_SOCKET`` is unset and every call is a no-op, which is what ``appliance run`` in a
terminal or a test wants.

The watchdog pings are sent by a task *on the gateway's event loop*, at half of ``WATCHDOG_USEC`` as
sd_watchdog_enabled(3) recommends: if the loop stalls (a blocking call, a livelock), the pings stop and
systemd restarts the service, which is the point of ``WatchdogSec=``. A thread would keep pinging through
a stuck loop and hide exactly the failure the watchdog is there to catch. For the same reason the pings
stop while a service reports itself unhealthy (a forwarding pump that failed and is not running again).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping

from appliance.asyncio_runtime import AsyncioRuntime
from appliance.runtime import Runtime

log = logging.getLogger(__name__)


class Notifier:
    """Sends ``KEY=VALUE`` messages to systemd; silently does nothing when not started by systemd."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if address.startswith("@"):
            self._address = b"\0" + address[1:].encode()
        elif address.startswith("/"):
            self._address = address
        self._watchdog_interval = watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between pings (half of WATCHDOG_USEC), or None if systemd wants no pings."""
        return self._watchdog_interval

    def notify(self, message: str) -> bool:
        """Send one message (e.g. ``READY=1\\nSTATUS=serving``); returns whether it was sent."""
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode(), self._address)
        except OSError as exc:
            # systemd going away (or a stale NOTIFY_SOCKET) must not take the gateway down with it.
            log.warning("sd_notify %r failed: %s", message.split("\n", 1)[0], exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    async def ping_watchdog_forever(self, healthy: Callable[[], bool] = lambda: True,
                                    runtime: Runtime | None = None) -> None:
        """Run as a task on the gateway's loop; returns at once if no watchdog is configured. No ping while
        ``healthy()`` says no (a forwarding pump is down): if that lasts, systemd restarts the gateway.
        The change is logged each way. ``runtime`` times the pings."""
        clock: Runtime = runtime if runtime is not None else AsyncioRuntime()
        interval = self._watchdog_interval
        if interval is None or not self.enabled:
            return
        fed = True
        while True:
            if healthy():
                if not fed:
                    log.warning("systemd watchdog: the gateway is healthy again; feeding the watchdog again")
                fed = True
                self.watchdog()
            elif fed:
                fed = False
                log.error("systemd watchdog: a service is not healthy; the watchdog is no longer fed, systemd "
                          "restarts the gateway if this lasts")
            await clock.sleep(interval)


def watchdog_interval(environ: Mapping[str, str]) -> float | None:
    """Half of WATCHDOG_USEC, if it is set for this process (WATCHDOG_PID, when present, must be ours)."""
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 2 / 1_000_000
