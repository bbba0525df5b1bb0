"""The broker's protocol logic stays free of I/O and of the clock: checked by reading the imports.

The handler, lifecycle and backpressure modules get time and scheduling only through
``appliance.runtime.Runtime``; the codec, session, router and topic tree import no I/O at all. An
import under ``if TYPE_CHECKING:`` does not count (it never runs). The check follows imports of our own
modules too, so an I/O module cannot sneak in through a helper.
"""

from __future__ import annotations

import pytest

from testing.import_scan import reached, runtime_imports

#: Modules that must not reach asyncio or the time module, directly or through our own imports.
CLOCK_FREE = (
    "appliance.broker.handlers.dispatch",
    "appliance.broker.handlers.connect",
    "appliance.broker.handlers.publish",
    "appliance.broker.handlers.subscribe",
    "appliance.broker.routing.retained_feed",
    "appliance.broker.sessions.lifecycle",
    "appliance.broker.sessions.backpressure",
    "appliance.broker.sessions.backlog",
    "appliance.broker.persistence.storage",
    "appliance.broker.persistence.store_failure",
    "appliance.runtime",
    "appliance.broker.transport.link",
    "appliance.broker.sessions.keepalive",
)
#: Sans-I/O cores: no asyncio, time, sockets, TLS, threads or SQLite, directly or through our imports.
IO_FREE = (
    "appliance.broker.sessions.session",
    "appliance.broker.transport.connection",
    "appliance.broker.routing.delivery",
    "appliance.broker.routing.router",
    "appliance.broker.routing.topic_tree",
    "appliance.broker.routing.edge_tree",
    "appliance.broker.sessions.will",
    "appliance.broker.routing.retain",
    "appliance.broker.routing.message",
    "appliance.broker.codec.packets",
    "appliance.broker.codec.reader",
    "appliance.broker.codec.writer",
    "appliance.broker.codec.properties",
    "appliance.broker.codec.reasons",
    "appliance.broker.sessions.backpressure",
    "appliance.broker.security.login_gate",
)
CLOCK = {"asyncio", "time", "uvloop"}
IO = CLOCK | {"socket", "ssl", "selectors", "threading", "sqlite3", "concurrent"}


@pytest.mark.parametrize("module", CLOCK_FREE)
def test_handler_lifecycle_and_backpressure_modules_reach_neither_asyncio_nor_time(module: str) -> None:
    bad = {name: by for name, by in reached(module).items() if name.split(".")[0] in CLOCK}
    assert not bad, f"{module} reaches {bad} (module -> imported by)"


@pytest.mark.parametrize("module", IO_FREE)
def test_protocol_cores_reach_no_io(module: str) -> None:
    bad = {name: by for name, by in reached(module).items() if name.split(".")[0] in IO}
    assert not bad, f"{module} reaches {bad} (module -> imported by)"


def test_the_scan_sees_an_import_that_breaks_the_rule() -> None:
    assert "asyncio" in runtime_imports("appliance.asyncio_runtime")
    assert "sqlite3" in reached("appliance.broker.persistence.storage")


#: Imports point one way: a module on the left reaches none of the modules (or packages) on the right.
ONE_WAY = [
    (f"appliance.statestore.client.{name}", ("appliance.statestore.service", "appliance.broker"))
    for name in ("blocking", "aio", "calls", "errors", "results", "lease")
]
# The configuration leaf: every subsystem's config builds on it, so it may reach none of them.
SUBSYSTEMS = ("appliance.broker", "appliance.statestore", "appliance.forwarding", "appliance.hardware", "appliance.gateway")
ONE_WAY += [(f"appliance.config.{name}", SUBSYSTEMS) for name in ("errors", "schema", "reference")]


@pytest.mark.parametrize(("module", "forbidden"), ONE_WAY, ids=[module for module, _ in ONE_WAY])
def test_imports_point_one_way(module: str, forbidden: tuple[str, ...]) -> None:
    bad = {name: by for name, by in reached(module).items() if name.startswith(forbidden)}
    assert not bad, f"{module} reaches {bad} (module -> imported by)"
