"""The hardware as one broker service: the gateway starts and stops it like the state store, and it
publishes the modem's readings as retained ``$SYS/gateway/modem/<name>`` messages through the broker.

It claims no topics; it only publishes. gpiozero calls the button callbacks on its own threads, so they hop
onto the event loop with ``call_soon_threadsafe`` before touching anything. Both parts are optional: with
``[hardware.gpio]`` and ``[hardware.modem]`` disabled (the default) ``start`` opens nothing, the LED methods
do nothing, and ``link_up`` stays True so forwarding is never held back by a modem that does not exist.

Missing hardware is not a reason to stop: the broker, the state store and forwarding are the gateway's
job, the LEDs and the modem watch are extras. Pins that cannot be claimed (no pin library on this machine,
a pin held by another program) are logged once and the gateway runs without the panel; GPIO does not
appear at run time, so there is no retry. A modem port that does not open is the monitor's to retry
(``ModemMonitor``). Both show on the metrics page as ``appliance_hardware_available{part=...}`` and in
``appliance doctor``.

Link listeners may subscribe before ``start`` (the gateway wires forwarding while building services); with
a modem configured the link counts as down until the modem reports registration. The uplink LED shows the
modem's registration unless ``uplink_led_follows_modem`` is False: then another uplink - the forwarding
bridge, which only connects while the modem is registered - drives it through ``show_uplink``, so the LED
means "connected to the cloud", not just "registered".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from appliance.asyncio_runtime import AsyncioRuntime
from appliance.broker.api import (
    ACCEPTED,
    BrokerHandle,
    InboundPublish,
    PublishVerdict,
    ServiceDefaults,
)
from appliance.hardware.config import HardwareConfig
from appliance.hardware.gpio import GpioUnavailable, StatusPanel, unavailable_as_one_error
from appliance.hardware.modem import LinkListener, ModemMonitor
from appliance.hardware.modem_status import ModemStatus
from appliance.prometheus import Family, counter, gauge
from appliance.runtime import Runtime

log = logging.getLogger(__name__)

MODEM_TOPIC = "$SYS/gateway/modem/"


class HardwareService(ServiceDefaults):
    topic_filters: tuple[str, ...] = ()

    def __init__(
        self,
        config: HardwareConfig,
        on_factory_reset: Callable[[], None],
        status_report: Callable[[], Mapping[str, object]] = dict,
        uplink_led_follows_modem: bool = True,
        runtime: Runtime | None = None,
    ) -> None:
        """``on_factory_reset`` is the long press: the gateway stops, resets (``factory_reset.py``) and
        exits to be restarted. ``status_report`` gives what a short press logs from the broker (clients...);
        the forwarding backlog is the last value shown on the backlog LED."""
        self.runtime: Runtime = runtime if runtime is not None else AsyncioRuntime()
        self._config = config
        self._status_report = status_report
        self._on_factory_reset = on_factory_reset
        self._broker: BrokerHandle | None = None
        self._published: dict[str, str] = {}
        self._reset_requested = False
        self._modem_task: asyncio.Task[None] | None = None
        self._uplink_led_follows_modem = uplink_led_follows_modem
        self._link_listeners: list[LinkListener] = []
        self.panel: StatusPanel | None = None
        self.modem: ModemMonitor | None = None
        self._backlog: int | None = None

    @property
    def link_up(self) -> bool:
        if self.modem is not None:
            return self.modem.link_up
        return not self._config.modem.enabled  # configured but not started yet: not registered yet

    def on_link_change(self, listener: LinkListener) -> Callable[[], None]:
        """For the forwarding pump: ``listener(up)`` on every modem link change. No modem: never called."""
        self._link_listeners.append(listener)
        return lambda: self._link_listeners.remove(listener)

    def _link_changed(self, up: bool) -> None:
        if self._uplink_led_follows_modem:
            self.show_uplink(up)
        for listener in list(self._link_listeners):
            listener(up)

    async def start(self, broker: BrokerHandle) -> None:
        self._broker = broker
        loop = asyncio.get_running_loop()
        if self._config.gpio.enabled:
            self.panel = self._open_panel(loop)
        if self._config.modem.enabled:
            self.modem = ModemMonitor(self._config.modem, self.panel.relay if self.panel else None, self.runtime)
            self.modem.on_status(self._publish_modem)
            self.modem.on_link_change(self._link_changed)
            self._modem_task = asyncio.create_task(self.modem.run(), name="modem-monitor")

    def _open_panel(self, loop: asyncio.AbstractEventLoop) -> StatusPanel | None:
        """The panel, or None (logged once) when its pins cannot be claimed."""
        try:
            with unavailable_as_one_error():
                return StatusPanel(
                    self._config.gpio,
                    on_short_press=lambda: loop.call_soon_threadsafe(self.log_status),
                    on_long_press=lambda: loop.call_soon_threadsafe(self.request_factory_reset),
                    runtime=self.runtime,
                )
        except GpioUnavailable as exc:
            log.warning("GPIO not available, running without status LEDs, button and modem relay: %s", exc)
            return None

    def available(self) -> dict[str, bool]:
        """Each configured part: is it there? ``gpio``: its pins were claimed; ``modem``: its port opened."""
        parts: dict[str, bool] = {}
        if self._config.gpio.enabled:
            parts["gpio"] = self.panel is not None
        if self._config.modem.enabled:
            parts["modem"] = self.modem is not None and self.modem.present is True
        return parts

    def show_ready(self) -> None:
        if self.panel is not None:
            self.panel.show_ready()

    def show_uplink(self, up: bool) -> None:
        if self.panel is not None:
            self.panel.show_uplink(up)

    def show_backlog(self, queued: int) -> None:
        self._backlog = queued
        if self.panel is not None:
            self.panel.show_backlog(queued)

    async def metrics(self) -> list[Family]:
        """Which configured parts are there (``appliance_hardware_available``), and the modem's readings
        (``appliance_modem_*``): flags and numbers as gauges, its power cycles as a counter, the text readings
        as labels of ``appliance_modem_info``. No modem: no readings."""
        families = [
            Family(
                "appliance_hardware_available", "gauge", "1 if the configured hardware part is there, 0 if the gateway runs without it",
                [({"part": part}, int(there)) for part, there in self.available().items()],
            )
        ]
        if self.modem is None:
            return families
        labels: dict[str, str] = {}
        for name, value in self.modem.status.as_metrics().items():
            if isinstance(value, str):
                labels[name] = value
            elif value is None:  # unknown: no sample rather than a made-up number
                continue
            elif name == "power_cycles":
                families.append(counter("appliance_modem_power_cycles_total", "times the modem was power-cycled to "
                                        "recover it", int(value)))
            else:
                families.append(gauge(f"appliance_modem_{name}", f"the modem's {name.replace('_', ' ')}", int(value)))
        families.append(Family("appliance_modem_info", "gauge", "the modem's text readings, as labels", [(labels, 1)]))
        return families

    def log_status(self) -> None:
        report: dict[str, object] = dict(self._status_report())
        if self._backlog is not None:
            report["backlog"] = self._backlog
        if self.modem is not None:
            report.update({f"modem_{name}": value for name, value in self.modem.status.as_metrics().items()})
        log.info("status: %s", ", ".join(f"{name}={value}" for name, value in report.items()) or "no status sources")

    def request_factory_reset(self) -> None:
        if self._reset_requested:
            return
        self._reset_requested = True
        log.warning("factory reset requested by a long button press: stopping to back up and clear the databases")
        self._on_factory_reset()

    def _publish_modem(self, status: ModemStatus) -> None:
        if self._broker is None:
            return
        for name, value in status.as_metrics().items():
            text = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
            if self._published.get(name) != text:
                self._published[name] = text
                self._broker.publish(MODEM_TOPIC + name, text.encode(), qos=0, retain=True)

    async def on_publish(self, message: InboundPublish) -> PublishVerdict:
        return ACCEPTED  # claims no topics, so the broker never calls this

    def on_client_disconnected(self, client_id: str) -> None:
        """No per-client state."""

    async def stop(self) -> None:
        if self._modem_task is not None and not self._modem_task.done():
            self._modem_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._modem_task
        if self.panel is not None:
            self.panel.close()
