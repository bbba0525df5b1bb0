"""The upstream bridge's policy over its mechanism, checked by reading the imports (issue 27 item 3).

``paho_link.py`` is the mechanism: sockets, TLS, the kernel's ioctl probes, paho's internals.
``upstream.py`` is the policy's asyncio and reaches the network only through ``PahoConnection``; the
policy's state (``window``, ``flow_limit``, ``in_flight``, ``liveness``) is sans-I/O: no asyncio, no clock,
no socket, directly or through our own modules. An import under ``if TYPE_CHECKING:`` does not count (it
never runs): ``testing.import_scan``.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from testing.import_scan import reached, runtime_imports

FORWARDING = "appliance.forwarding"
#: What only the mechanism touches: the socket layer, TLS, the kernel's probes, paho's client.
MECHANISM = ("socket", "ssl", "fcntl", "termios", "struct", "selectors", "appliance.tcp_floor", "paho.mqtt.client")
#: What sans-I/O state may not reach besides: the loop, the clock, threads, the store.
LOOP_CLOCK_AND_STORE = ("asyncio", "time", "threading", "sqlite3")


def among(names: Iterable[str], modules: tuple[str, ...]) -> set[str]:
    """The names that are one of ``modules`` or inside one of them."""
    inside = tuple(f"{module}." for module in modules)
    return {name for name in names if name in modules or name.startswith(inside)}


def test_the_policy_reaches_the_network_only_through_the_mechanism() -> None:
    imports = runtime_imports(f"{FORWARDING}.upstream")
    assert among(imports, MECHANISM) == set()
    assert f"{FORWARDING}.paho_link" in imports


@pytest.mark.parametrize("module", ["window", "flow_limit", "in_flight", "liveness"])
def test_the_policys_state_is_sans_io(module: str) -> None:
    bad = {name: by for name, by in reached(f"{FORWARDING}.{module}").items()
           if among([name], MECHANISM + LOOP_CLOCK_AND_STORE)}
    assert not bad, f"{module} reaches {bad} (module -> imported by)"


def test_the_scan_sees_the_mechanisms_imports() -> None:
    imports = runtime_imports(f"{FORWARDING}.paho_link")
    assert among(imports, MECHANISM) >= {"socket", "ssl", "fcntl", "appliance.tcp_floor", "paho.mqtt.client"}
