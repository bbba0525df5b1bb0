"""The cellular modem on a serial port: a thin asyncio driver around the sans-I/O ``AtConnection``, and a
monitor that polls the modem, tells listeners when the link goes down or up, and recovers a stuck modem.

The serial port is read with ``loop.add_reader`` on pyserial's file descriptor, so bytes reach the parser
as soon as they arrive and URCs are seen between polls, without a reader thread. Timeouts live here, not
in the parser: a command that gets no final result within ``command_timeout`` is abandoned and raises
``ModemTimeout``.

Recovery: a modem that answers nothing (two commands in a row) is power-cycled through the relay, or, with
no relay fitted, has its port closed and reopened. The monitor then waits for ``RDY`` and a network
registration within ``ready_timeout``; if that fails it waits a growing ``Backoff`` delay and tries again.
USB modems drop off the bus while unpowered, so the port is closed across a cycle and reopened after.

A port that does not open when the monitor starts (no modem fitted, a USB modem not enumerated yet, the
port held by another program) is missing hardware, not a stuck modem: it is logged once, tried again every
``poll_interval`` without power cycles, and meanwhile the link counts as up, so forwarding is not held back
by a modem that is not there (a wired uplink may carry it; the bridge's own backoff covers no uplink at
all). Once the port has opened the modem is fitted, and from then on a lost port is the recovery above.

Time comes from the ``Runtime`` port: deadlines are ``runtime.timeout`` blocks (``asyncio.timeout``'s
contract), not ``asyncio.wait_for``: on Python 3.11 ``wait_for`` returns the inner result and drops a
cancellation that arrives in the turn the inner await completes, and a monitor loop that loses its
cancellation never stops (the gateway's shutdown hung on it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

import serial

from appliance.asyncio_runtime import AsyncioRuntime
from appliance.backoff import Backoff
from appliance.hardware.at import AtConnection, Noise, Response, Urc
from appliance.hardware.config import ModemConfig
from appliance.hardware.modem_status import (
    ModemStatus,
    Registration,
    ReplyError,
    parse_cops,
    parse_csq,
    parse_registration,
)
from appliance.runtime import Runtime

log = logging.getLogger(__name__)

LinkListener = Callable[[bool], None]
StatusListener = Callable[[ModemStatus], None]

#: Asked on every poll. Registration is read for both 2G/3G (CREG) and LTE (CEREG): a modem registers on one.
POLL_COMMANDS = ("AT+CSQ", "AT+CREG?", "AT+CEREG?", "AT+COPS?")
#: Sent after opening the port: echo off (less to parse), registration URCs on (see link loss at once).
SETUP_COMMANDS = ("ATE0", "AT+CREG=1", "AT+CEREG=1")


class ModemTimeout(Exception):
    """The modem sent no final result code in time."""


class ModemClosed(Exception):
    """The serial port is not open (unplugged, or closed for a power cycle)."""


class PowerSwitch(Protocol):
    async def power_cycle(self, off_seconds: float) -> None: ...


class AtChannel:
    """One open serial port speaking AT: ``command()`` waits for the final result; URCs go to ``on_urc``."""

    def __init__(self, port: str, baudrate: int, on_urc: Callable[[str], None], runtime: Runtime | None = None) -> None:
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self._port = port
        self._baudrate = baudrate
        self._on_urc = on_urc
        self._serial: serial.Serial | None = None
        self._protocol = AtConnection()
        self._waiter: asyncio.Future[Response] | None = None
        self._lock = asyncio.Lock()

    @property
    def is_open(self) -> bool:
        return self._serial is not None

    def open(self) -> None:
        """Raises ``serial.SerialException`` (an ``OSError``) if the device is missing or busy."""
        port = serial.Serial(self._port, self._baudrate, timeout=0, exclusive=True)
        self._serial = port
        self._protocol = AtConnection()
        asyncio.get_running_loop().add_reader(port.fileno(), self._readable)

    def close(self) -> None:
        if self._serial is None:
            return
        try:
            asyncio.get_running_loop().remove_reader(self._serial.fileno())
        finally:
            self._serial.close()
            self._serial = None
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_exception(ModemClosed(f"{self._port} closed"))

    async def command(self, command: str, timeout: float) -> Response:
        async with self._lock:
            if self._serial is None:
                raise ModemClosed(f"{self._port} is not open")
            self._waiter = asyncio.get_running_loop().create_future()
            self._serial.write(self._protocol.send(command))
            try:
                async with self.runtime.timeout(timeout):
                    return await self._waiter
            except TimeoutError:
                raise ModemTimeout(f"{command}: no answer within {timeout:g} s") from None
            finally:
                # Timed out or cancelled: forget the command so its late reply is noise, not a response.
                self._waiter = None
                if self._protocol.pending is not None:
                    self._protocol.abandon()

    def _readable(self) -> None:
        assert self._serial is not None
        try:
            data = self._serial.read(max(1, self._serial.in_waiting))
        except serial.SerialException as exc:
            log.warning("modem port %s failed: %s", self._port, exc)
            self.close()
            return
        self._protocol.receive_data(data)
        while (event := self._protocol.next_event()) is not None:
            if isinstance(event, Response):
                if self._waiter is not None and not self._waiter.done():
                    self._waiter.set_result(event)
            elif isinstance(event, Urc):
                self._on_urc(event.line)
            elif isinstance(event, Noise):
                log.debug("modem noise: %r", event.data)


class ModemMonitor:
    """Polls the modem, keeps ``status``, signals link changes, and recovers a modem that stops answering."""

    def __init__(self, config: ModemConfig, power_switch: PowerSwitch | None = None,
                 runtime: Runtime | None = None) -> None:
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self._config = config
        self._power_switch = power_switch
        self._channel = AtChannel(config.port, config.baudrate, self._urc, self.runtime)
        self._backoff = Backoff(config.backoff_initial, config.backoff_max)
        self._news = asyncio.Event()  # set by RDY and registration URCs: something worth a poll now
        self._link_listeners: list[LinkListener] = []
        self._status_listeners: list[StatusListener] = []
        self.status = ModemStatus()
        self.link_up = False
        #: None before the first attempt to open the port, False while it has never opened, True once it has.
        self.present: bool | None = None
        self._set_up = False  # SETUP_COMMANDS sent since the port was last opened

    def on_link_change(self, listener: LinkListener) -> Callable[[], None]:
        """Call ``listener(up)`` on every link change (starts down); returns a function that unsubscribes."""
        self._link_listeners.append(listener)
        return lambda: self._link_listeners.remove(listener)

    def on_status(self, listener: StatusListener) -> None:
        """Call ``listener(status)`` after every poll and every registration URC."""
        self._status_listeners.append(listener)

    async def run(self) -> None:
        """Run until cancelled."""
        try:
            await self._until_port_opens()
            while True:
                try:
                    await self._ensure_open()
                    await self.poll()
                    self._backoff.reset()
                    await self._wait_for_news(self._config.poll_interval)
                except (ModemTimeout, ModemClosed, OSError) as exc:
                    if await self._still_answers():
                        continue
                    log.warning("modem is not answering (%s); recovering", exc)
                    self._mark_unresponsive()
                    await self._recover()
        finally:
            self._channel.close()

    async def read_once(self) -> ModemStatus:
        """Open, set up, poll once and close, without recovery: what ``appliance doctor --probe-modem`` does."""
        try:
            await self._ensure_open()
            await self.poll()
        finally:
            self._channel.close()
        return self.status

    async def poll(self) -> None:
        """Read signal, registration and operator; raises ``ModemTimeout`` if the modem does not answer."""
        timeout = self._config.command_timeout
        for command in POLL_COMMANDS:
            response = await self._channel.command(command, timeout)
            if not response.ok:
                continue  # e.g. AT+CEREG? on a 2G-only modem: ERROR, not a fault
            for line in response.lines:
                self._apply(command, line)
        self.status.responding = True
        self._changed()

    async def _until_port_opens(self) -> None:
        """Open the port, or wait for it: one warning, then a quiet attempt every ``poll_interval``."""
        while True:
            try:
                self._channel.open()
            except OSError as exc:
                if self.present is None:
                    self.present = False
                    log.warning(
                        "modem port %s does not open (%s): running without the modem, trying again every %g s",
                        self._config.port, exc, self._config.poll_interval,
                    )
                    self._changed()
                await self.runtime.sleep(self._config.poll_interval)
                continue
            if self.present is False:
                log.info("modem port %s opened: the link counts as down until the modem registers", self._config.port)
            self.present = True
            self._set_up = False
            self._changed()
            return

    async def _ensure_open(self) -> None:
        if not self._channel.is_open:
            self._channel.open()
            self._set_up = False
        if not self._set_up:
            for command in SETUP_COMMANDS:
                await self._channel.command(command, self._config.command_timeout)
            self._set_up = True

    async def _still_answers(self) -> bool:
        """One plain ``AT`` before declaring the modem stuck: a single lost reply is not a dead modem."""
        if not self._channel.is_open:
            return False
        try:
            return (await self._channel.command("AT", self._config.command_timeout)).ok
        except (ModemTimeout, ModemClosed, OSError):
            return False

    async def _recover(self) -> None:
        while True:
            self._channel.close()
            if self._power_switch is not None:
                await self._power_switch.power_cycle(self._config.power_off_seconds)
                self.status.power_cycles += 1
                self._changed()
            if await self._wait_until_ready():
                log.info("modem recovered")
                self._backoff.reset()
                return
            delay = self._backoff.next_delay()
            log.warning("modem did not come back within %g s; next attempt in %g s", self._config.ready_timeout, delay)
            await self.runtime.sleep(delay)

    async def _wait_until_ready(self) -> bool:
        """After a cycle: reopen, poll until registered, waking early on RDY; give up after ``ready_timeout``."""
        try:
            async with self.runtime.timeout(self._config.ready_timeout):
                await self._until_registered()
        except TimeoutError:
            return False
        return True

    async def _until_registered(self) -> None:
        while True:
            try:
                await self._ensure_open()
                await self.poll()
            except (ModemTimeout, ModemClosed, OSError):
                self._channel.close()
            else:
                if self.status.registered:
                    return
            await self._wait_for_news(self._config.command_timeout)

    async def _wait_for_news(self, timeout: float) -> None:
        self._news.clear()
        try:
            async with self.runtime.timeout(timeout):
                await self._news.wait()
        except TimeoutError:
            pass

    def _urc(self, line: str) -> None:
        if line == "RDY":
            self._news.set()
            return
        if line.startswith(("+CREG:", "+CEREG:")):
            self._apply("AT" + line.split(":", 1)[0] + "?", line)
            self._changed()
            self._news.set()
            return
        log.debug("modem URC ignored: %s", line)

    def _apply(self, command: str, line: str) -> None:
        try:
            if command == "AT+CSQ":
                self.status.signal = parse_csq(line)
            elif command == "AT+COPS?":
                self.status.operator = parse_cops(line)
            else:
                name, state = parse_registration(line)
                self.status.registration[name] = state
        except ReplyError as exc:
            log.warning("modem reply not understood: %s", exc)

    def _mark_unresponsive(self) -> None:
        self.status.responding = False
        self.status.registration = {name: Registration.UNKNOWN for name in self.status.registration}
        self._changed()

    def _changed(self) -> None:
        for status_listener in list(self._status_listeners):
            status_listener(self.status)
        up = self.present is False or (self.status.responding and self.status.registered)
        if up != self.link_up:
            self.link_up = up
            if self.present:  # without a modem the "link" only stops holding forwarding back: logged above
                log.info("uplink %s", "up" if up else "down")
            for link_listener in list(self._link_listeners):
                link_listener(up)
