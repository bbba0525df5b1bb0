"""``appliance run``: open the stores, start the services and the broker, serve until SIGTERM.

The order matters and is the contract with the services: the broker's store is loaded and every service
has started (``BrokerService.start``) before any listener accepts a client, and listeners close before
services stop. One log line containing ``appliance ready`` and every listener URL with its real port
(``tcp://127.0.0.1:34567``) tells tests, benchmarks and operators that clients may connect.

Services are listed in ONE place, ``build_services``: a subsystem adds itself there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import shutil
import signal
import sys
from collections.abc import Callable, Mapping

import uvloop

from appliance import run_state
from appliance.asyncio_runtime import AsyncioRuntime
from appliance.broker.api import BrokerService, ServiceStartError
from appliance.broker.broker import Broker
from appliance.broker.config import BrokerConfig, queued_bytes_default
from appliance.broker.persistence.store import DB_FILENAME, BrokerStore
from appliance.broker.security.acl import Acl
from appliance.broker.security.auth import Authenticator
from appliance.broker.transport.server import start_listener
from appliance.gateway_config import GatewayConfig
from appliance.hardware.factory_reset import (
    FACTORY_RESET_EXIT_STATUS,
    reset_after_shutdown,
)
from appliance.metrics_server import MetricsServer
from appliance.prometheus import Family
from appliance.runtime import Runtime
from appliance.sdnotify import Notifier
from appliance.startup_error import StartupError
from appliance.system_slot import read_booted_slot, slot_collector

log = logging.getLogger("appliance")


def build_services(
    config: GatewayConfig,
    on_factory_reset: Callable[[], None] = lambda: None,
    status_report: Callable[[], Mapping[str, object]] = dict,
    runtime: Runtime | None = None,
) -> list[BrokerService]:
    """Every in-process service the broker hosts, in start order. Subsystems add themselves here.

    ``on_factory_reset`` is the hardware button's long press; ``serve`` stops, resets and exits for a restart.
    ``status_report`` is what the button's short press logs about the broker.
    The hardware starts before forwarding, which takes its modem link state (no upstream connection attempts
    while the modem is not registered) and drives its uplink and backlog LEDs (``docs/hardware.md``).
    Every service reads time through ``runtime``, the broker's."""
    runtime = runtime if runtime is not None else AsyncioRuntime()
    services: list[BrokerService] = []
    if config.statestore.enabled:
        from appliance.statestore.service import StateStoreService

        services.append(StateStoreService(config.statestore, config.data_dir, runtime))
        from appliance.firmware.service import FirmwareService

        # Over-the-air updates of the thermostats (docs/firmware.md): they watch the desired version in the
        # state store, so the firmware service comes with it.
        services.append(FirmwareService(config.data_dir, runtime=runtime))
    hardware = None
    bridge = config.forwarding.enabled and config.forwarding.upstream.host is not None
    if config.hardware.enabled:
        from appliance.hardware.service import HardwareService

        # With a bridge the uplink LED means "connected to the cloud"; the bridge drives it.
        hardware = HardwareService(
            config.hardware, on_factory_reset, status_report, uplink_led_follows_modem=not bridge, runtime=runtime
        )
        services.append(hardware)
    if config.forwarding.enabled:
        from appliance.forwarding.service import ForwardingService

        services.append(ForwardingService(config.forwarding, config.data_dir, config.gateway_id, hardware, runtime))
    return services


def load_security(config: GatewayConfig) -> tuple[Authenticator, Acl | None]:
    """Build the authenticator and ACL from their files (raises on a bad file)."""
    auth = config.broker.auth
    authenticator = Authenticator.load(auth.password_file, auth.allow_anonymous)
    acl = Acl.load(auth.acl_file, auth.acl_client_patterns) if auth.acl_file is not None else None
    return authenticator, acl


def resolve_queued_bytes(config: GatewayConfig) -> BrokerConfig:
    """The broker's configuration with ``max_queued_bytes`` set: when not configured, a share of the data
    directory's free space now (``config.queued_bytes_default``), logged so the operator sees it."""
    limits = config.broker.limits
    if limits.max_queued_bytes is not None:
        return config.broker
    free = shutil.disk_usage(config.data_dir).free
    bound = queued_bytes_default(free)
    log.info("max_queued_bytes not set: %d bytes per durable session (%d bytes free in %s)", bound, free,
             config.data_dir)
    return dataclasses.replace(config.broker, limits=dataclasses.replace(limits, max_queued_bytes=bound))


def run_gateway(config: GatewayConfig) -> int:
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
    )
    try:
        return uvloop.run(serve(config))
    except (StartupError, ServiceStartError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return 1


async def serve(config: GatewayConfig) -> int:
    loop = asyncio.get_running_loop()
    authenticator, acl = load_security(config)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    store = BrokerStore.open(config.data_dir / DB_FILENAME, synchronous=config.broker.persistence.synchronous)
    stop = asyncio.Event()
    exit_status = 0

    def restart_after_factory_reset() -> None:
        """Stop; the reset runs once every store is closed, then exit with the status systemd restarts on."""
        nonlocal exit_status
        exit_status = FACTORY_RESET_EXIT_STATUS
        stop.set()

    def broker_status() -> dict[str, object]:
        return {"clients": broker.stats.clients_connected}

    async def broker_metrics() -> list[Family]:
        return broker.metrics()

    runtime = AsyncioRuntime()  # one clock and scheduler for the broker and every service
    broker = Broker(
        resolve_queued_bytes(config), store, authenticator, acl,
        build_services(config, restart_after_factory_reset, broker_status, runtime), runtime=runtime,
    )
    # One Prometheus page for the whole gateway: the broker's figures, the A/B slot it runs from, every service's.
    metrics = MetricsServer([broker_metrics, slot_collector(read_booted_slot()), *(service.metrics for service in broker.services)])
    notifier = Notifier()  # systemd: READY=1 and watchdog pings; a no-op outside systemd
    watchdog: asyncio.Task[None] | None = None
    servers: list[asyncio.Server] = []
    try:
        await broker.start()
        # What is loaded by now (modules, restored sessions) lives as long as the process: move it out of
        # the cyclic collector's way so full collections stay short on the message path (p99 latency).
        gc.freeze()
        urls = []
        for listener in config.broker.listeners:
            server, url = await start_listener(broker, listener)
            servers.append(server)
            urls.append(url)

        def reload_security() -> None:
            for service in broker.services:
                service.reload()
            try:
                new_authenticator, new_acl = load_security(config)
            except (StartupError, OSError) as exc:
                log.error("SIGHUP: keeping the old password file and ACL: %s", exc)
                return
            broker.reload_security(new_authenticator, new_acl)
            log.info("SIGHUP: password file and ACL reloaded")

        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGHUP, reload_security)
        metrics_url = None
        if config.metrics_port is not None:
            await metrics.start(config.metrics_host, config.metrics_port)
            metrics_url = f"http://{config.metrics_host}:{metrics.port}/metrics"
        run_state.write(config.data_dir, metrics_url, urls)
        log.info("appliance ready: gateway %s listening on %s, data in %s%s", config.gateway_id, " ".join(urls),
                 config.data_dir, f"; metrics on {metrics_url}" if metrics_url else "")
        notifier.ready(f"listening on {' '.join(urls)}")
        # Pings come from this loop, so a stuck loop stops them and systemd restarts the gateway.
        # They stop too while a service is not healthy (a forwarding pump down): systemd restarts the gateway.
        watchdog = asyncio.create_task(
            notifier.ping_watchdog_forever(lambda: all(service.healthy() for service in broker.services), runtime),
            name="systemd-watchdog")
        for service in broker.services:
            service.show_ready()
        await stop.wait()
        log.info("shutting down")
    finally:
        notifier.stopping()
        if watchdog is not None:
            watchdog.cancel()
        run_state.remove(config.data_dir)
        await metrics.stop()
        for server in servers:
            server.close()
        await broker.stop()
        for server in servers:
            await server.wait_closed()
        store.close()
    if exit_status == FACTORY_RESET_EXIT_STATUS:
        reset_after_shutdown(config.data_dir)
    log.info("stopped")
    return exit_status
